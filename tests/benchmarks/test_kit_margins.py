"""benchmarks/kit_margins.py (how much of the kit's error bound each kernel uses) runs at its tiny size."""

from __future__ import annotations

import importlib.util

from tests.plugin_helpers import REPO


def test_kit_margins_runs_tiny():
    spec = importlib.util.spec_from_file_location("kit_margins", REPO / "benchmarks" / "kit_margins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    worst = module.margins("cpu", [1], ["rms_norm"], tiny=True)
    assert worst and all(0.0 <= used <= 1.0 for used, _case in worst.values()), worst
