"""Speculative decoding on a GPU (issue 29): what a verify step costs against a decode step on an 8B-shaped random
Llama (bf16), and what that makes of speculation, all in one run:

* ``k=0``: plain greedy decoding at batch 1 and 4 (tok/s; goal: 4 sequences >= 3x one);
* ``oracle k``: the same prompts with a proposer that drafts k tokens of the plain run's greedy continuation at
  every step, so every step verifies k + 1 rows a sequence. ``verify_over_decode_step`` is the time per engine step
  against a plain decode step of the same batch (goal: k + 1 = 5 rows at batch 1 <= 1.15x); ``speedup_at_a`` is
  what that step cost gives at a per-token acceptance a (tokens a step (1 - a^(k+1)) / (1 - a) over the step
  ratio). The measured acceptance is printed too, but means little here: with random weights the logits are
  nearly flat, so the verify and decode shapes' different bf16 rounding flips near-tie argmaxes, and once a
  sequence leaves the plain continuation the oracle's drafts are wrong (``same_tokens`` says whether it left).

Verify steps replay CUDA graphs per (batch bucket, rows) (decode_graphs.py), captured on a key's second use; one
warm-up generation per configuration runs first.

    python benchmarks/gpu/spec_decode.py [--out DIR]

``run(tiny=True)`` does the same with a 2-layer model on whatever device there is (CI: the numbers mean nothing).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.bench_gpu import _empty_cache as empty_cache  # noqa: E402
from benchmarks.bench_gpu import _prompts, _sync, emit_row, random_llama, script_main  # noqa: E402

VERIFY_GOAL = 1.15  # verify step of 5 rows / decode step, batch 1
SCALING_GOAL = 3.0  # k = 0 tok/s at 4 sequences / at 1


class OracleProposer:
    """Drafts k tokens of the known greedy continuation of each prompt."""

    def __init__(self, continuation: dict[tuple[int, ...], list[int]]):
        self.continuation = continuation

    def propose(self, items):
        drafts = {}
        for seq, k in items:
            done = len(seq.output_token_ids)
            d = list(self.continuation[tuple(seq.prompt_token_ids)][done:done + k])
            if d:
                drafts[seq.seq_id] = d
        return drafts, None


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a verify of k drafts emits when each draft is accepted with probability ``acceptance`` given the ones
    before it were (the accepted run, then one token of the target's)."""
    return float(k + 1) if acceptance >= 1 else (1 - acceptance ** (k + 1)) / (1 - acceptance)


def _generate(llm, prompts, params) -> tuple[list[list[int]], float, int]:
    """(token ids, seconds, engine steps) of one generate."""
    steps = [0]
    step = llm.engine.step

    def counted():
        steps[0] += 1
        return step()

    llm.engine.step = counted
    try:
        _sync()
        t = time.perf_counter()
        outs = llm.generate(prompts, params)
        _sync()
        dt = time.perf_counter() - t
    finally:
        llm.engine.step = step
    return [o.outputs[0].token_ids for o in outs], dt, steps[0]


def run(tiny: bool = False, out: Path | None = None) -> list[dict]:
    from engine import LLM, SamplingParams
    from engine.core.engine.spec_decode import SpeculativeConfig, Speculator

    device = "cuda" if torch.cuda.is_available() else "cpu"
    in_len, out_len, ks = (8, 12, (2,)) if tiny else (128, 128, (2, 4))
    rows = []

    def emit(row):
        emit_row(rows, row, out, "spec_decode")

    with random_llama(tiny, torch.bfloat16 if device == "cuda" else torch.float32, device) as (path, shape):
        llm = LLM(str(path), dtype="bfloat16" if device == "cuda" else "float32", max_num_seqs=4,
                  max_model_len=1024, enable_prefix_caching=False)
        params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
        base = {}
        for b in (1, 4):
            prompts = _prompts(b, in_len, shape["vocab_size"], seed=b)
            _generate(llm, prompts, params)  # warm-up: graphs, compiles
            want, dt, steps = _generate(llm, prompts, params)
            base[b] = (prompts, want, dt, steps)
            emit({"bench": "spec decode k=0", "batch": b, "tok_s": b * out_len / dt,
                  "step_ms": 1e3 * dt / steps})
        scale = (4 * out_len / base[4][2]) / (out_len / base[1][2])
        emit({"bench": "spec decode k=0 scaling", "ratio_4_over_1": scale, "goal": f">= {SCALING_GOAL}",
              "met": scale >= SCALING_GOAL})
        for b in (1, 4):
            prompts, want, dt0, steps0 = base[b]
            oracle = {tuple(p): w for p, w in zip(prompts, want, strict=True)}
            for k in ks:
                llm.engine.speculator = Speculator(SpeculativeConfig(method="draft_model", num_speculative_tokens=k),
                                                   llm.scheduler, OracleProposer(oracle))
                try:
                    _generate(llm, prompts, params)  # warm-up: the verify graphs of these shapes
                    got, dt, steps = _generate(llm, prompts, params)
                    stats = llm.engine.speculator.stats.totals()
                finally:
                    llm.engine.speculator = None
                step_ratio = (dt / steps) / (dt0 / steps0)
                row = {"bench": f"spec decode oracle k={k}", "batch": b, "verify_over_decode_step": step_ratio,
                       **{f"speedup_at_{a}": expected_tokens(a, k) / step_ratio for a in (0.7, 0.9)},
                       "measured_acceptance": stats["accepted"] / max(stats["drafted"], 1),
                       "measured_speedup": dt0 / dt, "same_tokens": got == want}
                if b == 1 and k == 4:
                    row.update(goal=f"<= {VERIFY_GOAL}", met=step_ratio <= VERIFY_GOAL)
                emit(row)
        graphs = llm.runner.graphs
        emit({"bench": "spec decode graphs", "verify_graphs": len(graphs.verify_graphs) if graphs else 0,
              "verify_disabled": graphs.verify_disabled if graphs else "no graphs"})
        del llm
        empty_cache()
    return rows


if __name__ == "__main__":
    script_main(__doc__, run)
