"""NVFP4: 4-bit e2m1 values in blocks of 16 along K, an e4m3 scale per block and an fp32 scale per tensor.

Layout (the same as NVIDIA's and torch.float4_e2m1fn_x2's): a code is sign (bit 3) and e2m1 magnitude
(bits 0-2), codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6 and 8..15 their negatives (8 is -0). Two codes per byte
along K: the LOW nibble holds the even element (k = 2j), the HIGH nibble the odd one (k = 2j + 1).
A row of K elements is K/2 bytes and K/16 block scales; ``value = e2m1 * block_scale / global_scale``.
"""

from __future__ import annotations

import torch

from .inputs import randn, uniform
from .precision import acc
from .registry import Case, OpDef, Tolerance
from .shapes import matmul_cases

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# Midpoints between consecutive magnitudes; at an exact tie the even code wins, so a tie rounds up only
# where the upper neighbour's code is even (codes 2, 4, 6 sit above 0.75, 1.75 and 3.5).
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_ROUNDS_UP = (False, True, False, True, False, True, False)


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """The conventional per-tensor scale 448 * 6 / amax(x), a 0-dim fp32 tensor (amax clamped to >= 1e-12)."""
    return (E4M3_MAX * E2M1_MAX) / x.detach().float().abs().amax().clamp(min=1e-12)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """Codes (uint8, 0..15) of the e2m1 values nearest to fp32 ``v``: ties to the even code, |v| > 6 saturates
    to 6, the sign bit copies v's sign bit (so a small negative becomes -0, code 8)."""
    a = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for mid, up in zip(_MIDPOINTS, _TIE_ROUNDS_UP, strict=True):
        code += (a >= mid if up else a > mid).to(torch.uint8)
    return code | (torch.signbit(v).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of uint8 codes 0..15."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> codes uint8 [..., K] (low nibble first)."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


# float64 only where the conformance kit runs a reference in fp64 (its oracle)
_SCALE_DTYPES = (torch.float32, torch.float64)


def _nvfp4_quantize_ref(x, global_scale):
    if x.dim() != 2 or x.shape[1] % BLOCK:
        raise ValueError(f"nvfp4_quantize wants x [M, K] with K a multiple of {BLOCK}, got {tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"x must be a float tensor, got {x.dtype}")
    if global_scale.numel() != 1 or global_scale.dtype not in _SCALE_DTYPES:
        raise TypeError(f"global_scale must be a one-element float32 tensor (see nvfp4_global_scale), got "
                        f"{global_scale.dtype} of shape {tuple(global_scale.shape)}")
    m, k = x.shape
    gs = global_scale.reshape(())
    blocks = x.float().reshape(m, k // BLOCK, BLOCK)
    # Saturate rather than overflow to NaN when a caller passes a larger global scale than the convention.
    # amax / 6 correctly rounded to fp32 on every device: torch's GPU division by a Python scalar multiplies by
    # its reciprocal, which can differ from IEEE division in the last bit (and then in the e4m3 scale); fp64 division
    # rounded once more to fp32 is the IEEE fp32 quotient (53 >= 2 * 24 + 2 bits).
    amax_6 = (blocks.abs().amax(-1).double() / E2M1_MAX).float()
    block_scale = (amax_6 * gs).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    bs = block_scale.float()
    # As NVIDIA's kernels do: one reciprocal per block, and a block whose scale underflows to 0 encodes zeros.
    inv = torch.where(bs == 0, torch.zeros_like(bs), gs / bs)
    codes = e2m1_encode(blocks * inv[..., None]).reshape(m, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, block_scale


def _nvfp4_quantize_fake(x, global_scale):
    m, k = x.shape
    return (x.new_empty((m, k // 2), dtype=torch.uint8),
            x.new_empty((m, k // BLOCK), dtype=torch.float8_e4m3fn))


def _varied_blocks(rows, k, device, gen, scale):
    """fp32 normals whose 16-element blocks differ in magnitude (factors 2**-6 .. 2**2), so block scales span
    a wide e4m3 range and a misapplied scale shows."""
    mag = torch.exp2(uniform((rows, k // BLOCK, 1), -6.0, 2.0, torch.float32, "cpu", gen))
    x = randn((rows, k // BLOCK, BLOCK), torch.float32, "cpu", gen, scale=scale) * mag
    return x.reshape(rows, k).to(device)


def _nvfp4_quantize_inputs(p, dtype, device, gen):
    x = _varied_blocks(p["m"], p["k"], device, gen, 1.0).to(dtype)
    # The conventional scale times a random factor: with bf16 x and the conventional 448*6/amax, block scales
    # and scaled values often land exactly on rounding midpoints, where fp32 evaluation order decides the
    # result; a random factor keeps the expected outputs exact for any correct kernel.
    factor = uniform((), 0.55, 1.0, torch.float32, device, gen)
    return x, nvfp4_global_scale(x) * factor


_CASES = [Case("tiny", {"m": 3, "n": 24, "k": 32}),
          Case("one_row", {"m": 1, "n": 64, "k": 256, "bias": True}),
          Case("wider", {"m": 9, "n": 80, "k": 112}),
          Case("smollm", {"m": 4, "n": 192, "k": 576, "bias": True})]

def _draw(rng, budget):
    return matmul_cases(rng, budget, lambda m, n, k: {"m": m, "n": n, "k": k, "bias": rng.random() < 0.3})


nvfp4_quantize = OpDef(
    name="nvfp4_quantize",
    schema="(Tensor x, Tensor global_scale) -> (Tensor, Tensor)",
    reference=_nvfp4_quantize_ref,
    fake=_nvfp4_quantize_fake,
    make_inputs=_nvfp4_quantize_inputs,
    draw=_draw,
    cases=_CASES,
    # Codes and scales are exact: any correct kernel reproduces them bit for bit.
    tolerances={torch.float32: Tolerance(0.0, 0.0), torch.bfloat16: Tolerance(0.0, 0.0)},
    doc=(
        "x [M, K] (K % 16 == 0), global_scale fp32 one element -> (packed uint8 [M, K/2], block_scale "
        "float8_e4m3fn [M, K/16]). block_scale = e4m3(min((amax(block) / 6) * global_scale, 448)) (round "
        "to nearest even, fp32 in that order); v = x * (global_scale / block_scale) in fp32 (0 where "
        "block_scale is 0); code = nearest e2m1 to v, ties to the even code, |v| > 6 saturates, sign bit = "
        "sign bit of v. Two codes per byte, low nibble = even k. Codes 0..7 = 0, .5, 1, 1.5, 2, 3, 4, 6; "
        "8..15 negatives. Outputs are exact."
    ),
)


def _nvfp4_linear_ref(x, w_packed, w_block_scale, w_global_scale, bias):
    if x.dim() != 2 or w_packed.dim() != 2 or x.shape[1] != 2 * w_packed.shape[1] or x.shape[1] % BLOCK:
        raise ValueError(f"nvfp4_linear wants x [M, K] (K % 16 == 0) and w_packed [N, K/2], got "
                         f"{tuple(x.shape)}, {tuple(w_packed.shape)}")
    if w_packed.dtype != torch.uint8 or w_block_scale.dtype != torch.float8_e4m3fn:
        raise TypeError(f"w_packed must be uint8 and w_block_scale float8_e4m3fn, got {w_packed.dtype}, "
                        f"{w_block_scale.dtype}")
    k, n = x.shape[1], w_packed.shape[0]
    if tuple(w_block_scale.shape) != (n, k // BLOCK):
        raise ValueError(f"w_block_scale must be [N={n}, K/16={k // BLOCK}], got "
                         f"{tuple(w_block_scale.shape)}")
    if w_global_scale.numel() != 1 or w_global_scale.dtype not in _SCALE_DTYPES:
        raise TypeError("w_global_scale must be a one-element float32 tensor")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must be [N={n}], got {tuple(bias.shape)}")
    scale = w_block_scale.float().repeat_interleave(BLOCK, dim=1) / w_global_scale.reshape(())
    w = e2m1_decode(unpack(w_packed)) * scale
    out = acc(x) @ w.t().to(acc(x).dtype)
    if bias is not None:
        out = out + acc(bias)
    return out.to(x.dtype)


def _nvfp4_linear_fake(x, w_packed, w_block_scale, w_global_scale, bias):
    return x.new_empty((x.shape[0], w_packed.shape[0]))


def _nvfp4_linear_inputs(p, dtype, device, gen):
    x = randn((p["m"], p["k"]), dtype, device, gen)
    w = _varied_blocks(p["n"], p["k"], device, gen, p["k"] ** -0.5)
    w_gs = nvfp4_global_scale(w)
    w_packed, w_bs = _nvfp4_quantize_ref(w, w_gs)
    bias = randn((p["n"],), dtype, device, gen, scale=0.5) if p.get("bias") else None
    return x, w_packed, w_bs, w_gs, bias


nvfp4_linear = OpDef(
    name="nvfp4_linear",
    schema="(Tensor x, Tensor w_packed, Tensor w_block_scale, Tensor w_global_scale, Tensor? bias) -> Tensor",
    reference=_nvfp4_linear_ref,
    fake=_nvfp4_linear_fake,
    make_inputs=_nvfp4_linear_inputs,
    draw=_draw,
    cases=_CASES,
    tolerances={torch.float32: Tolerance(1e-4, 1e-4), torch.bfloat16: Tolerance(1e-2, 1e-2)},
    doc=(
        "out [M, N] = x @ dequant(w)^T (+ bias), fp32 accumulate, in x.dtype. x [M, K]; w_packed uint8 "
        "[N, K/2] and w_block_scale float8_e4m3fn [N, K/16] as nvfp4_quantize writes them; w_global_scale "
        "fp32 one element; "
        "dequant(w)[n, k] = e2m1(code[n, k]) * w_block_scale[n, k // 16] / w_global_scale. bias [N] or None. "
        "The weight-only path (what runs on Hopper); activations are not quantized."
    ),
)


def _nvfp4_linear_w4a4_ref(x, x_global_scale, w_packed, w_block_scale, w_global_scale, bias):
    if x_global_scale.numel() != 1 or x_global_scale.dtype not in _SCALE_DTYPES:
        raise TypeError("x_global_scale must be a one-element float32 tensor (a calibrated input scale)")
    x_packed, x_block_scale = _nvfp4_quantize_ref(x, x_global_scale)
    x_scale = x_block_scale.float().repeat_interleave(BLOCK, dim=1) / x_global_scale.reshape(())
    xq = e2m1_decode(unpack(x_packed)) * x_scale
    return _nvfp4_linear_ref(xq, w_packed, w_block_scale, w_global_scale, bias).to(x.dtype)


def _nvfp4_linear_w4a4_inputs(p, dtype, device, gen):
    x, w_packed, w_bs, w_gs, bias = _nvfp4_linear_inputs(p, dtype, device, gen)
    x_gs = nvfp4_global_scale(x) * uniform((), 0.55, 1.0, torch.float32, device, gen)
    return x, x_gs, w_packed, w_bs, w_gs, bias


nvfp4_linear_w4a4 = OpDef(
    name="nvfp4_linear_w4a4",
    accumulation_roundoff=2.0 ** -10,  # FP4 tensor cores (Blackwell), like FP8's on Hopper
    quantizes_intermediates=True,
    schema=("(Tensor x, Tensor x_global_scale, Tensor w_packed, Tensor w_block_scale, Tensor w_global_scale, "
            "Tensor? bias) -> Tensor"),
    reference=_nvfp4_linear_w4a4_ref,
    fake=lambda x, x_gs, w_packed, w_bs, w_gs, bias: x.new_empty((x.shape[0], w_packed.shape[0])),
    make_inputs=_nvfp4_linear_w4a4_inputs,
    draw=_draw,
    cases=_CASES,
    tolerances={torch.float32: Tolerance(1e-4, 1e-4), torch.bfloat16: Tolerance(1e-2, 1e-2)},
    doc=(
        "The FP4 tensor-core linear (Blackwell): out = dequant(nvfp4_quantize(x, x_global_scale)) @ dequant(w)^T "
        "(+ bias), fp32 accumulate, in x.dtype. x_global_scale is the calibrated input scale a checkpoint carries "
        "(448 * 6 / amax of calibration activations); the weight arguments are those of nvfp4_linear. Activations "
        "are quantized exactly as nvfp4_quantize does, so a kernel is compared on the same FP4 values."
    ),
)
