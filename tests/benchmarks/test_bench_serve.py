"""The serving benchmarks run end to end at a tiny size (a rename or a broken import fails here)."""

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


@pytest.mark.usefixtures("default_model")
def test_bench_serve_vs_offline_tiny():
    import bench_serve_vs_offline

    result = bench_serve_vs_offline.main(["--clients", "1", "2", "--prompt-tokens", "8", "--output-tokens", "3",
                                          "--requests", "2", "--guidellm", "", "--client-procs", "2", "--configs",
                                          "--loop asyncio"])
    level = result["--loop asyncio"]["2"]
    assert level["requests"] == 2 and level["offline_tok_per_s"] > 0 and level["served_vs_offline"] > 0


def test_bench_serve_vs_offline_on_a_random_llama():
    """--random-llama (what the GPU runs use, 8B there) at its tiny shape: the model is written, its vocabulary read
    from config.json, both engines take the --dtype."""
    import bench_serve_vs_offline

    result = bench_serve_vs_offline.main(["--random-llama", "tiny", "--clients", "2", "--prompt-tokens", "8",
                                          "--output-tokens", "3", "--requests", "2", "--guidellm", "", "--dtype",
                                          "float32"])
    level = result["(defaults)"]["2"]
    assert result["model"] == "tiny" and level["requests"] == 2 and level["served_vs_offline"] > 0
