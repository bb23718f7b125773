"""Speculative decoding on a GPU (issue 29): what a verify step costs against a decode step, and what speculation
gives when drafts are right, on an 8B-shaped random Llama (bf16), all in one run:

* ``k=0``: plain greedy decoding at batch 1 and 4 (tok/s; goal: 4 sequences >= 3x one);
* ``oracle k``: the same prompts with a proposer that drafts k tokens of the known greedy continuation (random
  weights accept nothing else, so n-gram acceptance here would mean nothing), every draft right (acceptance 1.0)
  or its last token wrong every other step (about 0.75 at k = 4). The verify step's cost is measured as the time
  per engine step against a plain decode step of the same batch (goal: k + 1 = 5 rows at batch 1 <= 1.15x), and
  the speedup as tok/s against k = 0. Outputs are checked equal to plain decoding.

Verify steps replay CUDA graphs per (batch bucket, rows) (decode_graphs.py), captured on a key's second use; one
warm-up generation per configuration runs first.

    python benchmarks/gpu/spec_decode.py [--out DIR]

``run(tiny=True)`` does the same with a 2-layer model on whatever device there is (CI: the numbers mean nothing).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.bench_gpu import _prompts, _sync  # noqa: E402

VERIFY_GOAL = 1.15  # verify step of 5 rows / decode step, batch 1
SCALING_GOAL = 3.0  # k = 0 tok/s at 4 sequences / at 1


class OracleProposer:
    """Drafts k tokens of the known greedy continuation of each prompt; with ``wrong_every`` n > 0, the last
    draft token of every n-th step is wrong."""

    def __init__(self, continuation: dict[tuple[int, ...], list[int]], vocab: int, wrong_every: int = 0):
        self.continuation, self.vocab, self.wrong_every, self.steps = continuation, vocab, wrong_every, 0

    def propose(self, items):
        self.steps += 1
        drafts = {}
        for seq, k in items:
            done = len(seq.output_token_ids)
            d = list(self.continuation[tuple(seq.prompt_token_ids)][done:done + k])
            if d and self.wrong_every and self.steps % self.wrong_every == 0:
                d[-1] = (d[-1] + 1) % self.vocab
            if d:
                drafts[seq.seq_id] = d
        return drafts, None


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
    from engine.core.testing.random_model import LLAMA_8B, write_random_llama

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = (dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                  num_kv_heads=2) if tiny else LLAMA_8B)
    in_len, out_len, ks = (8, 12, (2,)) if tiny else (128, 128, (2, 4))
    root = Path(tempfile.mkdtemp(prefix="spec_decode_"))
    rows = []

    def emit(row):
        rows.append(row)
        print(row, flush=True)
        if out is not None:
            with open(out / "spec_decode.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")

    try:
        path = write_random_llama(root / "bf16", **shape, max_position=4096,
                                  dtype=torch.bfloat16 if device == "cuda" else torch.float32, device=device)
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
                for wrong_every in (0, 2):
                    proposer = OracleProposer(oracle, shape["vocab_size"], wrong_every)
                    llm.engine.speculator = Speculator(
                        SpeculativeConfig(method="draft_model", num_speculative_tokens=k), llm.scheduler, proposer)
                    try:
                        _generate(llm, prompts, params)  # warm-up: the verify graphs of these shapes
                        got, dt, steps = _generate(llm, prompts, params)
                        stats = llm.engine.speculator.stats.totals()
                    finally:
                        llm.engine.speculator = None
                    step_ratio = (dt / steps) / (dt0 / steps0)
                    row = {"bench": f"spec decode oracle k={k}", "batch": b,
                           "acceptance": stats["accepted"] / max(stats["drafted"], 1),
                           "tokens_per_step": b * out_len / steps, "verify_over_decode_step": step_ratio,
                           "speedup": dt0 / dt, "same_tokens": got == want}
                    if b == 1 and k == 4 and not wrong_every:
                        row.update(goal=f"<= {VERIFY_GOAL}", met=step_ratio <= VERIFY_GOAL)
                    emit(row)
        graphs = llm.runner.graphs
        emit({"bench": "spec decode graphs", "verify_graphs": len(graphs.verify_graphs) if graphs else 0,
              "verify_disabled": graphs.verify_disabled if graphs else "no graphs"})
        del llm
        if device == "cuda":
            torch.cuda.empty_cache()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    run(tiny=a.tiny, out=Path(a.out) if a.out else None)
