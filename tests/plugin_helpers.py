"""Helpers for plugin tests: installing plugin distributions into throw-away folders put on PYTHONPATH.

Plugins are found through installed distributions' entry points, so these fixtures make real
distributions (the example package installed by pip, or a hand-written dist-info) in a temporary
folder and run engine in a subprocess that sees it; the test environment itself is not changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_plugin_dist(site: Path, dist: str, entry_name: str, module: str, source: str, attr: str) -> Path:
    """Write an installed distribution ``dist`` with one engine.platforms entry point to ``module:attr``."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[engine.platforms]\n{entry_name} = {module}:{attr}\n")
    return site


def default_platform() -> str:
    """The platform this machine selects with nothing forced and no plugin added: cpu on CI, cuda on a GPU machine."""
    from engine.core import plugins

    return plugins.select(plugins.discover()).name


def run_engine(args: list[str], site: Path | None = None, env: dict | None = None,
               module: str = "engine.core.cli"):
    """Run ``python -m <module> args`` with ``site`` on PYTHONPATH; returns the CompletedProcess."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("ENGINE_PLATFORM", "ACME_PRIORITY")}
    if site is not None:
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), full_env.get("PYTHONPATH")]))
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          env=full_env, cwd=REPO, timeout=600)


def doctor_json(site: Path | None = None, env: dict | None = None) -> dict:
    proc = run_engine(["doctor", "--json"], site, env)
    return json.loads(proc.stdout) | {"_returncode": proc.returncode, "_stderr": proc.stderr}
