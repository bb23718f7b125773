"""Shape generators for the conformance kit: the sizes real models send, drawn afresh each run.

Each op's ``draw(rng, budget)`` returns a few :class:`Case` s, one per regime (a single token, a decode batch, a
prefill, the widest hidden size, special rows), with sizes drawn from ``rng`` (a ``random.Random`` seeded by the
kit's run seed and the op's name, so every process of a run draws the same cases). ``budget`` bounds the work of
one case (multiply-adds, or elements for elementwise ops): each dimension reaches real sizes (rows to 4096, hidden
sizes to 8192, contexts past 4096 keys), not all of them in one case on a CPU.
"""

from __future__ import annotations

import math
import random

import torch

from .registry import Case

# Hidden sizes of real models (SmolLM2, Qwen2.5, Llama 3, Mistral, DeepSeek-V3, Llama 3 70B) and head shapes
# (query heads, KV heads, head dim).
HIDDEN = (576, 896, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 7168, 8192)
WIDEST = 8192
HEADS = ((9, 3, 64), (14, 2, 64), (16, 8, 64), (32, 8, 64), (32, 8, 128), (32, 32, 128), (28, 4, 128),
         (40, 8, 128), (64, 8, 128))
MAX_ROWS = 4096


def log_int(rng: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi], log-uniform (small sizes as likely per octave as large ones)."""
    if hi <= lo:
        return lo
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def fit(n: int, per_unit: int, budget: int, lo: int = 1) -> int:
    """``n`` shrunk so that ``n * per_unit <= budget`` (never below ``lo``)."""
    return max(lo, min(n, budget // max(per_unit, 1)))


# The most elements one tensor of a drawn case may hold, whatever the budget: the kit keeps several copies of every
# input (a clone, an fp64 twin, a strided view) and an accelerator runs a dozen kit processes at once. 2^26 holds an
# 8192 x 8192 weight; a device run that drew 2^31-element expert weights ran out of memory.
MAX_TENSOR_ELEMENTS = 1 << 26


def elements(budget: int) -> int:
    """The element budget of an elementwise op's case (its work per element is a few operations, and the kit keeps
    an fp64 copy and a strided copy of everything)."""
    return min(budget >> 5, MAX_TENSOR_ELEMENTS)


def row_cases(rng: random.Random, budget: int, make, widths=HIDDEN, widest=WIDEST) -> list[Case]:
    """The regimes of an op over [rows, hidden] activations: ``make(rows, hidden, special)`` -> params.

    one_row (a single decode token), decode (9-64 rows), prefill (65-4096 rows), widest (hidden 8192) and
    special_rows (a zero row, a row of tiny values where an epsilon matters, a row of huge values)."""
    cap = elements(budget)
    h = rng.choice(widths)
    cases = [
        Case("draw_one_row", make(1, rng.choice(widths), False), engine_shape=True),
        Case("draw_decode", make(log_int(rng, 9, 64), h, False), engine_shape=True),
    ]
    h = rng.choice(widths)
    cases.append(Case("draw_prefill", make(fit(log_int(rng, 65, MAX_ROWS), h, cap, 65), h, False), engine_shape=True))
    cases.append(Case("draw_widest", make(fit(log_int(rng, 9, 512), widest, cap, 9), widest, False),
                      engine_shape=True))
    cases.append(Case("draw_special_rows", make(log_int(rng, 16, 256), rng.choice(widths), True), engine_shape=True))
    return cases


def special_rows(t: torch.Tensor, huge: float | None = None) -> torch.Tensor:
    """``t`` [..., H] with its first rows replaced: row 0 zeros, row 1 scaled by 1e-3 (an epsilon dominates its
    mean square), row 2 scaled by ``huge`` (default 1000; 200 in fp16, where the square of 1000 overflows). The
    other rows keep their values. Returns a new tensor in t's dtype."""
    if huge is None:
        huge = 200.0 if t.dtype == torch.float16 else 1000.0
    rows = t.float().reshape(-1, t.shape[-1]).clone()
    n = rows.shape[0]
    if n > 0:
        rows[0] = 0
    if n > 1:
        rows[1] *= 1e-3
    if n > 2:
        rows[2] *= huge
    return rows.reshape(t.shape).to(t.dtype)


def _n_for(rng: random.Random, k: int, m: int, budget: int, align: int) -> int:
    """An output width: a real layer's (a hidden size, or 3x one for an MLP), cut to the budget, a multiple of align."""
    n = rng.choice(HIDDEN) * rng.choice((1, 1, 3))
    n = min(n, budget // max(m * k, 1), elements(budget) // k)  # the weight, too, within the element budget
    return max(align, n // align * align)


def matmul_cases(rng: random.Random, budget: int, make, align_n: int = 16, ks=HIDDEN) -> list[Case]:
    """The regimes of an [M, K] x [N, K]^T op: ``make(m, n, k)`` -> params. one_row (M = 1: a decode step of one
    sequence, where the widest layers fit any budget), decode (M 2-64), prefill (M 65-4096) and widest (K = 8192)."""
    cases = []
    for name, lo, hi, k in (("draw_one_row", 1, 1, rng.choice(ks)), ("draw_decode", 2, 64, rng.choice(ks)),
                            ("draw_prefill", 65, MAX_ROWS, rng.choice(ks)), ("draw_widest", 1, 16, max(ks))):
        m = fit(log_int(rng, lo, hi), k * align_n, budget, lo)
        cases.append(Case(name, make(m, _n_for(rng, k, m, budget, align_n), k), engine_shape=True))
    return cases
