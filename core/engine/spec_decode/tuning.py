"""Fill ``num_speculative_tokens_per_batch_size`` from measurements on this machine.

``measure(batch_size, workload, ks) -> {k: tokens/s}`` (k = 0: no speculation) is run for every batch size and
workload (benchmarks/bench_spec_decode.py interleaves the k's so that drifting load hits them alike). Each batch
size gets the k with the best geometric-mean speedup over the workloads among those no worse than ``floor`` times
k = 0 on any workload, and 0 when none is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable


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
