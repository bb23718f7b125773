"""``engine bench`` as a user runs it: a tiny synthetic run whose JSON report is complete and self-consistent."""

from __future__ import annotations

import json
import random

import pytest

from engine.core.cli_bench import format_text
from engine.core.ops.registry import OPS
from tests.plugin_helpers import run_engine


@pytest.mark.usefixtures("default_model")
def test_tiny_run_reports_consistent_numbers(gen):
    rng = random.Random(gen.initial_seed())
    n, inp, out = rng.randint(2, 4), rng.randint(5, 12), rng.randint(2, 5)
    proc = run_engine(["bench", "--num-prompts", str(n), "--input-len", str(inp), "--output-len", str(out),
                       "--seed", str(rng.randrange(1 << 30)), "--max-num-batched-tokens", "16", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert "\r[" not in proc.stderr, "no progress bar off a terminal"
    r = json.loads(proc.stdout)
    assert (r["num_prompts"], r["input_len"], r["output_len"]) == (n, inp, out)
    assert r["platform"] and r["device"] and r["model"].endswith(".gguf")
    assert r["max_num_batched_tokens"] == 16
    # Exact token accounting: random prompts share no prefix, and nothing is preempted in so small a run.
    assert r["num_preemptions"] == 0 and r["num_finished_requests"] == n
    assert (r["prompt_tokens"], r["output_tokens"]) == (n * inp, n * out)
    assert (r["prefill_tokens"], r["decode_tokens"]) == (n * inp, n * (out - 1))
    assert r["num_steps"] >= -(-n * inp // 16) + out - 1  # the budget splits the prefills
    for key in ("prefill_tok_per_s", "decode_tok_per_s", "end_to_end_tok_per_s", "output_tok_per_s"):
        assert r[key] > 0, key
    wall = r["wall_time_s"]
    assert r["end_to_end_tok_per_s"] == pytest.approx(n * (inp + out) / wall)
    assert r["output_tok_per_s"] == pytest.approx(n * out / wall)
    assert r["prefill_tok_per_s"] == pytest.approx(n * inp / r["prefill_time_s"])
    assert 0 < r["prefill_time_s"] + r["decode_time_s"] <= wall
    for key in ("ttft_s", "tpot_s", "latency_s"):
        q = r[key]
        assert 0 < q["p50"] <= q["p90"] <= q["p99"], (key, q)
    assert r["ttft_s"]["p99"] <= r["latency_s"]["p99"] <= wall
    assert r["tpot_s"]["p50"] <= r["latency_s"]["p50"]
    assert 0 < r["kv_waste_mean"] <= r["kv_waste_max"] < 1  # sequences of about one 16-slot block leave gaps
    kernels = r["kernels"]
    for op in ("gguf_linear", "paged_attention_prefill", "paged_attention_decode"):
        assert op in kernels, f"the default (GGUF) model must dispatch {op}; got {sorted(kernels)}"
    for op, impls in kernels.items():
        assert op in OPS and impls and all("." in i for i in impls), (op, impls)
    text = format_text(r)
    for label in ("prefill", "decode", "end-to-end", "TTFT (ms)", "TPOT (ms)", "KV cache waste", "kernels in use"):
        assert label in text, label


def test_bad_arguments_are_one_clear_line():
    for args, message in ((["--num-prompts", "0"], "--num-prompts must be >= 1"),
                          (["--output-len", "-3"], "--output-len must be >= 1")):
        proc = run_engine(["bench", *args])
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
