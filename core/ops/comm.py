"""Collective communication over the default torch.distributed process group: all-reduce (sum), all-gather and
broadcast. Each op's ``across_ranks`` says what a rank must get from every rank's inputs (the kit's two-process check,
engine.core.testing.distributed); in one process each is a copy."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .inputs import randint, randn
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


def _tensor(p, dtype, device, gen):
    if dtype.is_floating_point:
        return randn(p["shape"], dtype, device, gen)
    return randint(-(2**40), 2**40, p["shape"], device, gen, dtype)


def _all_reduce_inputs(p, dtype, device, gen):
    return (_tensor(p, dtype, device, gen),)


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
    across_ranks=lambda inputs, rank: sum(args[0].double() for args in inputs).to(inputs[rank][0].dtype),
    doc=(
        "x of any shape -> a new tensor (never x itself) holding the elementwise sum of x over every rank of "
        "the default torch.distributed process group, in x.dtype. With no process group initialised, or a "
        "world size of 1, a copy of x. Every rank must call it with the same shape and dtype."
    ),
)


def _all_gather_ref(x):
    world = world_size()
    out = torch.empty((world, *x.shape), dtype=x.dtype, device=x.device)
    if world == 1:
        out[0].copy_(x)
    else:
        dist.all_gather(list(out.unbind(0)), x.contiguous())
    return out


EXACT = Tolerance(0.0, 0.0)  # a copy: every bit arrives
COPY_DTYPES = {torch.float32: EXACT, torch.bfloat16: EXACT, torch.float16: EXACT, torch.int64: EXACT}
COPY_CASES = [Case("decode_logits", {"shape": (1, 24576)}), Case("rows", {"shape": (8, 1000)}),
              Case("odd_3d", {"shape": (3, 5, 7)}), Case("step_header", {"shape": (8,)}, dtypes=(torch.int64,)),
              Case("step", {"shape": (301,)}, dtypes=(torch.int64,))]

all_gather = OpDef(
    name="all_gather",
    schema="(Tensor x) -> Tensor",
    reference=_all_gather_ref,
    fake=lambda x: x.new_empty((world_size(), *x.shape)),
    make_inputs=_all_reduce_inputs,
    draw=_draw,
    cases=COPY_CASES,
    tolerances=COPY_DTYPES,
    across_ranks=lambda inputs, rank: torch.stack([args[0] for args in inputs]),
    doc=(
        "x of any shape -> a new tensor [world, *x.shape] whose row r is rank r's x, on every rank of the default "
        "torch.distributed process group (the vocabulary slices of tensor-parallel logits). Every rank must call it "
        "with the same shape and dtype. With no process group, or a world size of 1, x.unsqueeze(0) copied."
    ),
)


def _broadcast_ref(x, src):
    out = x.clone(memory_format=torch.contiguous_format)
    if world_size() > 1:
        dist.broadcast(out, src=src)
    return out


def _broadcast_inputs(p, dtype, device, gen):
    return _tensor(p, dtype, device, gen), p.get("src", 0)


broadcast = OpDef(
    name="broadcast",
    schema="(Tensor x, int src) -> Tensor",
    reference=_broadcast_ref,
    fake=lambda x, src: torch.empty_like(x),
    make_inputs=_broadcast_inputs,
    # src 1 is rank 1 in the kit's two-process check; in one process the kit serves no collective
    cases=[Case(c.name + f"_from_{src}", {**c.params, "src": src}, dtypes=c.dtypes) for c in COPY_CASES
           for src in (0, 1)],
    tolerances=COPY_DTYPES,
    across_ranks=lambda inputs, rank: inputs[inputs[rank][1]][0],
    doc=(
        "x of any shape, src (a rank) -> a new tensor equal to rank src's x, on every rank of the default "
        "torch.distributed process group (a tensor-parallel step's ids and positions, from rank 0). Every rank "
        "passes a tensor of the same shape and dtype (what the others pass is ignored) and the same src. With no "
        "process group, or a world size of 1, a copy of x."
    ),
)
