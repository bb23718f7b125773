"""Gated activations for the MLP: ``silu_and_mul``."""

from __future__ import annotations

import torch

from .inputs import randn
from .precision import REF_DTYPES, acc
from .registry import Case, OpDef, Tolerance
from .shapes import row_cases, special_rows

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_gate_up(x: torch.Tensor) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"silu_and_mul: x must be a tensor, got {type(x).__name__}")
    if x.dtype not in REF_DTYPES:
        raise TypeError(f"silu_and_mul: x.dtype must be one of {_DTYPES}, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(
            f"silu_and_mul: x must be [..., 2*d] (gate then up), got shape {tuple(x.shape)}; "
            "the last dimension must be even")
    return x.shape[-1] // 2


def _silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] computed in fp32, returned in x.dtype as [..., d]."""
    d = _check_gate_up(x)
    xf = acc(x)
    return (torch.nn.functional.silu(xf[..., :d]) * xf[..., d:]).to(x.dtype)


def _silu_and_mul_fake(x: torch.Tensor) -> torch.Tensor:
    d = _check_gate_up(x)
    return x.new_empty((*x.shape[:-1], d))


def _silu_and_mul_inputs(p, dtype, device, gen):
    x = randn((*p["lead"], 2 * p["d"]), dtype, "cpu", gen, scale=2.0)
    # special rows: huge gates (+-2000) reach exp's overflow in a naive sigmoid
    return ((special_rows(x) if p.get("special") else x).to(device),)


def _draw(rng, budget):
    # d is the intermediate size: 2 to 3.5 times a hidden size, a multiple of 64
    return row_cases(rng, budget, lambda rows, hidden, special: {
        "lead": (rows,), "d": hidden * rng.choice((2, 3, 4)) // 64 * 32, "special": special})


silu_and_mul = OpDef(
    name="silu_and_mul",
    schema="(Tensor x) -> Tensor",
    reference=_silu_and_mul_ref,
    fake=_silu_and_mul_fake,
    make_inputs=_silu_and_mul_inputs,
    cases=[
        Case("tiny", {"lead": (3,), "d": 64}),
        Case("smollm", {"lead": (7,), "d": 1536}),
        Case("batched_3d", {"lead": (2, 5), "d": 128}),
        Case("odd", {"lead": (4,), "d": 100}),
    ],
    rounded_outputs=True,
    draw=_draw,
    tolerances={
        torch.float32: Tolerance(1e-5, 1e-5),
        torch.bfloat16: Tolerance(2e-2, 2e-2),
        torch.float16: Tolerance(2e-3, 2e-3),
    },
    doc="x: [..., 2*d] holding gate then up along the last dim; returns silu(gate) * up as [..., d] in "
        "x.dtype, computed in fp32 (one rounding at the end).",
)
