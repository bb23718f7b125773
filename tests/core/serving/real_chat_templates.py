"""Real models' chat templates for the tests, as llama.cpp keeps them (``models/templates/``, fetched from each model's
Hugging Face repository by its ``scripts/get_chat_template.py``). They come from the llama-cpp-python source
distribution on PyPI, which vendors llama.cpp, downloaded once into a cache directory (about 77 MB, a few seconds).

A few files there are llama.cpp's edits rather than the model's own (its QwQ-32B and DeepSeek-R1-Distill-Qwen-32B
templates gained an ``enable_thinking`` switch); the tests use the unedited ones for what a model really sees.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tests import needs

LLAMA_CPP_PYTHON = "0.3.36"  # pinned: the templates a test was written against
_MEMBER = "vendor/llama.cpp/models/templates/"


def cache_dir() -> Path:
    root = os.environ.get("ENGINE_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "engine-tests")
    return Path(root) / f"chat-templates-llama-cpp-python-{LLAMA_CPP_PYTHON}"


def templates_dir() -> Path:
    """The directory of ``*.jinja`` templates, downloading them first if this machine has none cached; a machine
    that cannot download skips (fails under CI) with the command that fetches them."""
    target = cache_dir()
    if target.is_dir() and any(target.glob("*.jinja")):
        return target
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if proc.returncode != 0 or not sdists:
            needs.unavailable(f"the real chat templates could not be downloaded ({' '.join(cmd)}: "
                              f"{proc.stderr.strip()[-300:]})")
        staging = Path(tmp) / "templates"
        staging.mkdir()
        with tarfile.open(sdists[0]) as tar:
            for member in tar.getmembers():
                name = member.name.split("/", 1)[-1]
                if member.isfile() and name.startswith(_MEMBER) and name.endswith(".jinja"):
                    (staging / Path(name).name).write_bytes(tar.extractfile(member).read())
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_dir():  # another process may have finished first
            shutil.move(str(staging), target)
    return target


def template(name: str) -> str:
    path = templates_dir() / f"{name}.jinja"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not in llama-cpp-python {LLAMA_CPP_PYTHON}'s templates")
    return path.read_text(encoding="utf-8")
