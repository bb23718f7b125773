"""The first requests against warm ones (issue 28): does a fresh engine serve its first request at a new batch size as
fast as later ones? An 8B-shaped random Llama (bf16) is loaded twice, with ``LLM(warmup=False)`` and with the load-time
warm-up (``LLM.warm_up``, the GPU platforms' default); each then serves, in order, 1 request, 1 again, 64 requests,
64 again (128 random prompt tokens, 128 output tokens, greedy, EOS ignored). The ratio is the first run's output
tok/s over the second's at the same batch size, in the same engine; load and warm-up seconds are reported beside.
Goal: the first request within 10% of warm (ratio >= 0.9) with the warm-up on.

    python benchmarks/gpu/first_request.py [--out DIR]

``run(tiny=True)`` does the same with a 2-layer model on whatever device there is (what CI runs: the numbers mean
nothing).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.bench_gpu import _empty_cache as empty_cache  # noqa: E402
from benchmarks.bench_gpu import _prompts, _sync, emit_row, random_llama, script_main  # noqa: E402

GOAL = 0.9


def _rate(llm, n: int, in_len: int, out_len: int, vocab: int, seed: int) -> float:
    from engine import SamplingParams

    prompts = _prompts(n, in_len, vocab, seed=seed)
    _sync()
    t = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True))
    _sync()
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t)


def run(tiny: bool = False, out: Path | None = None) -> list[dict]:
    from engine import LLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    batches, in_len, out_len = ((1, 4), 8, 8) if tiny else ((1, 64), 128, 128)
    rows = []
    with random_llama(tiny, torch.bfloat16, device) as (path, shape):
        for warmup in (False, True):
            t0 = time.perf_counter()
            llm = LLM(str(path), dtype="bfloat16", max_num_seqs=max(batches), max_model_len=1024,
                      max_num_batched_tokens=8192, enable_prefix_caching=False, warmup=warmup)
            loaded = time.perf_counter() - t0
            seed = 1
            for b in batches:
                first = _rate(llm, b, in_len, out_len, shape["vocab_size"], seed)
                again = _rate(llm, b, in_len, out_len, shape["vocab_size"], seed + 1)
                seed += 2
                emit_row(rows, {"bench": f"first request, warm-up {'on' if warmup else 'off'}",
                                "shape": f"{b} req x {in_len} in / {out_len} out", "first_tok_s": first,
                                "warm_tok_s": again, "ratio": first / again, "goal": f">= {GOAL}" if warmup else "",
                                "met": first / again >= GOAL if warmup else None, "load_s": loaded,
                                "warmup_s": llm.warmup_seconds}, out, "first_request")
            del llm
            empty_cache()
    return rows


if __name__ == "__main__":
    script_main(__doc__, run)
