"""CPU benchmarks are code too: each one with a tiny mode runs it here, so that a rename cannot break one unnoticed."""

from __future__ import annotations

import importlib
import sys

from tests.plugin_helpers import REPO


def test_bench_cpu_kquant_tiny():
    sys.path.insert(0, str(REPO / "benchmarks"))
    rows = importlib.import_module("bench_cpu_kquant").run(tiny=True)
    assert {r["qtype"] for r in rows} == {"Q4_K", "Q5_K", "Q6_K"}
    assert all(r["impl"] == "cpu.kquant" and r["us"] > 0 and r["gguf_GBps"] > 0 for r in rows), rows
