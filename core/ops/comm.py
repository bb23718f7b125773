"""Collective communication: all-reduce (sum) over the default torch.distributed process group."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .inputs import randn
from .registry import Case, OpDef, Tolerance
from .shapes import row_cases


def world_size() -> int:
    """Ranks in the default process group; 1 when torch.distributed is unavailable or not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size()


def _all_reduce_ref(x):
    out = x.clone()
    if world_size() > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def _all_reduce_inputs(p, dtype, device, gen):
    return (randn(p["shape"], dtype, device, gen),)


def _draw(rng, budget):
    return row_cases(rng, budget, lambda rows, hidden, special: {"shape": (rows, hidden)})


all_reduce = OpDef(
    name="all_reduce",
    schema="(Tensor x) -> Tensor",
    reference=_all_reduce_ref,
    fake=lambda x: torch.empty_like(x),
    make_inputs=_all_reduce_inputs,
    draw=_draw,
    # The kit runs single-process, where the op is a copy; these shapes cover decode, prefill and odd sizes.
    cases=[Case("decode_row", {"shape": (1, 576)}), Case("batch", {"shape": (8, 1024)}),
           Case("odd_3d", {"shape": (3, 5, 7)}), Case("flat", {"shape": (4097,)})],
    # Across ranks the summation order is the implementation's, so allow a couple of ulps in bf16.
    tolerances={torch.float32: Tolerance(1e-5, 1e-5), torch.bfloat16: Tolerance(8e-3, 8e-3)},
    collective=True,
    doc=(
        "x of any shape -> a new tensor (never x itself) holding the elementwise sum of x over every rank of "
        "the default torch.distributed process group, in x.dtype. With no process group initialised, or a "
        "world size of 1, a copy of x. Every rank must call it with the same shape and dtype."
    ),
)
