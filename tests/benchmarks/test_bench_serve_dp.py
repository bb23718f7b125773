"""benchmarks/bench_serve_dp.py runs end to end at a tiny size (a rename or a broken import fails here)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.plugin_helpers import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))


@pytest.mark.usefixtures("default_model")
def test_bench_serve_dp_tiny():
    import bench_serve_dp

    result = bench_serve_dp.main(["--sizes", "1", "2", "--clients", "1", "2", "--max-tokens", "3", "--requests", "2"])
    assert result["dp2"]["2"]["output_tokens"] == 6 and result["ratio_dp2_vs_dp1"]["1"] > 0
