"""Fill ``num_speculative_tokens_per_batch_size`` from measurements on this machine (``engine tune-spec``,
benchmarks/bench_spec_decode.py).

``measure(batch_size, workload, ks) -> {k: tokens/s}`` (k = 0: no speculation) is run for every batch size and
workload (SpecTuner.measure interleaves the k's so that drifting load hits them alike). Each batch size gets the k
with the best geometric-mean speedup over the workloads among those no worse than ``floor`` times k = 0 on any
workload, and 0 when none is.

Two workloads, as chat prompts (raw text where the model has no chat template), greedy, EOS honoured (greedy
outputs are the same for every k, so every k generates the same tokens): ``repetitive`` (edit or copy a given
passage: the answer repeats much of the prompt, n-gram lookup's case) and ``chat`` (free questions: little to look
up).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable

PASSAGE = ("The city council met on Tuesday evening to discuss the new library. The mayor said the building "
           "would open in the spring, and that it would have a reading room, a children's corner and a small "
           "cafe. Several residents asked about parking, and the council promised to add twenty spaces behind "
           "the building. The meeting ended at nine o'clock.")
WORKLOADS = {
    "repetitive": [
        f"Repeat the following text exactly, word for word:\n\n{PASSAGE}",
        f"Rewrite the following text, replacing 'library' with 'museum' and changing nothing else:\n\n{PASSAGE}",
        f"Copy this paragraph and put it in quotation marks:\n\n{PASSAGE}",
        f"Fix the punctuation of this text and return the whole text:\n\n{PASSAGE.replace('.', '')}",
    ],
    "chat": [
        "What are three good habits for staying healthy?",
        "Write a short poem about the sea.",
        "Explain what a black hole is to a child.",
        "Give me some ideas for a birthday party.",
        "Why is the sky blue?",
        "What should I pack for a weekend camping trip?",
    ],
}


def pick_k(speedups: dict[int, list[float]], floor: float = 0.97) -> int:
    """``speedups[k]``: tok/s ratio against k = 0 on each workload. The k to use (0 when none qualifies)."""
    best_k, best = 0, 1.0
    for k, ratios in sorted(speedups.items()):
        if k == 0 or not ratios or min(ratios) < floor:
            continue
        score = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        if score > best:
            best_k, best = k, score
    return best_k


def fill_table(measure: Callable[[int, str, list[int]], dict[int, float]], batch_sizes: Iterable[int],
               ks: Iterable[int], workloads: Iterable[str], floor: float = 0.97) -> tuple[dict[int, int], dict]:
    """Run ``measure(batch_size, workload, ks) -> {k: tok/s}`` (k = 0 always included, so every ratio has its
    peer from the same measurement) over the grid; return the table and the raw results
    ``{batch_size: {k: {workload: tok/s}}}``."""
    ks = sorted(set(ks) | {0})
    workloads = list(workloads)
    table, raw = {}, {}
    for b in batch_sizes:
        by_w = {w: measure(b, w, ks) for w in workloads}
        raw[b] = {k: {w: by_w[w][k] for w in workloads} for k in ks}
        speedups = {k: [raw[b][k][w] / raw[b][0][w] for w in workloads] for k in ks}
        table[b] = pick_k(speedups, floor)
    return _compact(table), raw


def _compact(table: dict[int, int]) -> dict[int, int]:
    """Drop entries equal to the one before (the lookup takes the largest key <= batch size)."""
    out, prev = {}, None
    for b in sorted(table):
        if table[b] != prev:
            out[b] = prev = table[b]
    return out


class SpecTuner:
    """Times ``llm.generate`` on the workloads with a speculator of each k (the base config's method and
    proposer; a draft model is loaded once and reused). ``run`` keeps the k = 0 outputs as the reference and
    notes any output that differs from it (greedy: only a last-bit tie between the verify and decode shapes)."""

    def __init__(self, llm, base: dict | None, max_tokens: int = 96, repeats: int = 3, clock=time.perf_counter,
                 log=print):
        from engine.core.engine.sampling_params import SamplingParams

        from . import SpeculativeConfig, Speculator, build_speculator

        self.llm, self.repeats, self.clock, self.log = llm, repeats, clock, log
        self.base = SpeculativeConfig.from_dict(dict(base or {"method": "ngram"}))
        self._Speculator = Speculator
        spec = llm.engine.speculator or build_speculator(self.base, llm)
        self.proposer = spec.proposer if self.base.method == "draft_model" else None
        self.params = SamplingParams(temperature=0, max_tokens=max_tokens)
        has_template = bool(getattr(llm.tokenizer, "chat_template", None))
        self.prompts = {w: [llm.tokenizer.encode(llm.chat_prompt([{"role": "user", "content": p}]),
                                                 add_special_tokens=False) if has_template
                            else llm.tokenizer.encode(p) for p in ps] for w, ps in WORKLOADS.items()}
        self.reference: dict = {}

    def config(self, table: dict[int, int]):
        """The base config with ``table``."""
        return dataclasses.replace(self.base, num_speculative_tokens_per_batch_size=table)

    def set_table(self, table: dict[int, int] | None) -> None:
        """Speculate with ``table`` from now on (None or all zero: not at all)."""
        if not table or not any(table.values()):
            self.llm.engine.speculator = None
            return
        self.llm.engine.speculator = self._Speculator(self.config(table), self.llm.scheduler, self.proposer)

    def run(self, batch_size: int, workload: str) -> tuple[float, list[list[int]]]:
        ps = self.prompts[workload]
        batch = [ps[i % len(ps)] for i in range(batch_size)]
        t0 = self.clock()
        outs = self.llm.generate(batch, self.params)
        dt = self.clock() - t0
        toks = [o.outputs[0].token_ids for o in outs]
        return sum(len(t) for t in toks) / dt, toks

    def warm_up(self, batch_size: int) -> None:
        """Kernels, allocator, prefix cache, and the k = 0 reference outputs."""
        for w in WORKLOADS:
            self.set_table(None)
            self.run(batch_size, w)

    def measure(self, batch_size: int, workload: str, ks: list[int]) -> dict[int, float]:
        """Best tok/s of ``repeats`` rounds per k, the k's interleaved within each round."""
        best = dict.fromkeys(ks, 0.0)
        for _ in range(self.repeats):
            for k in ks:
                self.set_table({1: k})
                rate, toks = self.run(batch_size, workload)
                best[k] = max(best[k], rate)
                ref = self.reference.setdefault((batch_size, workload), toks)
                if toks != ref:
                    same = sum(a == b for a, b in zip(toks, ref, strict=True))
                    self.log(f"  note: B={batch_size} {workload} k={k}: {same}/{len(ref)} outputs identical to k=0 "
                             "(a last-bit difference between the verify and decode shapes tipped a near-tie)")
        self.log(f"  B={batch_size:<3} {workload:<10} " + "  ".join(f"k={k}: {best[k]:6.1f}" for k in ks) + " tok/s")
        return best

    def tune(self, batch_sizes: Iterable[int], ks: Iterable[int], floor: float = 0.97
             ) -> tuple[dict[int, int], dict]:
        """Warm up, measure the grid, fill the table (``fill_table``); leaves speculation off."""
        batch_sizes = sorted(set(batch_sizes))
        self.warm_up(max(batch_sizes))
        try:
            return fill_table(self.measure, batch_sizes, ks, WORKLOADS, floor)
        finally:
            self.set_table(None)
