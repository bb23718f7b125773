"""CPU benchmarks are code too: each one with a tiny mode runs it here, so that a rename cannot break one unnoticed."""

from __future__ import annotations

import importlib
import sys

import pytest

from tests.plugin_helpers import REPO


def test_bench_cpu_kquant_tiny():
    sys.path.insert(0, str(REPO / "benchmarks"))
    rows = importlib.import_module("bench_cpu_kquant").run(tiny=True)
    assert {r["qtype"] for r in rows} == {"Q4_K", "Q5_K", "Q6_K"}
    assert all(r["impl"] == "cpu.kquant" and r["us"] > 0 and r["gguf_GBps"] > 0 for r in rows), rows


@pytest.mark.usefixtures("default_model")
def test_bench_spec_decode_tiny(capsys):
    sys.path.insert(0, str(REPO / "benchmarks"))
    bench = importlib.import_module("bench_spec_decode")
    assert bench.main(["--batch-sizes", "1", "--ks", "0", "1", "--max-tokens", "4", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "num_speculative_tokens_per_batch_size" in out and "| 1 | repetitive |" in out and "| 1 | chat |" in out


def test_bench_cpu_moe_quant_tiny():
    sys.path.insert(0, str(REPO / "benchmarks"))
    rows = importlib.import_module("bench_cpu_moe_quant").run(tiny=True)
    assert [(r["qtype"], r["tokens"]) for r in rows] == [("Q4_0", 1), ("Q4_0", 5), ("Q8_0", 1), ("Q8_0", 5)]
    assert all(r["quant_bf16_ms"] > 0 and r["dense_over_quant_fp32"] > 0 for r in rows), rows
    assert all(r["quant_bytes_per_expert"] < r["bf16_bytes_per_expert"] for r in rows), rows


@pytest.mark.usefixtures("default_model")
def test_bench_cpu_tensor_parallel_tiny():
    sys.path.insert(0, str(REPO / "benchmarks"))
    bench = importlib.import_module("bench_cpu_tensor_parallel")
    res = bench.run(tiny=True)
    ops = {(r["op"], r["impl"]) for r in res["collectives"]}
    for op in ("all_reduce", "broadcast", "all_gather"):  # the cpu platform's kernel and gloo, timed side by side
        assert (op, "cpu.native_shm") in ops and (op, "core.reference") in ops, ops
    assert all(r["us"] > 0 for r in res["collectives"])
    assert set(res["rates"]) == {"tp1_eager", "tp1_graphs", "tp2"} and all(v[1] > 0 for v in res["rates"].values())
    assert "TP=2 / TP=1 eager" in bench.report(res)
