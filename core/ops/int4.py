"""INT4 weight-only linear (W4A16): GPTQ / AWQ / compressed-tensors 4-bit weights kept as their codes and group
scales, in a layout GPUs read with wide loads.

Layout: ``w_packed`` uint8 [N, K/2], two codes (0..15) a byte along K, the LOW nibble holding the even element (the
NVFP4 packing); ``w_scale`` [N, G] (fp16, bf16 or fp32: what the checkpoint stores) and ``w_zero`` uint8 [N, G]
(codes 0..15) or None for symmetric weights (zero 8), with ``G = ceil(K / group_size)``. The weight is
``(code[n, k] - zero[n, k // group_size]) * scale[n, k // group_size]``: the checkpoints' own arithmetic, exactly
(``int4_to_gguf`` turns one into GGUF Q4_0 / Q4_1 blocks for platforms whose kernels read those instead).
"""

from __future__ import annotations

import torch

from .inputs import randint, randn, uniform
from .nvfp4 import unpack
from .precision import acc
from .registry import Case, OpDef, Tolerance
from .shapes import matmul_cases

ALIGN = 32  # K and group sizes are multiples of this (what every published 4-bit layout has)
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ORACLE_DTYPES = SCALE_DTYPES + (torch.float64,)  # float64 only where the conformance kit runs its fp64 oracle


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] (0..15) -> uint8 [N, K/2], low nibble first (nvfp4.unpack is the inverse)."""
    codes = codes.to(torch.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()  # a transposed input would give transposed strides


def check_int4(w_packed, w_scale, w_zero, group_size: int, k: int | None = None) -> tuple[int, int]:
    """(N, K) of a well-formed INT4 weight; ValueError / TypeError naming what is wrong otherwise."""
    if w_packed.dim() != 2 or w_packed.dtype != torch.uint8:
        raise TypeError(f"w_packed must be uint8 [N, K/2], got {w_packed.dtype} of shape {tuple(w_packed.shape)}")
    n, kk = w_packed.shape[0], 2 * w_packed.shape[1]
    if k is not None and k != kk:
        raise ValueError(f"int4_linear wants x [M, K] and w_packed [N, K/2], got K={k} and w_packed "
                         f"{tuple(w_packed.shape)}")
    check_groups("int4_linear", n, kk, w_scale, w_zero, group_size)
    return n, kk


def check_groups(op: str, n: int, k: int, w_scale, w_zero, group_size: int) -> None:
    """The group scales and zero points of an [N, K] group-quantized weight (int4_linear's and int8_linear's)."""
    if group_size <= 0 or group_size % ALIGN or k % ALIGN:
        raise ValueError(f"{op} wants K and group_size multiples of {ALIGN}, got K={k}, group_size={group_size}")
    groups = -(-k // group_size)
    if w_scale.dtype not in _ORACLE_DTYPES or tuple(w_scale.shape) != (n, groups):
        raise TypeError(f"w_scale must be fp16, bf16 or fp32 [N={n}, G={groups}], got {w_scale.dtype} of shape "
                        f"{tuple(w_scale.shape)}")
    if w_zero is not None and (w_zero.dtype != torch.uint8 or tuple(w_zero.shape) != (n, groups)):
        raise TypeError(f"w_zero must be None or uint8 [N={n}, G={groups}], got {w_zero.dtype} of shape "
                        f"{tuple(w_zero.shape)}")


def dequantize_int4(w_packed, w_scale, w_zero, group_size: int) -> torch.Tensor:
    """The weight [N, K] in fp32 (fp64 for fp64 scales: the kit's oracle)."""
    n, k = check_int4(w_packed, w_scale, w_zero, group_size)
    dt = torch.float64 if w_scale.dtype == torch.float64 else torch.float32
    codes = unpack(w_packed).to(dt)
    zero = 8.0 if w_zero is None else w_zero.to(dt).repeat_interleave(group_size, dim=1)[:, :k]
    return (codes - zero) * w_scale.to(dt).repeat_interleave(group_size, dim=1)[:, :k]


def group_linear_reference(op: str, check, dequantize):
    """The reference of a group-quantized weight-only linear (int4_linear, int8_linear): the weight dequantized by
    ``dequantize`` and multiplied in fp32 (fp64 for the kit's oracle)."""
    def reference(x, w, w_scale, w_zero, group_size, bias):
        if x.dim() != 2:
            raise ValueError(f"{op} wants x [M, K], got {tuple(x.shape)}")
        n, _ = check(w, w_scale, w_zero, group_size, x.shape[1])
        if bias is not None and tuple(bias.shape) != (n,):
            raise ValueError(f"bias must be [N={n}], got {tuple(bias.shape)}")
        out = acc(x) @ dequantize(w, w_scale, w_zero, group_size).t().to(acc(x).dtype)
        if bias is not None:
            out = out + acc(bias)
        return out.to(x.dtype)
    return reference


_int4_linear_ref = group_linear_reference("int4_linear", check_int4, dequantize_int4)


def _int4_linear_fake(x, w_packed, w_scale, w_zero, group_size, bias):
    return x.new_empty((x.shape[0], w_packed.shape[0]))


def _int4_linear_inputs(p, dtype, device, gen):
    n, k, g = p["n"], p["k"], p["group"]
    groups = -(-k // g)
    x = randn((p["m"], k), dtype, device, gen)
    codes = randint(0, 16, (n, k), device, gen, dtype=torch.uint8)
    # scales spread over two octaves per row, as calibrated groups are; fp16 as GPTQ and AWQ store them
    scale = uniform((n, groups), 0.5, 2.0, torch.float32, "cpu", gen) * (k ** -0.5) / 8
    scale = scale.to(p.get("sdt", torch.float16))
    zero = randint(0, 16, (n, groups), device, gen, dtype=torch.uint8) if p.get("zero") else None
    bias = randn((n,), dtype, device, gen, scale=0.5) if p.get("bias") else None
    return x, pack_codes(codes), scale.to(device), zero, g, bias


_CASES = [Case("tiny_sym", {"m": 3, "n": 24, "k": 64, "group": 32}),
          Case("one_row_zero", {"m": 1, "n": 64, "k": 256, "group": 128, "zero": True, "bias": True}),
          Case("decode_4", {"m": 4, "n": 80, "k": 384, "group": 128, "zero": True}),
          Case("row_group", {"m": 2, "n": 40, "k": 96, "group": 96}),  # group_size -1: one group a row
          Case("partial_group", {"m": 5, "n": 48, "k": 320, "group": 128, "zero": True}),  # the last group short
          Case("bf16_scales", {"m": 9, "n": 72, "k": 512, "group": 64, "sdt": torch.bfloat16}),
          Case("prefill_80", {"m": 80, "n": 96, "k": 576, "group": 64, "zero": True, "bias": True})]


def draw_group_cases(rng, budget):
    def make(m, n, k):
        group = rng.choice((32, 64, 128, k))
        return {"m": m, "n": n, "k": k, "group": group, "zero": rng.random() < 0.5, "bias": rng.random() < 0.2}
    return matmul_cases(rng, budget, make)


int4_linear = OpDef(
    name="int4_linear",
    schema="(Tensor x, Tensor w_packed, Tensor w_scale, Tensor? w_zero, int group_size, Tensor? bias) -> Tensor",
    reference=_int4_linear_ref,
    fake=_int4_linear_fake,
    make_inputs=_int4_linear_inputs,
    draw=draw_group_cases,
    cases=_CASES,
    # bf16 / fp16 cover kernels that round the dequantized weight to x's dtype before an fp32-accumulating dot
    tolerances={torch.float32: Tolerance(1e-4, 1e-4), torch.bfloat16: Tolerance(5e-2, 2e-2),
                torch.float16: Tolerance(1e-2, 1e-2)},
    doc=(
        "out [M, N] = x @ dequant(w)^T (+ bias), fp32 accumulate, in x.dtype. x [M, K] (K % 32 == 0); w_packed "
        "uint8 [N, K/2], low nibble = even k; w_scale fp16/bf16/fp32 [N, G] and w_zero uint8 [N, G] or None "
        "(zero 8), G = ceil(K / group_size), group_size % 32 == 0; dequant(w)[n, k] = (code[n, k] - "
        "zero[n, k // group_size]) * w_scale[n, k // group_size]. bias [N] or None. GPTQ / AWQ / compressed-"
        "tensors W4A16."
    ),
)
