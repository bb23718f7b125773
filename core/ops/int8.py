"""INT8 weight-only linear (W8A16): 8-bit group-quantized weights kept as their codes and group scales: GPTQ 8-bit
checkpoints, compressed-tensors W8A16, and GGUF Q8_0 blocks (the same numbers with groups of 32) on platforms with a
kernel for this op.

Layout: ``w_codes`` uint8 [N, K] (0..255); ``w_scale`` [N, G] (fp16, bf16 or fp32) and ``w_zero`` uint8 [N, G] or
None for symmetric weights (zero 128), with ``G = ceil(K / group_size)``. The weight is
``(code[n, k] - zero[n, k // group_size]) * scale[n, k // group_size]``; a signed int8 q is the code ``q + 128``.
"""

from __future__ import annotations

import torch

from .inputs import randint, randn, uniform
from .int4 import check_groups, draw_group_cases, group_linear_reference
from .registry import Case, OpDef, Tolerance


def check_int8(w_codes, w_scale, w_zero, group_size: int, k: int | None = None) -> tuple[int, int]:
    """(N, K) of a well-formed INT8 weight; ValueError / TypeError naming what is wrong otherwise."""
    if w_codes.dim() != 2 or w_codes.dtype != torch.uint8:
        raise TypeError(f"w_codes must be uint8 [N, K], got {w_codes.dtype} of shape {tuple(w_codes.shape)}")
    n, kk = w_codes.shape
    if k is not None and k != kk:
        raise ValueError(f"int8_linear wants x [M, K] and w_codes [N, K], got K={k} and w_codes "
                         f"{tuple(w_codes.shape)}")
    check_groups("int8_linear", n, kk, w_scale, w_zero, group_size)
    return n, kk


def dequantize_int8(w_codes, w_scale, w_zero, group_size: int) -> torch.Tensor:
    """The weight [N, K] in fp32 (fp64 for fp64 scales: the kit's oracle)."""
    n, k = check_int8(w_codes, w_scale, w_zero, group_size)
    dt = torch.float64 if w_scale.dtype == torch.float64 else torch.float32
    zero = 128.0 if w_zero is None else w_zero.to(dt).repeat_interleave(group_size, dim=1)[:, :k]
    return (w_codes.to(dt) - zero) * w_scale.to(dt).repeat_interleave(group_size, dim=1)[:, :k]


_int8_linear_ref = group_linear_reference("int8_linear", check_int8, dequantize_int8)


def _int8_linear_fake(x, w_codes, w_scale, w_zero, group_size, bias):
    return x.new_empty((x.shape[0], w_codes.shape[0]))


def _int8_linear_inputs(p, dtype, device, gen):
    n, k, g = p["n"], p["k"], p["group"]
    groups = -(-k // g)
    x = randn((p["m"], k), dtype, device, gen)
    codes = randint(0, 256, (n, k), device, gen, dtype=torch.uint8)
    # scales spread over two octaves per row, as calibrated groups are
    scale = uniform((n, groups), 0.5, 2.0, torch.float32, "cpu", gen) * (k ** -0.5) / 128
    scale = scale.to(p.get("sdt", torch.float16))
    zero = randint(0, 256, (n, groups), device, gen, dtype=torch.uint8) if p.get("zero") else None
    bias = randn((n,), dtype, device, gen, scale=0.5) if p.get("bias") else None
    return x, codes, scale.to(device), zero, g, bias


_CASES = [Case("tiny_sym", {"m": 3, "n": 24, "k": 64, "group": 32}),
          Case("one_row_zero", {"m": 1, "n": 64, "k": 256, "group": 128, "zero": True, "bias": True}),
          Case("decode_4", {"m": 4, "n": 80, "k": 384, "group": 32}),  # GGUF Q8_0's groups
          Case("row_group", {"m": 2, "n": 40, "k": 96, "group": 96}),  # group_size -1: one group a row
          Case("partial_group", {"m": 5, "n": 48, "k": 320, "group": 128, "zero": True}),  # the last group short
          Case("bf16_scales", {"m": 9, "n": 72, "k": 512, "group": 64, "sdt": torch.bfloat16}),
          Case("prefill_80", {"m": 80, "n": 96, "k": 576, "group": 64, "zero": True, "bias": True})]


int8_linear = OpDef(
    name="int8_linear",
    schema="(Tensor x, Tensor w_codes, Tensor w_scale, Tensor? w_zero, int group_size, Tensor? bias) -> Tensor",
    reference=_int8_linear_ref,
    fake=_int8_linear_fake,
    make_inputs=_int8_linear_inputs,
    draw=draw_group_cases,  # the same regimes and group sizes as int4_linear's
    cases=_CASES,
    # bf16 / fp16 cover kernels that round the dequantized weight to x's dtype before an fp32-accumulating dot
    tolerances={torch.float32: Tolerance(1e-4, 1e-4), torch.bfloat16: Tolerance(5e-2, 2e-2),
                torch.float16: Tolerance(1e-2, 1e-2)},
    doc=(
        "out [M, N] = x @ dequant(w)^T (+ bias), fp32 accumulate, in x.dtype. x [M, K] (K % 32 == 0); w_codes "
        "uint8 [N, K]; w_scale fp16/bf16/fp32 [N, G] and w_zero uint8 [N, G] or None (zero 128), G = ceil(K / "
        "group_size), group_size % 32 == 0; dequant(w)[n, k] = (code[n, k] - zero[n, k // group_size]) * "
        "w_scale[n, k // group_size]. bias [N] or None. GPTQ 8-bit, compressed-tensors W8A16, GGUF Q8_0."
    ),
)
