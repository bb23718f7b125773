"""Shared fixtures."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton kernels run under the interpreter, which must be on before Triton is first imported and any
# kernel is defined: a kernel module imported while it is off keeps compiled-mode helpers that the interpreter cannot
# call. Set here, before any test module is collected (the cuda plugin's tests import Triton at collection).
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

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


@pytest.fixture(scope="session")
def acme_site(tmp_path_factory) -> Path:
    """The example out-of-tree plugin (examples/acme-plugin), pip-installed into its own folder."""
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
