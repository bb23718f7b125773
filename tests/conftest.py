"""Shared fixtures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugin_helpers import REPO


@pytest.fixture(scope="session")
def acme_site(tmp_path_factory) -> Path:
    """The example out-of-tree plugin (examples/acme-plugin), pip-installed into its own folder."""
    site = tmp_path_factory.mktemp("acme_site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(REPO / "examples" / "acme-plugin")], check=True)
    return site
