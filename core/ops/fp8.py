"""W8A8 FP8 linear layer and the FP8 quantizer that produces its inputs.

Scale layouts (``S`` scales a matrix ``A [rows, K]``; the dequantized value is ``A_q.float() * S`` broadcast):

- per-tensor: ``S`` has one element, shape ``[]``, ``[1]`` or ``[1, 1]``;
- per-row (per-token for activations, per-channel for weights): ``S`` is ``[rows, 1]``;
- block: ``S`` is ``[ceil(rows / br), ceil(K / 128)]`` and ``S[i, j]`` scales
  ``A[i*br:(i+1)*br, j*128:(j+1)*128]`` (edge blocks are partial): ``br = 1`` for activations
  (1x128 groups, DeepSeek-style), ``128`` for weights (128x128 blocks).

Where two readings of a shape coincide (e.g. ``[M, 1]`` with ``K <= 128``) they mean the same scaling.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .inputs import randn, uniform
from .precision import acc
from .registry import Case, OpDef, Tolerance
from .shapes import HIDDEN, matmul_cases

FP8_DTYPES = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
BLOCK_K = 128
_MIN_AMAX = 1e-12  # scales never reach zero: an all-zero group quantizes to zeros, not NaN


def fp8_max(fp8_dtype: torch.dtype) -> float:
    """Largest finite value: 448 for float8_e4m3fn, 240 for float8_e4m3fnuz."""
    if fp8_dtype not in FP8_DTYPES.values():
        raise TypeError(f"expected torch.float8_e4m3fn or torch.float8_e4m3fnuz, got {fp8_dtype}")
    return float(torch.finfo(fp8_dtype).max)


def _ieee(value: float, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-dim fp32 tensor on ``like``'s device: torch's CUDA kernels divide by a Python scalar as a
    multiplication by its reciprocal, which is not the correctly rounded division this contract specifies; by a
    tensor they divide exactly."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def _block_amax(x: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    rows, cols = x.shape
    r, c = math.ceil(rows / br), math.ceil(cols / bc)
    padded = torch.nn.functional.pad(x.abs(), (0, c * bc - cols, 0, r * br - rows))
    return padded.reshape(r, br, c, bc).amax(dim=(1, 3))


def _expand(scale: torch.Tensor, rows: int, cols: int, br: int, bc: int) -> torch.Tensor:
    return scale.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]


def quantize_fp8(x: torch.Tensor, granularity: str, fp8_dtype: torch.dtype = torch.float8_e4m3fn,
                 block: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D tensor ``x [rows, K]`` to FP8 with scale = amax / fp8_max (amax clamped to >= 1e-12).

    granularity: "tensor" (scale shape []), "token" or "channel" (both per row, scale [rows, 1]), or "block"
    (requires ``block=(br, bc)``: (1, 128) for activations, (128, 128) for weights; scale
    [ceil(rows/br), ceil(K/bc)]). Values are x / scale rounded to nearest-even in ``fp8_dtype`` after
    clamping to +-fp8_max. Returns (q in fp8_dtype, scale fp32); dequantize with q.float() * scale.
    """
    if x.dim() != 2:
        raise ValueError(f"quantize_fp8 wants a 2-D tensor [rows, K], got shape {tuple(x.shape)}")
    qmax = fp8_max(fp8_dtype)
    xf = acc(x)
    if granularity == "tensor":
        scale = xf.abs().amax().clamp(min=_MIN_AMAX) / _ieee(qmax, xf)
        full = scale
    elif granularity in ("token", "channel"):
        scale = xf.abs().amax(dim=1, keepdim=True).clamp(min=_MIN_AMAX) / _ieee(qmax, xf)
        full = scale
    elif granularity == "block":
        if block is None or len(block) != 2:
            raise ValueError("granularity 'block' needs block=(br, bc): (1, 128) for activations, (128, 128) "
                             "for weights")
        scale = _block_amax(xf, *block).clamp(min=_MIN_AMAX) / _ieee(qmax, xf)
        full = _expand(scale, *xf.shape, *block)
    else:
        raise ValueError(f"granularity must be 'tensor', 'token', 'channel' or 'block', got {granularity!r}")
    q = (xf / full).clamp(-qmax, qmax).to(fp8_dtype)
    return q, scale


def _dequant_scale(scale: torch.Tensor, rows: int, k: int, br: int, what: str) -> torch.Tensor:
    """``scale`` broadcast to [rows, k], reading its layout from its shape (see the module docstring)."""
    if scale.dtype not in (torch.float32, torch.float64):  # float64 only in the conformance kit's fp64 oracle
        raise TypeError(f"{what} must be float32, got {scale.dtype}")
    blocks = (math.ceil(rows / br), math.ceil(k / BLOCK_K))
    if scale.numel() == 1 and scale.dim() <= 2:
        return scale.reshape(1, 1)
    if tuple(scale.shape) == (rows, 1):
        return scale
    if tuple(scale.shape) == blocks:
        return _expand(scale, rows, k, br, BLOCK_K)
    raise ValueError(f"{what} has shape {tuple(scale.shape)}; for a [{rows}, {k}] operand it must be [] or "
                     f"[1] (per-tensor), [{rows}, 1] (per-row) or {list(blocks)} ({br}x{BLOCK_K} blocks)")


def _fp8_linear_ref(x_q, x_scale, w_q, w_scale, bias, out_dtype):
    if x_q.dim() != 2 or w_q.dim() != 2 or x_q.shape[1] != w_q.shape[1]:
        raise ValueError(f"fp8_linear wants x_q [M, K] and w_q [N, K] (same K), got {tuple(x_q.shape)}, "
                         f"{tuple(w_q.shape)}")
    if x_q.dtype not in FP8_DTYPES.values() or w_q.dtype != x_q.dtype:
        raise TypeError(f"x_q and w_q must both be float8_e4m3fn or both float8_e4m3fnuz, got {x_q.dtype}, "
                        f"{w_q.dtype}")
    (m, k), n = x_q.shape, w_q.shape[0]
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must be [N={n}], got {tuple(bias.shape)}")
    x = x_q.float() * _dequant_scale(x_scale, m, k, 1, "x_scale")
    w = w_q.float() * _dequant_scale(w_scale, n, k, BLOCK_K, "w_scale")
    out = x @ w.t()
    if bias is not None:
        out = out + acc(bias)
    return out.to(out_dtype)


def _fp8_linear_fake(x_q, x_scale, w_q, w_scale, bias, out_dtype):
    return x_q.new_empty((x_q.shape[0], w_q.shape[0]), dtype=out_dtype)


# granularity param -> (activation quantizer args, weight quantizer args)
GRANULARITIES = {
    "tensor": (("tensor", None), ("tensor", None)),
    "token_channel": (("token", None), ("channel", None)),
    "token_tensor": (("token", None), ("tensor", None)),
    "block": (("block", (1, BLOCK_K)), ("block", (BLOCK_K, BLOCK_K))),
}


def _varied(rows, cols, device, gen, scale):
    """bf16 normals times per-row and per-128-column factors in [0.5, 2], so a misapplied scale shows."""
    row = uniform((rows, 1), 0.5, 2.0, torch.float32, "cpu", gen)
    col = uniform((1, math.ceil(cols / BLOCK_K)), 0.5, 2.0, torch.float32, "cpu", gen)
    col = col.repeat_interleave(BLOCK_K, 1)[:, :cols]
    x = randn((rows, cols), torch.float32, "cpu", gen, scale=scale) * row * col
    return x.to(torch.bfloat16).to(device)


def _fp8_linear_inputs(p, dtype, device, gen):
    m, n, k = p["m"], p["n"], p["k"]
    fp8 = FP8_DTYPES[p["fp8"]]
    (xg, xb), (wg, wb) = GRANULARITIES[p["granularity"]]
    x_q, x_scale = quantize_fp8(_varied(m, k, device, gen, 1.0), xg, fp8, xb)
    w_q, w_scale = quantize_fp8(_varied(n, k, device, gen, k ** -0.5), wg, fp8, wb)
    bias = randn((n,), dtype, device, gen, scale=0.5) if p.get("bias") else None
    return x_q, x_scale, w_q, w_scale, bias, dtype


def fp8_needs(case: Case) -> Case:
    """``case`` as an engine shape only on platforms whose FP8 flavour is the case's (CUDA never sends e4m3fnuz)."""
    return dataclasses.replace(case, needs={"fp8": case.params["fp8"]})


def _draw(rng, budget):
    """The matmul regimes in every granularity and flavour; where the budget is an accelerator's, a block-scaled
    GEMM of 4096 x 4096 outputs (the prefill of an FP8 model's layer), the size large-GEMM kernels take."""
    cases = [fp8_needs(c) for c in matmul_cases(rng, budget, lambda m, n, k: {
        "m": m, "n": n, "k": k, "granularity": rng.choice(tuple(GRANULARITIES)),
        "fp8": rng.choice(("e4m3fn", "e4m3fnuz")), "bias": rng.random() < 0.3},
        align_n=128, ks=tuple(k for k in HIDDEN if k % 128 == 0))]
    k = min(4096, budget // (4096 * 4096)) // 128 * 128
    if k >= 128:
        cases.append(Case("draw_large_block", {"m": 4096, "n": 4096, "k": k, "granularity": "block", "fp8": "e4m3fn"},
                          engine_shape=True, needs={"fp8": "e4m3fn"}))
    return cases


fp8_linear = OpDef(
    name="fp8_linear",
    # Hopper's FP8 tensor cores accumulate in about 13 mantissa bits, not fp32: cuBLAS, Triton and Gluon FP8 GEMMs
    # measured 3e-4 to 4e-4 relative error on the H200 (K = 64 to 4096) where the fp32 reference made 5e-6.
    accumulation_roundoff=2.0 ** -10,
    schema=("(Tensor x_q, Tensor x_scale, Tensor w_q, Tensor w_scale, Tensor? bias, ScalarType out_dtype)"
            " -> Tensor"),
    reference=_fp8_linear_ref,
    fake=_fp8_linear_fake,
    make_inputs=_fp8_linear_inputs,
    draw=_draw,
    cases=[
        Case("tensor_e4m3fn", {"m": 4, "n": 48, "k": 64, "granularity": "tensor", "fp8": "e4m3fn",
                               "bias": True}),
        Case("tensor_e4m3fnuz", {"m": 3, "n": 40, "k": 96, "granularity": "tensor", "fp8": "e4m3fnuz"}),
        Case("token_channel_e4m3fn", {"m": 6, "n": 72, "k": 160, "granularity": "token_channel",
                                      "fp8": "e4m3fn", "bias": True}),
        Case("token_channel_e4m3fnuz", {"m": 1, "n": 32, "k": 48, "granularity": "token_channel",
                                        "fp8": "e4m3fnuz"}),
        Case("token_tensor_e4m3fn", {"m": 5, "n": 64, "k": 64, "granularity": "token_tensor",
                                     "fp8": "e4m3fn"}),
        Case("block_e4m3fn", {"m": 5, "n": 200, "k": 320, "granularity": "block", "fp8": "e4m3fn"}),
        Case("block_e4m3fnuz", {"m": 2, "n": 256, "k": 256, "granularity": "block", "fp8": "e4m3fnuz",
                                "bias": True}),
    ],
    # Outputs are O(1). fp32 leaves room for FP8 tensor-core accumulation, which keeps fewer than 23 bits: Hopper's
    # FP8 wgmma adds in about 14 (measured on an H200: one element of 9,900 off by 2.6e-3 at K = 400 under 2e-3).
    tolerances={torch.float32: Tolerance(5e-3, 5e-3), torch.bfloat16: Tolerance(1e-2, 1e-2)},
    doc=(
        "out [M, N] = (x_q.float() * x_scale) @ (w_q.float() * w_scale)^T (+ bias), fp32 accumulate, cast to "
        "out_dtype. x_q [M, K], w_q [N, K]: both float8_e4m3fn (max 448) or both float8_e4m3fnuz (max 240). "
        "Scales fp32; their shapes pick the granularity: x_scale [] / [1] (per-tensor), [M, 1] (per-token), "
        "[M, ceil(K/128)] (1x128 groups); w_scale [] / [1] (per-tensor), [N, 1] (per-channel), "
        "[ceil(N/128), ceil(K/128)] (128x128 blocks). bias [N] (any float dtype, added in fp32) or None. "
        "The dtype axis is out_dtype."
    ),
)
