"""GGUF Q4_0 / Q4_1 / Q8_0 in Triton: ``gguf_dequantize`` and ``gguf_linear`` on the raw GGUF bytes.

Nothing is repacked: the op takes the raw bytes [N, row_bytes] on every call. The blocks (18, 20 or 34 bytes) are only
2-byte aligned, so no kernel issues wide loads into them: the dequantize and tensor-core kernels read bytes and
assemble the fp16 scale (and Q4_1's minimum) from two of them (``lo | hi << 8`` -> uint16 -> bitcast fp16); the GEMV
reads the rows as 16-bit words (a block is 9, 10 or 17 of them), the scale being one of them.

* ``gguf_dequantize``: fp32 ``q * d`` (``+ m``) exactly as the reference (launched with ``enable_fp_fusion=False``,
  so Q4_1 is a multiply then an add, never an FMA), then one rounding to nearest even to the output dtype (bf16 in
  integer arithmetic): bit-exact.
* ``gguf_linear``, M <= GEMV_MAX_M: a GEMV on CUDA cores. Blocks spread across the lanes, each lane holds whole blocks
  of BLOCK_N rows, so every x value is loaded once per program and used for all of them; quant codes become fp32 through
  the exponent trick (``code | 0x4B000000`` is 2**23 + code, exact, one subtraction away from the value: no
  int-to-float conversions); block dot products are scaled by d once per block. When N alone gives fewer than
  PROGRAMS_PER_SM programs per SM, K is split and fp32 partials are summed.
* ``gguf_linear``, larger M: tensor cores, "swap AB": the dequantized weight tile [BLOCK_N, K step] (rounded to
  x's dtype, which the op's bf16 tolerance allows) is the left operand and x^T the right one, fp32 accumulation.
  fp32 x uses ``input_precision="ieee"`` (no tf32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.core.ops.gguf_quant import (
    ALL_QTYPES,
    BLOCK,
    GGUF_QTYPES,
    Q8_0,
    gguf_dequantize,
    gguf_linear,
)
from engine.platforms.triton_kernels import interpreting, sm_count
from engine.platforms.triton_kernels.gguf_values import f16_at as _f16_at
from engine.platforms.triton_kernels.nvfp4 import gemv_plan as nvfp4_gemv_plan
from engine.platforms.triton_kernels.nvfp4 import split_plan as nvfp4_split_plan
from engine.platforms.triton_kernels.nvfp4 import splitk_reduce

X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PRIORITY = 10

# Rows of x up to which the CUDA-core GEMV runs (each further row adds ~1.5 instructions per weight value); above, the
# tensor-core kernel. sm_90 SASS of the GEMV loop at M = 1 (read on a CPU host, not timed): ~5.9 instructions per
# weight value for Q4_0, ~6.6 for Q8_0, ~7.3 for Q4_1.
GEMV_MAX_M = 2
# GEMV tile at M = 1 (H200 sweep, 2026-12-01, 4096x14336: 8 x 128 took 45 / 89 us for Q4_0 / Q8_0, 2 x 64 takes
# 32 / 46 us): rows of W per program, GGUF blocks (of 32 values) per loop step.
GEMV_BLOCK_N = 2
GEMV_BLOCK_B = 64
GEMV_WARPS = 4
MIN_SPLIT_BLOCK_B = 32  # the smallest K step split-K shrinks to
DOT_BLOCK_N = 128
DOT_BLOCK_B = 4  # GGUF blocks (of 32) per K step of the tensor-core kernel
DOT_WARPS = 8
DOT_STAGES = 3
# Tensor-core programs wanted per SM before split-K stops adding splits: at 64 rows of x the 8B shapes made 32 programs
# (N / 128) for 132 SMs, and a GPTQ model decoded 64 requests at 0.29x bf16 on an H100 (session 19)
DOT_PROGRAMS_PER_SM = 4
DEQUANT_BLOCK_N = 16
DEQUANT_BLOCK_B = 16
PROGRAMS_PER_SM = 8  # split K when N / BLOCK_N programs would give fewer per SM: 4096 x 14336 Q4_0 ran 512
# programs of 3.5 steps (~1.3 waves at ~3 resident per SM) at 18% of the copy bandwidth; 2 splits -> 1024
INTERPRETER_SMS = 4  # a small fake SM count under the interpreter, so the split-K path runs in CI


@triton.jit
def _round_to(v, dt: tl.constexpr):
    """fp32 ``v`` rounded to ``dt``, to nearest even. bf16 is rounded in integer arithmetic (the same on every
    backend: the Triton interpreter truncates fp32 -> bf16, and its explicit "rtne" mode mishandles ties/carries)."""
    if dt == tl.bfloat16:
        bits = v.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # finite inputs: a carry correctly bumps the exponent
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(dt)


@triton.jit
def _dequant_kernel(raw_ptr, out_ptr, N, NB, stride_r, stride_o, QTYPE: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    blks = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    mask2 = (rows[:, None] < N) & (blks[None, :] < NB)
    mask3 = mask2[:, :, None]
    rows64 = rows.to(tl.int64)
    base = raw_ptr + rows64[:, None] * stride_r + blks[None, :] * BLOCK_BYTES  # [BN, BB] -> each block's first byte
    d = _f16_at(base, mask2)[:, :, None]
    outp = out_ptr + rows64[:, None, None] * stride_o + blks[None, :, None] * 32
    dt = out_ptr.dtype.element_ty
    if QTYPE == 8:
        j = tl.arange(0, 32)
        q = tl.load(base[:, :, None] + 2 + j[None, None, :], mask=mask3, other=0).to(tl.int8, bitcast=True)
        tl.store(outp + j[None, None, :], _round_to(q.to(tl.float32) * d, dt), mask=mask3)
    else:
        j = tl.arange(0, 16)
        qb = tl.load(base[:, :, None] + (BLOCK_BYTES - 16) + j[None, None, :], mask=mask3, other=0).to(tl.int32)
        lo = (qb & 15).to(tl.float32)
        hi = (qb >> 4).to(tl.float32)
        if QTYPE == 2:
            wl = (lo - 8.0) * d
            wh = (hi - 8.0) * d
        else:
            m = _f16_at(base + 2, mask2)[:, :, None]
            wl = lo * d + m  # no FMA: the launch turns fp fusion off
            wh = hi * d + m
        tl.store(outp + j[None, None, :], _round_to(wl, dt), mask=mask3)
        tl.store(outp + 16 + j[None, None, :], _round_to(wh, dt), mask=mask3)


def dequantize(raw: torch.Tensor, qtype: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """gguf_dequantize: raw [N, row_bytes] -> [N, cols] in ``dtype``."""
    if raw.stride(-1) != 1:
        raw = raw.contiguous()
    n, nb = raw.shape[0], cols // BLOCK
    out = torch.empty((n, cols), dtype=dtype, device=raw.device)
    if n and nb:
        grid = (triton.cdiv(n, DEQUANT_BLOCK_N), triton.cdiv(nb, DEQUANT_BLOCK_B))
        _dequant_kernel[grid](raw, out, n, nb, raw.stride(0), out.stride(0), QTYPE=qtype,
                              BLOCK_BYTES=GGUF_QTYPES[qtype][1], BLOCK_N=DEQUANT_BLOCK_N, BLOCK_B=DEQUANT_BLOCK_B,
                              num_warps=4, enable_fp_fusion=False)
    return out


@triton.jit
def _q4_values(qb, d, base, mask2, QTYPE: tl.constexpr):
    """Dequantized fp32 values of the low and high nibbles of int32 bytes ``qb`` [BN, BB, 16] (d: [BN, BB])."""
    lo = ((qb & 0x0F) | 0x4B000000).to(tl.float32, bitcast=True)  # 2**23 + q
    hi = ((qb & 0xF0) | 0x4B000000).to(tl.float32, bitcast=True)  # 2**23 + 16 q
    d3 = d[:, :, None]
    if QTYPE == 2:
        wl = (lo - 8388616.0) * d3  # (q - 8) d
        wh = (hi - 8388736.0) * (d3 * 0.0625)  # 16 (q - 8) * d / 16
    else:
        m = _f16_at(base + 2, mask2)[:, :, None]
        wl = (lo - 8388608.0) * d3 + m  # q d + m
        wh = (hi - 8388608.0) * (d3 * 0.0625) + m
    return wl, wh


@triton.jit
def _code(h, SHIFT: tl.constexpr, MASK: tl.constexpr):
    """fp32 ``2**23 + ((h >> SHIFT) & MASK)``, exactly (the exponent trick: no int-to-float conversion)."""
    return (((h >> SHIFT) & MASK) | 0x4B000000).to(tl.float32, bitcast=True)


@triton.jit
def _gemv_row(x_row, blks, bmask, j, h, d, m_ptrs, m2, QTYPE: tl.constexpr):
    """One row of x against the 16-bit quant words h [BN, J, BB] of BB blocks: [BN, BB] block dot products."""
    xo = blks[None, None, :] * 32 + 2 * j[None, :, None]  # word j of a block holds elements 2j, 2j+1 (and +16, +17)
    xm = bmask[None, None, :]
    x0 = tl.load(x_row + xo, mask=xm, other=0.0).to(tl.float32)
    x1 = tl.load(x_row + xo + 1, mask=xm, other=0.0).to(tl.float32)
    if QTYPE == 8:  # int8 q: (byte ^ 0x80) = q + 128
        p = (_code(h ^ 0x80, 0, 0xFF) - 8388736.0) * x0 + (_code(h ^ 0x8000, 8, 0xFF) - 8388736.0) * x1
        return tl.sum(p, axis=1) * d
    else:
        x2 = tl.load(x_row + xo + 16, mask=xm, other=0.0).to(tl.float32)
        x3 = tl.load(x_row + xo + 17, mask=xm, other=0.0).to(tl.float32)
        if QTYPE == 2:
            c = 8388616.0  # 2**23 + 8: q - 8
        else:
            c = 8388608.0  # 2**23: q
        p = ((_code(h, 0, 0xF) - c) * x0 + (_code(h, 8, 0xF) - c) * x1 + (_code(h, 4, 0xF) - c) * x2
             + (_code(h, 12, 0xF) - c) * x3)
        r = tl.sum(p, axis=1) * d
        if QTYPE == 3:  # sum(q d + m) x = d sum(q x) + m sum(x)
            r += _f16w(m_ptrs, m2) * tl.sum(x0 + x1 + x2 + x3, axis=1)
        return r


@triton.jit
def _f16w(p, mask):
    """fp32 value of the fp16 at int16 pointers ``p``."""
    return tl.load(p, mask=mask, other=0).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _gemv_store(acc, m, rows, rmask, M, N, pid_k, out_ptr, part_ptr, stride_om, SPLIT: tl.constexpr):
    res = tl.sum(acc, axis=1)
    mask = rmask & (rows * 0 + m < M)
    if SPLIT:
        tl.store(part_ptr + (pid_k * M + m).to(tl.int64) * N + rows, res, mask=mask)
    else:
        tl.store(out_ptr + m * stride_om + rows, res.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, part_ptr, M, N, NB, stride_xm, stride_wn, stride_om, blocks_per_split,
                 QTYPE: tl.constexpr, BLOCK_WORDS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    """CUDA-core GEMV for up to 4 rows of x on the raw rows viewed as int16 words (a block is 9, 10 or 17 words: d,
    [m,] then the quants, all 2-byte aligned). Tile [BLOCK_N rows, J words, BLOCK_B blocks]: blocks across the lanes,
    a block's words and the rows inside each thread (the words are visited in a permuted order so that no dimension
    looks contiguous to the compiler, which then keeps that layout for the x loads too: no layout conversions), block
    dot products in fp32, scaled once per block. With SPLIT, fp32 partials go to part_ptr [splits, M, N]."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    bb = tl.arange(0, BLOCK_B)
    J: tl.constexpr = 16 if QTYPE == 8 else 8
    j = (tl.arange(0, J) * 5) % J  # a permutation of 0..J-1
    rmask = rows < N
    d_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn  # [BN, 1]
    q_rows = d_rows[:, :, None] + (BLOCK_WORDS - J) + j[None, :, None]  # [BN, J, 1]
    b_start = pid_k * blocks_per_split
    b_end = tl.minimum(b_start + blocks_per_split, NB)
    acc0 = tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.float32)
    for b0 in range(b_start, b_end, BLOCK_B):
        blks = b0 + bb
        bmask = blks < b_end
        m2 = rmask[:, None] & bmask[None, :]
        h = tl.load(q_rows + blks[None, None, :] * BLOCK_WORDS, mask=m2[:, None, :], other=0)
        h = h.to(tl.uint16, bitcast=True).to(tl.int32)
        dp = d_rows + blks[None, :] * BLOCK_WORDS
        d = _f16w(dp, m2)
        acc0 += _gemv_row(x_ptr, blks, bmask, j, h, d, dp + 1, m2, QTYPE)
        if BLOCK_M > 1:
            acc1 += _gemv_row(x_ptr + stride_xm, blks, bmask & (blks * 0 + M > 1), j, h, d, dp + 1, m2, QTYPE)
        if BLOCK_M > 2:
            acc2 += _gemv_row(x_ptr + 2 * stride_xm, blks, bmask & (blks * 0 + M > 2), j, h, d, dp + 1, m2, QTYPE)
            acc3 += _gemv_row(x_ptr + 3 * stride_xm, blks, bmask & (blks * 0 + M > 3), j, h, d, dp + 1, m2, QTYPE)
    _gemv_store(acc0, 0, rows, rmask, M, N, pid_k, out_ptr, part_ptr, stride_om, SPLIT)
    if BLOCK_M > 1:
        _gemv_store(acc1, 1, rows, rmask, M, N, pid_k, out_ptr, part_ptr, stride_om, SPLIT)
    if BLOCK_M > 2:
        _gemv_store(acc2, 2, rows, rmask, M, N, pid_k, out_ptr, part_ptr, stride_om, SPLIT)
        _gemv_store(acc3, 3, rows, rmask, M, N, pid_k, out_ptr, part_ptr, stride_om, SPLIT)


@triton.jit
def _dot_kernel(x_ptr, w_ptr, out_ptr, part_ptr, M, N, NB, stride_xm, stride_wn, stride_om, blocks_per_split,
                QTYPE: tl.constexpr, BLOCK_BYTES: tl.constexpr, INTERPRET: tl.constexpr, SPLIT: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    """Tensor cores, swap AB, over GGUF blocks pid_k * blocks_per_split ..; with SPLIT, fp32 partials go to part_ptr
    [splits, M, N] (summed by one reduction launch)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    b_start = pid_k * blocks_per_split
    b_end = tl.minimum(b_start + blocks_per_split, NB)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    bb = tl.arange(0, BLOCK_B)
    rmask = rows < N
    mmask = ms < M
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    x_cols = x_ptr + ms.to(tl.int64)[None, :] * stride_xm  # [1, BM]
    dt = x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for b0 in range(b_start, b_end, BLOCK_B):
        blks = b0 + bb
        bmask = blks < b_end
        mask2 = rmask[:, None] & bmask[None, :]
        mask3 = mask2[:, :, None]
        base = w_rows + blks[None, :] * BLOCK_BYTES
        d = _f16_at(base, mask2)
        if QTYPE == 8:
            j = tl.arange(0, 32)
            u = tl.load(base[:, :, None] + 2 + j[None, None, :], mask=mask3, other=0).to(tl.int32)
            q = ((u ^ 0x80) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0  # int8 q, exactly
            w = tl.reshape(q * d[:, :, None], [BLOCK_N, BLOCK_B * 32]).to(dt)
            c = tl.arange(0, BLOCK_B * 32)
            xmask = ((b0 * 32 + c) < b_end * 32)[:, None] & mmask[None, :]
            xt = tl.load(x_cols + b0 * 32 + c[:, None], mask=xmask, other=0.0)  # x^T [BB*32, BM]
            if INTERPRET:  # the interpreter's bf16 dot is wrong; fp32 tiles give the right answer
                acc = tl.dot(w.to(tl.float32), xt.to(tl.float32), acc)
            elif dt == tl.float32:
                acc = tl.dot(w, xt, acc, input_precision="ieee")
            else:
                acc = tl.dot(w, xt, acc)
        else:
            j = tl.arange(0, 16)
            qb = tl.load(base[:, :, None] + (BLOCK_BYTES - 16) + j[None, None, :], mask=mask3, other=0).to(tl.int32)
            wl, wh = _q4_values(qb, d, base, mask2, QTYPE)
            wl = tl.reshape(wl, [BLOCK_N, BLOCK_B * 16]).to(dt)
            wh = tl.reshape(wh, [BLOCK_N, BLOCK_B * 16]).to(dt)
            c = tl.arange(0, BLOCK_B * 16)  # low-nibble element c is column 32 * (c // 16) + c % 16 of the step
            xmask = ((b0 * 16 + c) < b_end * 16)[:, None] & mmask[None, :]
            xp = x_cols + b0 * 32 + (32 * (c // 16) + c % 16)[:, None]
            xl = tl.load(xp, mask=xmask, other=0.0)
            xh = tl.load(xp + 16, mask=xmask, other=0.0)
            if INTERPRET:
                acc = tl.dot(wl.to(tl.float32), xl.to(tl.float32), acc)
                acc = tl.dot(wh.to(tl.float32), xh.to(tl.float32), acc)
            elif dt == tl.float32:
                acc = tl.dot(wl, xl, acc, input_precision="ieee")
                acc = tl.dot(wh, xh, acc, input_precision="ieee")
            else:
                acc = tl.dot(wl, xl, acc)
                acc = tl.dot(wh, xh, acc)
    omask = rmask[:, None] & mmask[None, :]
    if SPLIT:
        tl.store(part_ptr + (pid_k * M + ms.to(tl.int64))[None, :] * N + rows[:, None], acc, mask=omask)
    else:
        tl.store(out_ptr + ms.to(tl.int64)[None, :] * stride_om + rows[:, None], acc.to(out_ptr.dtype.element_ty),
                 mask=omask)


def gemv_plan(n: int, nblocks: int, sms: int, block_n: int = None, block_b: int = None, splits: int | None = None):
    """(block_b, splits, blocks_per_split) for the GGUF GEMV: the NVFP4 GEMV's plan with this module's tiles."""
    return nvfp4_gemv_plan(n, nblocks, sms, block_n or GEMV_BLOCK_N, block_b or GEMV_BLOCK_B, PROGRAMS_PER_SM,
                           MIN_SPLIT_BLOCK_B, splits)


def gemv_block_n(m: int) -> int:
    """GEMV rows of W per program for M rows of x: fewer as M grows (registers: 8 rows spill at M = 2)."""
    return GEMV_BLOCK_N if m == 1 else 4 if m == 2 else 2


def dot_config(m: int, dtype: torch.dtype, qtype: int) -> dict:
    """Tensor-core tile for M rows of x; fp32 x (an IEEE fp32 dot) takes a smaller one (the big one spills)."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    if dtype == torch.float32:
        return dict(block_m=min(block_m, 32), block_n=64, block_b=2 if qtype == Q8_0 else 4, num_warps=8,
                    num_stages=2)
    return dict(block_m=block_m, block_n=DOT_BLOCK_N, block_b=2 if qtype == Q8_0 or block_m == 128 else DOT_BLOCK_B,
                num_warps=DOT_WARPS, num_stages=DOT_STAGES)


def linear(x: torch.Tensor, raw: torch.Tensor, qtype: int, cols: int, *, kernel: str | None = None, config=None):
    """gguf_linear: x [..., cols] @ dequant(raw)^T -> [..., N] in x.dtype. ``kernel`` ("gemv" or "dot") and
    ``config`` (block sizes, warps, splits) override the heuristics; the benchmark uses them to tune."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if raw.stride(-1) != 1:
        raw = raw.contiguous()
    m, n, nb = x2.shape[0], raw.shape[0], cols // BLOCK
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out.view(*lead, n)
    block_bytes = GGUF_QTYPES[qtype][1]
    cfg = dict(config or {})
    if kernel is None:
        kernel = "gemv" if m <= GEMV_MAX_M else "dot"
    if kernel == "gemv":
        if m > 4:
            raise ValueError(f"the GEMV kernel takes at most 4 rows of x, got {m}")
        if raw.data_ptr() % 2:  # the kernel reads 16-bit words; rows are an even number of bytes
            raw = raw.clone()
        words = raw.view(torch.int16)
        block_n = cfg.get("block_n", gemv_block_n(m))
        block_b, splits, per_split = gemv_plan(n, nb, cfg.get("sms", sm_count(x.device, INTERPRETER_SMS)), block_n,
                                               cfg.get("block_b", GEMV_BLOCK_B), splits=cfg.get("splits"))
        part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1 else out
        _gemv_kernel[(triton.cdiv(n, block_n), splits)](
            x2, words, out, part, m, n, nb, x2.stride(0), words.stride(0), out.stride(0), per_split, QTYPE=qtype,
            BLOCK_WORDS=block_bytes // 2, SPLIT=splits > 1, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n,
            BLOCK_B=block_b, num_warps=cfg.get("num_warps", GEMV_WARPS), num_stages=cfg.get("num_stages", 2))
        if splits > 1:
            splitk_reduce(part, None, out)  # one launch, deterministic (split order)
        return out.view(*lead, n)
    dc = dot_config(m, x.dtype, qtype)
    dc.update(cfg)
    programs = triton.cdiv(n, dc["block_n"]) * triton.cdiv(m, dc["block_m"])
    steps = triton.cdiv(nb, dc["block_b"])
    splits, per_split = nvfp4_split_plan(programs, steps, dc["block_b"], dc.get(
        "sms", sm_count(x.device, INTERPRETER_SMS)), DOT_PROGRAMS_PER_SM, dc.get("splits"))
    part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    _dot_kernel[(triton.cdiv(n, dc["block_n"]), triton.cdiv(m, dc["block_m"]), splits)](
        x2, raw, out, part, m, n, nb, x2.stride(0), raw.stride(0), out.stride(0), per_split, QTYPE=qtype,
        BLOCK_BYTES=block_bytes, INTERPRET=interpreting(), SPLIT=splits > 1, BLOCK_M=dc["block_m"],
        BLOCK_N=dc["block_n"], BLOCK_B=dc["block_b"], num_warps=dc["num_warps"], num_stages=dc["num_stages"])
    if splits > 1:
        splitk_reduce(part, None, out)
    return out.view(*lead, n)


def _raw_verdict(device_type: str, raw, qtype, cols, qtypes=GGUF_QTYPES):
    if not isinstance(raw, torch.Tensor) or raw.device.type != device_type:
        return f"raw must be a tensor on {device_type}"
    if qtype not in qtypes:
        return f"qtype {qtype} not supported ({', '.join(f'{ALL_QTYPES[q][0]}={q}' for q in qtypes)})"
    if raw.dtype != torch.uint8 or raw.dim() != 2:
        return "raw must be a 2-D uint8 tensor"
    name, block, size = ALL_QTYPES[qtype]
    if cols <= 0 or cols % block or raw.shape[1] != cols // block * size:
        return f"raw shape {list(raw.shape)} does not hold {cols} columns of {name}"
    if not raw.is_contiguous():
        return "raw must be contiguous"
    return True


def supports_dequantize(device_type: str, qtypes=GGUF_QTYPES):
    """The supports of a gguf_dequantize kernel for ``qtypes`` on ``device_type``."""
    def supports(raw, qtype, cols, dtype):
        if dtype not in X_DTYPES:
            return f"output dtype {dtype} not supported (fp32, bf16, fp16)"
        return _raw_verdict(device_type, raw, qtype, cols, qtypes)

    return supports


def supports_linear(device_type: str, qtypes=GGUF_QTYPES):
    """The supports of a gguf_linear kernel for ``qtypes`` on ``device_type``."""
    def supports(x, raw, qtype, cols):
        if not isinstance(x, torch.Tensor) or x.device.type != device_type:
            return f"x must be a tensor on {device_type}"
        if x.dtype not in X_DTYPES:
            return f"x dtype {x.dtype} not supported (fp32, bf16, fp16)"
        if x.dim() < 1 or x.shape[-1] != cols:
            return f"x must be [..., {cols}]"
        ok = _raw_verdict(device_type, raw, qtype, cols, qtypes)
        if ok is True and raw.device != x.device:
            return "x and raw must be on the same device"
        return ok

    return supports


def register(registry, device_type: str, capability=None) -> None:
    registry.register(gguf_dequantize, dequantize, name="triton_gguf_dequantize",
                      supports=supports_dequantize(device_type), priority=PRIORITY,
                      note="Triton, reads raw GGUF bytes; bit-exact with the reference")
    registry.register(gguf_linear, linear, name="triton_gguf_linear", supports=supports_linear(device_type),
                      priority=PRIORITY,
                      note=f"Triton on raw GGUF bytes: CUDA-core GEMV for M <= {GEMV_MAX_M} (split-K when N is "
                           f"small), tensor cores (swap AB, weight rounded to x.dtype) above")
