"""GGUF K-quants (Q4_K, Q5_K, Q6_K: super-blocks of 256 elements, layouts in engine/core/ops/gguf_kquants.py) in
Triton: ``gguf_dequantize`` and ``gguf_linear`` on the raw bytes, kept as they are in memory.

A program decodes one super-block of BLOCK_N rows at a time into an fp32 tile [BLOCK_N, 256]: each element's quant
bits, its sub-block's 6-bit scale and minimum (Q4_K, Q5_K) or int8 scale (Q6_K) are byte loads at offsets computed
from the element's index (the rows are only 2-byte aligned, as in gguf_linear.py; the bytes a program re-reads for
the scales stay in L1). Values are the reference's: (d * sc) * q - (dmin * m) and (d * sc) * (q - 32) in fp32, the
dequantize launched without FMA contraction, then rounded once to the output dtype.

``gguf_linear`` runs on tensor cores at every M (x padded to 16 rows): the decoded tile, rounded to x's dtype as the
op's bf16 tolerance allows (fp32 x: ``input_precision="ieee"``), times x^T [256, BLOCK_M], fp32 accumulation. Not
tuned: no split-K for small N, no CUDA-core GEMV at M = 1 (gguf_linear.py has both for the 32-element types).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.core.ops.gguf_kquants import K_QTYPES, QK_K
from engine.core.ops.gguf_quant import gguf_dequantize, gguf_linear
from engine.platforms.triton_kernels import interpreting
from engine.platforms.triton_kernels.gguf_linear import _round_to, supports_dequantize, supports_linear
from engine.platforms.triton_kernels.gguf_values import kquant_values

PRIORITY = 10
BLOCK_N = 32
DEQUANT_BLOCK_N = 16


@triton.jit
def _kquant_tile(rows_ptr, rmask, sb, QTYPE: tl.constexpr, BYTES: tl.constexpr):
    """fp32 values [BLOCK_N, 256] of super-block ``sb`` of the rows starting at ``rows_ptr`` [BLOCK_N, 1]."""
    return kquant_values(rows_ptr, rmask, sb, tl.arange(0, 256)[None, :], QTYPE, BYTES)


@triton.jit
def _dequant_kernel(raw_ptr, out_ptr, N, stride_r, stride_o, QTYPE: tl.constexpr, BYTES: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    sb = tl.program_id(1)
    rmask = (rows < N)[:, None]
    rows64 = rows.to(tl.int64)[:, None]
    w = _kquant_tile(raw_ptr + rows64 * stride_r, rmask, sb, QTYPE, BYTES)
    e = tl.arange(0, 256)[None, :]
    tl.store(out_ptr + rows64 * stride_o + sb * 256 + e, _round_to(w, out_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def _linear_kernel(x_ptr, w_ptr, out_ptr, M, N, NB, stride_xm, stride_wn, stride_om, QTYPE: tl.constexpr,
                   BYTES: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < N
    mmask = ms < M
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    x_cols = x_ptr + ms.to(tl.int64)[None, :] * stride_xm  # [1, BM]
    c = tl.arange(0, 256)[:, None]
    dt = x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for sb in range(0, NB):
        w = _kquant_tile(w_rows, rmask[:, None], sb, QTYPE, BYTES)
        xt = tl.load(x_cols + sb * 256 + c, mask=mmask[None, :], other=0.0)  # x^T [256, BM]
        if INTERPRET:  # the interpreter's bf16 dot is wrong; fp32 tiles give the right answer
            acc = tl.dot(w.to(dt).to(tl.float32), xt.to(tl.float32), acc)
        elif dt == tl.float32:
            acc = tl.dot(w, xt, acc, input_precision="ieee")
        else:
            acc = tl.dot(w.to(dt), xt, acc)
    tl.store(out_ptr + ms.to(tl.int64)[None, :] * stride_om + rows[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=rmask[:, None] & mmask[None, :])


def dequantize(raw: torch.Tensor, qtype: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """gguf_dequantize for the K-quants: raw [N, row_bytes] -> [N, cols] in ``dtype``."""
    if raw.stride(-1) != 1:
        raw = raw.contiguous()
    n, nb = raw.shape[0], cols // QK_K
    out = torch.empty((n, cols), dtype=dtype, device=raw.device)
    if n and nb:
        _dequant_kernel[(triton.cdiv(n, DEQUANT_BLOCK_N), nb)](
            raw, out, n, raw.stride(0), out.stride(0), QTYPE=qtype, BYTES=K_QTYPES[qtype][1],
            BLOCK_N=DEQUANT_BLOCK_N, num_warps=4, enable_fp_fusion=False)
    return out


def linear(x: torch.Tensor, raw: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    """gguf_linear for the K-quants: x [..., cols] @ dequant(raw)^T -> [..., N] in x.dtype."""
    lead, n = x.shape[:-1], raw.shape[0]
    x2 = x.reshape(-1, cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if raw.stride(-1) != 1:
        raw = raw.contiguous()
    m = x2.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m and n:
        block_m = min(64, max(16, triton.next_power_of_2(m)))
        _linear_kernel[(triton.cdiv(n, BLOCK_N), triton.cdiv(m, block_m))](
            x2, raw, out, m, n, cols // QK_K, x2.stride(0), raw.stride(0), out.stride(0), QTYPE=qtype,
            BYTES=K_QTYPES[qtype][1], INTERPRET=interpreting(), BLOCK_M=block_m, BLOCK_N=BLOCK_N, num_warps=4,
            num_stages=2)
    return out.view(*lead, n)


def register(registry, device_type: str, capability=None) -> None:
    registry.register(gguf_dequantize, dequantize, name="triton_gguf_kquant_dequantize",
                      supports=supports_dequantize(device_type, K_QTYPES), priority=PRIORITY,
                      note="Triton, Q4_K/Q5_K/Q6_K super-blocks from the raw bytes; bit-exact with the reference")
    registry.register(gguf_linear, linear, name="triton_gguf_kquant_linear",
                      supports=supports_linear(device_type, K_QTYPES),
                      priority=PRIORITY,
                      note="Triton, Q4_K/Q5_K/Q6_K decoded per super-block into tensor-core tiles (weight rounded "
                           "to x.dtype); not tuned")
