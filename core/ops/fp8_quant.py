"""Dynamic FP8 quantization of activations: ``fp8_quantize_per_token``.

It produces the ``x_q, x_scale`` pair that :data:`engine.core.ops.fp8.fp8_linear` consumes, at run time, from the
activations of each step: one scale per token (``group_size = 0``, scale ``[M, 1]``) or one per 1 x ``group_size``
group of each token (``group_size = 128``: DeepSeek-style 1x128 groups, scale ``[M, ceil(K / 128)]``). It is
:func:`engine.core.ops.fp8.quantize_fp8` with granularity ``"token"`` or ``"block"`` with ``block = (1, group_size)``,
bit for bit:

- ``scale = max(amax, 1e-12) / fp8_max`` in fp32 (IEEE division, correctly rounded), amax over the token or group;
- ``q = round_to_nearest_even(clamp(x.float() / scale, -fp8_max, fp8_max))`` in the FP8 format, with ``x / scale``
  an IEEE division (not a multiplication by a reciprocal).

Every step is correctly rounded, so an implementation has exactly one right answer: codes and scales are compared
exactly. (Two codes can only disagree where the quotient lands on a rounding tie and one side rounds it another way,
or where a kernel multiplies by ``1 / scale``: both are bugs against this contract.)
"""

from __future__ import annotations

import math

import torch

from .fp8 import FP8_DTYPES, fp8_needs, quantize_fp8
from .inputs import randn, uniform
from .registry import Case, OpDef, Tolerance
from .shapes import row_cases

X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(x, fp8_dtype, group_size) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"fp8_quantize_per_token: x must be a tensor, got {type(x).__name__}")
    if x.dtype not in X_DTYPES:
        raise TypeError(f"fp8_quantize_per_token: x.dtype must be one of {X_DTYPES}, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"fp8_quantize_per_token: x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if fp8_dtype not in FP8_DTYPES:
        raise ValueError(f"fp8_quantize_per_token: fp8_dtype must be one of {sorted(FP8_DTYPES)}, got {fp8_dtype!r}")
    if not isinstance(group_size, int) or group_size < 0:
        raise ValueError(f"fp8_quantize_per_token: group_size must be 0 (one scale per token) or a positive group "
                         f"width (128 for 1x128 groups), got {group_size!r}")


def scale_shape(m: int, k: int, group_size: int) -> tuple[int, int]:
    """The scale's shape: [M, 1] per token, [M, ceil(K / group_size)] per group."""
    return (m, 1) if group_size == 0 else (m, math.ceil(k / group_size))


def _fp8_quantize_per_token_ref(x: torch.Tensor, fp8_dtype: str, group_size: int):
    _check(x, fp8_dtype, group_size)
    fp8 = FP8_DTYPES[fp8_dtype]
    if group_size == 0:
        return quantize_fp8(x, "token", fp8)
    return quantize_fp8(x, "block", fp8, (1, group_size))


def _fp8_quantize_per_token_fake(x, fp8_dtype, group_size):
    _check(x, fp8_dtype, group_size)
    q = x.new_empty(x.shape, dtype=FP8_DTYPES[fp8_dtype])
    return q, x.new_empty(scale_shape(*x.shape, group_size), dtype=torch.float32)


def _fp8_quantize_per_token_inputs(p, dtype, device, gen):
    """Rows of very different magnitudes, and per-group magnitudes differing too, so a scale taken over the wrong
    span shows; ``zero_row`` makes one token all zeros (its scale is 1e-12 / fp8_max and its codes zeros)."""
    m, k, g = p["m"], p["k"], p.get("group_size", 0)
    row = uniform((m, 1), -3.0, 3.0, torch.float32, "cpu", gen).exp2()
    width = g or 128
    col = uniform((1, math.ceil(k / width)), 0.25, 4.0, torch.float32, "cpu", gen).repeat_interleave(width, 1)[:, :k]
    x = randn((m, k), torch.float32, "cpu", gen) * row * col
    if p.get("zero_row"):
        x[m // 2] = 0
    return x.to(dtype=dtype, device=device), p["fp8"], g


def _draw(rng, budget):
    return [fp8_needs(c) for c in row_cases(rng, budget, lambda rows, hidden, special: {
        "m": max(rows, 2), "k": hidden, "fp8": rng.choice(("e4m3fn", "e4m3fnuz")), "group_size": rng.choice((0, 128)),
        "zero_row": special})]


fp8_quantize_per_token = OpDef(
    name="fp8_quantize_per_token",
    schema="(Tensor x, str fp8_dtype, int group_size) -> (Tensor, Tensor)",
    reference=_fp8_quantize_per_token_ref,
    fake=_fp8_quantize_per_token_fake,
    make_inputs=_fp8_quantize_per_token_inputs,
    draw=_draw,
    cases=[
        Case("token_e4m3fn", {"m": 7, "k": 576, "fp8": "e4m3fn"}),
        Case("token_e4m3fnuz", {"m": 5, "k": 320, "fp8": "e4m3fnuz", "zero_row": True}),
        Case("token_wide", {"m": 3, "k": 5000, "fp8": "e4m3fn"}),
        Case("group128_e4m3fn", {"m": 6, "k": 1024, "fp8": "e4m3fn", "group_size": 128}),
        Case("group128_partial", {"m": 5, "k": 328, "fp8": "e4m3fn", "group_size": 128, "zero_row": True}),
        Case("group128_e4m3fnuz", {"m": 4, "k": 256, "fp8": "e4m3fnuz", "group_size": 128}),
    ],
    # Every step is correctly rounded (module docstring): codes and scales must match exactly.
    tolerances={dt: Tolerance(0.0, 0.0) for dt in X_DTYPES},
    doc=(
        "x [M, K] (fp32/bf16/fp16) -> (q [M, K] in float8_<fp8_dtype>, scale fp32). fp8_dtype 'e4m3fn' (max 448) or "
        "'e4m3fnuz' (max 240). group_size 0: one scale per token, scale [M, 1]; group_size G > 0: one per 1xG group "
        "of a token, scale [M, ceil(K/G)] (G = 128 feeds fp8_linear's 1x128 layout). scale = max(amax, 1e-12) / "
        "fp8_max; q = RNE(clamp(x / scale, +-fp8_max)), IEEE divisions, no reciprocal: bit-exact, equal to "
        "quantize_fp8(x, 'token' | 'block' with block=(1, G)). The dtype axis is x's dtype."
    ),
)
