"""Fused mixture-of-experts in Triton (``fused_moe``: fp32 / bf16 / fp16; ``fused_moe_fp8``: W8A8 FP8), in the
style of vLLM's: route, sort the (token, slot) pairs by expert into BLOCK_M-padded groups, then two grouped GEMMs.

Pipeline (every step on the device; no value is read back, so a call is CUDA-graph capturable):

1. ``_route_kernel``: fp32 softmax over the experts, top-k by repeated arg-max (the lowest index wins a tie),
   optional renormalisation; writes weights fp32 [T, k] and expert ids int32 [T, k].
2. ``_align_kernel`` (one program): counts pairs per expert, pads each count to a multiple of BLOCK_M and
   writes ``sorted_ids`` (pair ids ``t * k + j`` grouped by expert, tokens ascending, padding slots hold the
   sentinel ``T * k``), ``block_expert`` (the expert of each BLOCK_M block) and ``num_padded`` (the padded total)
   into buffers of the worst-case size ``T*k + min(E, T*k) * (BLOCK_M - 1)`` (rounded up to BLOCK_M), which
   depends on shapes only. GEMM programs past ``num_padded`` return at once.
3. ``_moe_gemm_kernel`` (GATED): ``h = silu(x @ w13[e, :I]^T) * (x @ w13[e, I:]^T)``. One B tile holds
   BLOCK_N/2 gate rows and the matching BLOCK_N/2 up rows, so a single ``tl.dot`` of width BLOCK_N feeds both,
   and the epilogue splits the accumulator in halves (reshape/permute/split) to apply SiLU-and-mul: h is written
   once, [T*k, I] in x's dtype, rows indexed by pair id.
4. ``_moe_gemm_kernel`` (MUL_WEIGHT): ``y = (h @ w2[e]^T) * routing weight``, fp32 [SPLIT_K, T*k, hidden]; small
   batches split K across programs to fill the GPU (the partial sums are added by the reduction).
5. ``_reduce_kernel``: ``out[t] = sum over splits and slots of y``, cast to x's dtype. With top_k == 1 and no
   split, step 4 writes ``out`` directly.

FP8 (``fused_moe_fp8``): ``_quant_rows_kernel`` quantizes x per token (scale = max(amax, 1e-12) / fp8_max) before
step 3 and h per row before step 4; the GEMMs multiply FP8 tiles and apply the activation row scale and the
weight's per-expert or per-channel scale in the epilogue. Sums are promoted to fp32 every K tile
(``max_num_imprecise_acc=BLOCK_K``; sm_90's FP8 tensor cores otherwise sum in reduced precision over the whole K
loop); ``MoeConfig(fp8_fast_accum=True)`` skips that, as vLLM's kernel does. Weights in float8_e4m3fn run on NVIDIA
GPUs of compute capability >= 8.9 and gfx95x; float8_e4m3fnuz on gfx94x (MI300).

Tile sizes are chosen on the host from shapes only (tokens per expert, dtype): small batches use narrow BLOCK_M
(the weights are read once and the GEMMs are bandwidth-bound), large ones 128 x 256 tiles (after vLLM's tuned
H200 tables for Mixtral shapes; checked by compiling for sm_90 only: no spills, shared memory within 192 KiB).

Under the Triton interpreter (CI on CPU) 16-bit and FP8 tiles are upcast to fp32 before ``tl.dot`` (its bf16 dot
returns garbage, FACTS.md); on a GPU they go to the tensor cores as they are, and fp32 inputs use
``input_precision="ieee"``. The interpreter's fp32 -> bf16 cast truncates and its fp32 -> fp8 cast loses the carry
when the mantissa rounds up (124.3 -> 64 in e4m3): under it the kernels round to nearest-even themselves first
(``_round_bf16``, ``fp8_grid.round_to_fp8_grid``), so CI sees the GPU's roundings. e4m3fnuz is always rounded first:
it has no -0, and the rounding gives +0 where a backend's cast might give the NaN code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from engine.core.ops.fp8 import fp8_max
from engine.core.ops.gguf_quant import ALL_QTYPES
from engine.core.ops.moe import fused_moe, kernel_shape_problem
from engine.core.ops.moe_fp8 import block_scaled, fused_moe_fp8, is_block_scale

from . import interpreting, sm_count
from .fp4_values import nvfp4_values
from .fp8_grid import fp8_grid_params, round_to_fp8_grid
from .gguf_values import gguf_values

PRIORITY = 10
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_MAX_EXPERTS = 1024  # the align kernel holds one counter per expert in a single program
_MAX_TOP_K = 64
_INTERPRETER_SMS = 4  # a stand-in SM count under the interpreter (no device to ask)
_MIN_AMAX = 1e-12  # as core/ops/fp8.py
NVFP4 = -1  # _moe_gemm_kernel's B_QTYPE for NVFP4 weights (GGUF types are positive)
BLOCK_SCALE_K = 128  # the K width of a block scale (core/ops/moe_fp8.py)


# ----------------------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, T, E, stride_lt, stride_le,
                  TOP_K: tl.constexpr, RENORM: tl.constexpr, BLOCK_T: tl.constexpr, E_PAD: tl.constexpr,
                  K_PAD: tl.constexpr):
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_e = tl.arange(0, E_PAD)
    t_ok = offs_t < T
    e_ok = offs_e < E
    logits = tl.load(logits_ptr + offs_t.to(tl.int64)[:, None] * stride_lt + offs_e[None, :] * stride_le,
                     mask=t_ok[:, None] & e_ok[None, :], other=float("-inf")).to(tl.float32)
    row_max = tl.max(logits, axis=1)
    row_max = tl.where(t_ok, row_max, 0.0)
    p = tl.exp(logits - row_max[:, None])
    p = tl.where(e_ok[None, :], p, 0.0)
    p = p / tl.where(t_ok, tl.sum(p, axis=1), 1.0)[:, None]
    p = tl.where(e_ok[None, :], p, -1.0)  # padding experts are never picked
    offs_k = tl.arange(0, K_PAD)
    sel_w = tl.zeros((BLOCK_T, K_PAD), dtype=tl.float32)
    sel_i = tl.zeros((BLOCK_T, K_PAD), dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, axis=1)
        idx = tl.min(tl.where(p == best[:, None], offs_e[None, :], E_PAD), axis=1)
        sel_w = tl.where(offs_k[None, :] == j, best[:, None], sel_w)
        sel_i = tl.where(offs_k[None, :] == j, idx[:, None], sel_i)
        p = tl.where(offs_e[None, :] == idx[:, None], -2.0, p)
    if RENORM:
        total = tl.sum(tl.where(offs_k[None, :] < TOP_K, sel_w, 0.0), axis=1)
        sel_w = sel_w / tl.where(t_ok, total, 1.0)[:, None]
    out_offs = offs_t.to(tl.int64)[:, None] * TOP_K + offs_k[None, :]
    out_mask = t_ok[:, None] & (offs_k[None, :] < TOP_K)
    tl.store(weights_ptr + out_offs, sel_w, mask=out_mask)
    tl.store(ids_ptr + out_offs, sel_i, mask=out_mask)


@triton.jit
def _align_kernel(ids_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr, num_pairs, max_padded,
                  BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr):
    """One program. Pass 1 counts pairs per expert; pass 2 scatters each pair to its expert's padded range
    (rank within the expert = pairs of that expert before it, so tokens stay ascending); pass 3 writes the
    sentinel into padding slots and the expert of every block (-1 past the padded total)."""
    offs_e = tl.arange(0, E_PAD)
    counts = tl.zeros((E_PAD,), dtype=tl.int32)
    for start in range(0, num_pairs, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=E_PAD)
        counts += tl.sum((ids[:, None] == offs_e[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    tl.store(num_padded_ptr, total)

    seen = tl.zeros((E_PAD,), dtype=tl.int32)
    for start in range(0, num_pairs, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=E_PAD)
        onehot = (ids[:, None] == offs_e[None, :]).to(tl.int32)
        rank = tl.cumsum(onehot, axis=0) - onehot
        dest = tl.sum(onehot * (starts + seen)[None, :] + onehot * rank, axis=1)
        tl.store(sorted_ptr + dest, offs, mask=offs < num_pairs)
        seen += tl.sum(onehot, axis=0)

    for start in range(0, max_padded, CHUNK):
        slot = start + tl.arange(0, CHUNK)
        owner = tl.sum((ends[None, :] <= slot[:, None]).to(tl.int32), axis=1)  # expert whose range holds slot
        is_owner = offs_e[None, :] == owner[:, None]
        first = tl.sum(tl.where(is_owner, starts[None, :], 0), axis=1)
        count = tl.sum(tl.where(is_owner, counts[None, :], 0), axis=1)
        pad = (slot >= total) | (slot - first >= count)
        tl.store(sorted_ptr + slot, num_pairs, mask=pad & (slot < max_padded))

    for start in range(0, max_padded // BLOCK_M, CHUNK):
        blk = start + tl.arange(0, CHUNK)
        blk_start = blk * BLOCK_M
        owner = tl.sum((ends[None, :] <= blk_start[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + blk, tl.where(blk_start < total, owner, -1), mask=blk < max_padded // BLOCK_M)


@triton.jit
def _round_bf16(v):
    """fp32 ``v`` rounded to nearest-even on the bf16 grid, still in fp32. The interpreter's fp32 -> bf16 cast
    truncates; under it, values are rounded here first and the cast is exact (GPUs round to nearest-even)."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _quant_rows_kernel(src_ptr, dst_ptr, scale_ptr, N, stride_r, stride_c, qmax, min_amax,
                       BLOCK: tl.constexpr, ROUND_FIRST: tl.constexpr, EMIN: tl.constexpr, NEG_ZERO: tl.constexpr):
    """Row r of src -> FP8 with scale max(amax, min_amax) / qmax (one program per row; the second pass reads the
    row from L2). Bit for bit :func:`engine.core.ops.fp8.quantize_fp8` with granularity "token"."""
    row = tl.program_id(0).to(tl.int64)
    src = src_ptr + row * stride_r
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        v = tl.load(src + offs * stride_c, mask=offs < N, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(v))
    # IEEE divisions, as the reference's (``/`` on fp32 is approximate on NVIDIA GPUs)
    scale = tl.math.div_rn(tl.maximum(tl.max(amax, axis=0), min_amax), qmax)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        v = tl.load(src + offs * stride_c, mask=offs < N, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.math.div_rn(v, scale), -qmax), qmax)
        if ROUND_FIRST:
            q = round_to_fp8_grid(q, EMIN, NEG_ZERO)
        tl.store(dst_ptr + row * N + offs, q.to(dst_ptr.dtype.element_ty), mask=offs < N)
    tl.store(scale_ptr + row, scale)


@triton.jit
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, b_gs_ptr, topk_w_ptr,
    sorted_ptr, block_expert_ptr, num_padded_ptr,
    N, K, num_pairs, max_padded,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk,
    stride_cs, stride_cm, stride_cn, stride_bse, stride_bsn, stride_bsk, stride_asm, stride_bge,
    A_ROW_DIV: tl.constexpr,  # A row of pair p: p // A_ROW_DIV (top_k for x, 1 for h)
    GATED: tl.constexpr,  # B rows [0, N) gate, [N, 2N) up; epilogue silu(gate) * up
    MUL_WEIGHT: tl.constexpr,  # multiply by the pair's routing weight
    FP8: tl.constexpr,  # A and B are FP8: scale by a_scale[row] * b_scale[e, n]
    FAST_ACCUM: tl.constexpr,  # FP8: let the tensor cores sum the whole K loop in their reduced precision
    BLOCK_SCALE: tl.constexpr,  # FP8 with 1x128 A groups and 128x128 B blocks (BLOCK_K = 128): scale each K tile
    UPCAST: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr, SPLIT_K: tl.constexpr,
    ROUND_BF16: tl.constexpr,  # interpreter, bf16 output: round to nearest-even before the (truncating) cast
    B_QTYPE: tl.constexpr,  # 0: B holds values; > 0: raw GGUF rows of this type (stride_bn: row bytes); NVFP4 (-1):
    # packed e2m1 codes, e4m3 block scales (bytes) at b_scale_ptr and per-row fp32 global scales at b_gs_ptr
    B_BYTES: tl.constexpr,  # GGUF: bytes per block (super-block for K-quants)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    OUT_N: tl.constexpr,  # output columns per program: BLOCK_N // 2 when GATED, else BLOCK_N
):
    """C[pair, n] (= output column n of the pair's expert) for one BLOCK_M group of sorted pairs and one
    column tile; programs are ordered GROUP_M blocks at a time so neighbours share weight tiles in L2."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(max_padded, BLOCK_M)
    num_pid_n = tl.cdiv(N, OUT_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + offs_m)
    row_ok = pair < num_pairs
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    a_rows = (pair // A_ROW_DIV).to(tl.int64)
    offs_out = pid_n * OUT_N + tl.arange(0, OUT_N)
    if GATED:
        j = tl.arange(0, BLOCK_N)
        b_rows = (pid_n * OUT_N + j % OUT_N) % N + (j // OUT_N) * N
    else:
        b_rows = offs_out % N  # wrapped columns are computed and not stored: loads need no mask
    b_rows = b_rows.to(tl.int64)

    num_kt = tl.cdiv(K, BLOCK_K)
    kt_per_split = tl.cdiv(num_kt, SPLIT_K)
    kt_start = pid_k * kt_per_split
    kt_end = tl.minimum(kt_start + kt_per_split, num_kt)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + (kt_start * BLOCK_K + offs_k)[None, :] * stride_ak
    b_ptrs = (b_ptr + expert * stride_be + b_rows[None, :] * stride_bn
              + (kt_start * BLOCK_K + offs_k)[:, None] * stride_bk)
    b_rows_ptr = b_ptr + expert * stride_be + b_rows[None, :] * stride_bn  # GGUF: each row's first byte
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt_start, kt_end):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            if B_QTYPE == 0:
                b = tl.load(b_ptrs)
        else:
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & (offs_k[None, :] < k_left), other=0.0)
            if B_QTYPE == 0:
                b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if B_QTYPE != 0:  # decoded in fp32; rounded to A's dtype for the tensor cores (the interpreter upcasts)
            k_mask = (offs_k < K - kt * BLOCK_K)[:, None]
            if B_QTYPE < 0:  # NVFP4
                b = nvfp4_values(b_rows_ptr, b_scale_ptr + expert * stride_bse + b_rows[None, :] * stride_bsn, k_mask,
                                 (kt * BLOCK_K + offs_k)[:, None], stride_bsk)
            else:
                b = gguf_values(b_rows_ptr, k_mask, (kt * BLOCK_K + offs_k)[:, None], kt * BLOCK_K, B_QTYPE, B_BYTES)
            if not UPCAST:
                b = b.to(a.dtype)
        if BLOCK_SCALE:  # this K tile's group scales (A row, B block row) on its partial product, then fp32
            a_s = tl.load(a_scale_ptr + a_rows * stride_asm + kt, mask=row_ok, other=0.0)
            b_s = tl.load(b_scale_ptr + expert * stride_bse + (b_rows // 128) * stride_bsn + kt * stride_bsk)
            if UPCAST:
                part = tl.dot(a.to(tl.float32), b.to(tl.float32))
            else:
                part = tl.dot(a, b)
            acc += part * a_s[:, None] * b_s[None, :]
        elif UPCAST:
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32))
        elif IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        elif FP8 and not FAST_ACCUM:  # Hopper keeps ~14 bits when summing FP8 products: promote every K tile
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if B_QTYPE < 0:  # NVFP4: 1 / global scale, per B row
        acc = tl.math.div_rn(acc, tl.load(b_gs_ptr + expert * stride_bge + b_rows)[None, :])
    if FP8 and not BLOCK_SCALE:
        a_s = tl.load(a_scale_ptr + a_rows, mask=row_ok, other=0.0)
        b_s = tl.load(b_scale_ptr + expert * stride_bse + b_rows * stride_bsn)
        acc = acc * a_s[:, None] * b_s[None, :]
    if GATED:
        gate, up = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, OUT_N)), (0, 2, 1)))
        res = gate / (1.0 + tl.exp(-gate)) * up
    else:
        res = acc
    if MUL_WEIGHT:
        w = tl.load(topk_w_ptr + pair, mask=row_ok, other=0.0)
        res = res * w[:, None]
    if ROUND_BF16:
        res = _round_bf16(res)
    c_ptrs = (c_ptr + pid_k * stride_cs + pair.to(tl.int64)[:, None] * stride_cm
              + offs_out[None, :].to(tl.int64) * stride_cn)
    tl.store(c_ptrs, res.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_out[None, :] < N))


@triton.jit
def _reduce_kernel(y_ptr, out_ptr, H, stride_ys, stride_ym, stride_om,
                   TOP_K: tl.constexpr, SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, ROUND_BF16: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        for j in tl.static_range(TOP_K):
            acc += tl.load(y_ptr + s * stride_ys + (t * TOP_K + j) * stride_ym + offs, mask=mask, other=0.0)
    if ROUND_BF16:
        acc = _round_bf16(acc)
    tl.store(out_ptr + t * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------------------
# configuration (shapes only)
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmConfig:
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class MoeConfig:
    """BLOCK_M (shared by both GEMMs: it is the alignment of the sorted pairs), each GEMM's tiles, SPLIT_K of the
    second GEMM (None: chosen from the SM count), and for FP8 whether the tensor cores may sum a whole K loop in
    their reduced precision (sm_90 keeps ~14 bits; False promotes to fp32 every K tile, as cuBLAS does by default)."""

    BLOCK_M: int
    gemm1: GemmConfig
    gemm2: GemmConfig
    split_k: int | None = None
    fp8_fast_accum: bool = False


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def moe_config(tokens: int, experts: int, top_k: int, hidden: int, inter: int, dtype: torch.dtype,
               fp8: bool) -> MoeConfig:
    """Tiles from the shapes: tokens per expert (tokens * top_k / experts) picks the regime."""
    if interpreting():
        bn = min(128, max(32, _pow2(2 * inter)))
        bk = min(128, max(16, _pow2(max(hidden, inter))))
        g = GemmConfig(bn, bk, 1, 4, 1)
        return MoeConfig(16, g, replace(g, BLOCK_N=min(64, max(16, _pow2(hidden)))), None)
    per_expert = tokens * top_k / max(experts, 1)
    if dtype == torch.float32:  # not a fast path: fp32 tiles take twice the shared memory
        bm = 16 if per_expert <= 8 else 64
        g = GemmConfig(64, 32, 8, 4, 3)
        return MoeConfig(bm, g, g)
    if fp8:  # after vLLM's tuned fp8_w8a8 H200 table for E=8, N=14336 (FP8 tl.dot wants BLOCK_M >= 64); the
        # large tile is 128 x 128, not vLLM's 128 x 256: promoting every K tile needs a second accumulator, and
        # 128 x 256 then spills on sm_90
        # fp16 takes K tiles of 128: a tile is promoted to fp32 as a whole (max_num_imprecise_acc = BLOCK_K), and 256
        # FP8 products summed at Hopper's reduced precision erred 0.8-1.2% (relative 2-norm, K = 2560) where fp16's
        # own rounding left the reference at 0.12-0.17% (the conformance kit failed it on an H100); 128 gave
        # 0.12-0.22%. bf16 keeps 256: its error there (0.39% against 0.12%) stays under bf16's rounding of the
        # intermediate (the reference's 0.4-1.7%), and 128 ran 1.75x slower on a 60-expert decode (H100, 296 against
        # 517 us, one shape measured).
        if per_expert <= 2:
            g = GemmConfig(128, 128 if dtype == torch.float16 else 256, 64, 4, 4)
            return MoeConfig(64, g, g)
        if per_expert <= 32:
            g = GemmConfig(128, 128, 1, 4, 3)
            return MoeConfig(64, g, g)
        g = GemmConfig(128, 128, 16, 8, 4)
        return MoeConfig(128, g, g)
    # bf16 / fp16, after vLLM's tuned H200 table for E=8, N=14336
    if per_expert <= 2:
        g = GemmConfig(128, 128, 16, 4, 5)
        return MoeConfig(16, g, g)
    if per_expert <= 4:
        g = GemmConfig(64, 256, 16, 4, 3)
        return MoeConfig(16, g, g)
    if per_expert <= 8:
        g = GemmConfig(128, 128, 16, 8, 3)
        return MoeConfig(16, g, g)
    if per_expert <= 24:
        g = GemmConfig(128, 128, 64, 4, 3)
        return MoeConfig(32, g, g)
    if per_expert <= 48:
        g = GemmConfig(128, 128, 1, 8, 4)
        return MoeConfig(64, g, g)
    g = GemmConfig(256, 64, 16, 8, 4)
    return MoeConfig(128, g, g)


def _split_k(cfg: MoeConfig, pairs: int, experts: int, hidden: int, inter: int, device) -> int:
    """Split the second GEMM's K (= I) when its tiles alone would not fill about two waves of the SMs."""
    if cfg.split_k is not None:
        return cfg.split_k
    blocks = min(experts, pairs) + pairs // cfg.BLOCK_M  # rough count of non-empty BLOCK_M groups
    programs = blocks * triton.cdiv(hidden, cfg.gemm2.BLOCK_N)
    k_tiles = triton.cdiv(inter, cfg.gemm2.BLOCK_K)
    split = 1
    while split < 8 and programs * split < 2 * sm_count(device, _INTERPRETER_SMS) and k_tiles // (2 * split) >= 8:
        split *= 2
    return split


def _dot_options(dtype: torch.dtype, fp8: bool) -> tuple[bool, bool]:
    """(UPCAST, IEEE): under the interpreter every low-precision tile is widened to fp32 before tl.dot."""
    if dtype == torch.float32 and not fp8:
        return False, not interpreting()
    return interpreting(), False


# ----------------------------------------------------------------------------------------------------------
# launches
# ----------------------------------------------------------------------------------------------------------

_fallback: dict = {}


def _launch_gemm(grid, args, consts, block_m: int, g: GemmConfig):
    """Launch ``_moe_gemm_kernel``; a config the device has too little shared memory for is retried with fewer
    stages, then narrower tiles (remembered per config)."""
    key = (g, tuple(sorted(consts.items())))
    g = _fallback.get(key, g)
    while True:
        try:
            _moe_gemm_kernel[grid(g)](*args, **consts, BLOCK_M=block_m, BLOCK_N=g.BLOCK_N, BLOCK_K=g.BLOCK_K,
                                      GROUP_M=g.GROUP_M, OUT_N=g.BLOCK_N // 2 if consts["GATED"] else g.BLOCK_N,
                                      num_warps=g.num_warps, num_stages=g.num_stages)
            _fallback[key] = g
            return
        except triton.runtime.errors.OutOfResources:
            if g.num_stages > 2:
                g = replace(g, num_stages=g.num_stages - 1)
            elif g.BLOCK_N > 32:
                g = replace(g, BLOCK_N=g.BLOCK_N // 2)
            else:
                raise


def _route(router_logits, top_k, renormalize):
    t, e = router_logits.shape
    weights = torch.empty((t, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=router_logits.device)
    e_pad = max(2, _pow2(e))
    block_t = max(1, min(64, 4096 // e_pad))
    _route_kernel[(triton.cdiv(t, block_t),)](
        router_logits, weights, ids, t, e, router_logits.stride(0), router_logits.stride(1),
        TOP_K=top_k, RENORM=bool(renormalize), BLOCK_T=block_t, E_PAD=e_pad, K_PAD=max(2, _pow2(top_k)),
        num_warps=4)
    return weights, ids


def align(ids: torch.Tensor, experts: int, block_m: int, chunk: int | None = None):
    """(sorted_ids, block_expert, num_padded, max_padded) for int32 expert ids [T, k] (see the module docstring);
    ``chunk``: pairs per step of the one program (tests)."""
    pairs = ids.numel()
    max_padded = triton.cdiv(pairs + min(experts, pairs) * (block_m - 1), block_m) * block_m
    sorted_ids = torch.empty((max_padded,), dtype=torch.int32, device=ids.device)
    block_expert = torch.empty((max_padded // block_m,), dtype=torch.int32, device=ids.device)
    num_padded = torch.empty((1,), dtype=torch.int32, device=ids.device)
    e_pad = max(2, _pow2(experts))
    chunk = chunk or max(16, min(1024, 16384 // e_pad, _pow2(max(pairs, max_padded // block_m))))
    _align_kernel[(1,)](ids, sorted_ids, block_expert, num_padded, pairs, max_padded,
                        BLOCK_M=block_m, E_PAD=e_pad, CHUNK=chunk, num_warps=8 if chunk * e_pad >= 8192 else 4)
    return sorted_ids, block_expert, num_padded, max_padded


def _quantize_rows(a: torch.Tensor, fp8_dtype: torch.dtype):
    rows, n = a.shape
    q = torch.empty((rows, n), dtype=fp8_dtype, device=a.device)
    scale = torch.empty((rows,), dtype=torch.float32, device=a.device)
    if rows:
        block = min(1024, max(16, _pow2(n)))
        _quant_rows_kernel[(rows,)](a, q, scale, n, a.stride(0), a.stride(1), fp8_max(fp8_dtype), _MIN_AMAX,
                                    BLOCK=block, ROUND_FIRST=interpreting() or fp8_dtype == torch.float8_e4m3fnuz,
                                    **fp8_grid_params(fp8_dtype), num_warps=4)
    return q, scale


def _quantize_groups(a: torch.Tensor, fp8_dtype: torch.dtype):
    """``a`` [rows, K] (K a multiple of 128) quantized per 1x128 group: (q [rows, K], scales [rows, K / 128]), each
    group a row of ``_quantize_rows`` (the same rule as quantize_fp8's "block" with (1, 128))."""
    rows, k = a.shape
    q, s = _quantize_rows(a.contiguous().view(rows * (k // BLOCK_SCALE_K), BLOCK_SCALE_K), fp8_dtype)
    return q.view(rows, k), s.view(rows, k // BLOCK_SCALE_K)


def _b_format(qtype: int) -> dict:
    """The GEMM kernel's B_QTYPE / B_BYTES for weights of GGUF type ``qtype`` (0: plain values; NVFP4)."""
    return {"B_QTYPE": qtype, "B_BYTES": ALL_QTYPES[qtype][2] if qtype > 0 else 0}


def _scale_strides(scale: torch.Tensor, block: bool = False) -> tuple[int, int, int]:
    """(expert, channel, K-block) strides of a [E] / [E, 1, 1] (channel stride 0), [E, N, 1] or, ``block``,
    [E, N/128, K/128] scale."""
    if block:
        return scale.stride(0), scale.stride(1), scale.stride(2)
    if scale.dim() == 1 or scale.shape[1] == 1:
        return scale.stride(0), 0, 0
    return scale.stride(0), scale.stride(1), 0


def _forward(x, w13, w2, router_logits, top_k, renormalize, *, w13_scale=None, w2_scale=None, w13_qtype=0,
             w2_qtype=0, w13_gs=None, w2_gs=None, config: MoeConfig | None = None):
    """fused_moe (values in w13 / w2), fused_moe_fp8 (FP8 with their scales), fused_moe_gguf (raw GGUF rows of the
    two qtypes) or fused_moe_nvfp4 (qtypes NVFP4: packed codes, the scales their e4m3 block scales as uint8, ``*_gs``
    the per-row global scales)."""
    tokens, hidden = x.shape
    experts, two_i, _ = w13.shape
    inter = two_i // 2
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    fp8 = w13.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
    block = fp8 and is_block_scale(w13_scale, two_i, hidden)
    cfg = config or moe_config(tokens, experts, top_k, hidden, inter, x.dtype, fp8)
    if block:  # one K tile per scale block
        cfg = replace(cfg, gemm1=replace(cfg.gemm1, BLOCK_K=BLOCK_SCALE_K), gemm2=replace(cfg.gemm2,
                                                                                          BLOCK_K=BLOCK_SCALE_K))
    bm = cfg.BLOCK_M
    pairs = tokens * top_k
    upcast, ieee = _dot_options(x.dtype, fp8)
    round_bf16 = interpreting() and x.dtype == torch.bfloat16

    topk_w, topk_ids = _route(router_logits, top_k, renormalize)
    sorted_ids, block_expert, num_padded, max_padded = align(topk_ids, experts, bm)
    num_pid_m = max_padded // bm

    # GEMM 1 + SiLU-and-mul: h [pairs, I] in x's dtype
    if fp8:
        a1, a1_scale = _quantize_groups(x, w13.dtype) if block else _quantize_rows(x, w13.dtype)
        s13e, s13n, s13k = _scale_strides(w13_scale, block)
    else:
        a1, a1_scale = x, topk_w
        s13e, s13n, s13k = w13_scale.stride() if w13_qtype == NVFP4 else (0, 0, 0)
    h = torch.empty((pairs, inter), dtype=x.dtype, device=x.device)
    g1 = cfg.gemm1
    _launch_gemm(
        lambda g: (num_pid_m * triton.cdiv(inter, g.BLOCK_N // 2), 1),
        (a1, w13, h, a1_scale, topk_w if w13_scale is None else w13_scale, topk_w if w13_gs is None else w13_gs,
         topk_w, sorted_ids, block_expert, num_padded,
         inter, hidden, pairs, max_padded,
         a1.stride(0), a1.stride(1), w13.stride(0), w13.stride(1), 0 if w13_qtype else w13.stride(2),
         0, h.stride(0), h.stride(1), s13e, s13n, s13k, a1_scale.stride(0) if block else 1,
         0 if w13_gs is None else w13_gs.stride(0)),
        dict(A_ROW_DIV=top_k, GATED=True, MUL_WEIGHT=False, FP8=fp8, FAST_ACCUM=cfg.fp8_fast_accum, UPCAST=upcast,
             BLOCK_SCALE=block,
             IEEE=ieee,
             EVEN_K=hidden % g1.BLOCK_K == 0, SPLIT_K=1, ROUND_BF16=round_bf16, **_b_format(w13_qtype)),
        bm, g1)

    # GEMM 2 x routing weight: y [split, pairs, hidden] fp32, or straight into out
    if fp8:
        a2, a2_scale = _quantize_groups(h, w2.dtype) if block else _quantize_rows(h, w2.dtype)
        s2e, s2n, s2k = _scale_strides(w2_scale, block)
    else:
        a2, a2_scale = h, topk_w
        s2e, s2n, s2k = w2_scale.stride() if w2_qtype == NVFP4 else (0, 0, 0)
    g2 = cfg.gemm2
    split = _split_k(cfg, pairs, experts, hidden, inter, x.device)
    direct = top_k == 1 and split == 1
    y = out if direct else torch.empty((split, pairs, hidden), dtype=torch.float32, device=x.device)
    stride_ys = 0 if direct else y.stride(0)
    _launch_gemm(
        lambda g: (num_pid_m * triton.cdiv(hidden, g.BLOCK_N), split),
        (a2, w2, y, a2_scale, topk_w if w2_scale is None else w2_scale, topk_w if w2_gs is None else w2_gs,
         topk_w, sorted_ids, block_expert, num_padded,
         hidden, inter, pairs, max_padded,
         a2.stride(0), a2.stride(1), w2.stride(0), w2.stride(1), 0 if w2_qtype else w2.stride(2),
         stride_ys, y.stride(-2), y.stride(-1), s2e, s2n, s2k, a2_scale.stride(0) if block else 1,
         0 if w2_gs is None else w2_gs.stride(0)),
        dict(A_ROW_DIV=1, GATED=False, MUL_WEIGHT=True, FP8=fp8, FAST_ACCUM=cfg.fp8_fast_accum, UPCAST=upcast,
             BLOCK_SCALE=block,
             IEEE=ieee,
             EVEN_K=inter % g2.BLOCK_K == 0, SPLIT_K=split, ROUND_BF16=round_bf16 and direct, **_b_format(w2_qtype)),
        bm, g2)

    if not direct:
        block_h = min(1024, max(16, _pow2(hidden)))
        _reduce_kernel[(tokens, triton.cdiv(hidden, block_h))](
            y, out, hidden, y.stride(0), y.stride(1), out.stride(0),
            TOP_K=top_k, SPLIT=split, BLOCK_H=block_h, ROUND_BF16=round_bf16, num_warps=4)
    return out


def triton_fused_moe(x, w13, w2, router_logits, top_k, renormalize, *, config: MoeConfig | None = None):
    """``fused_moe``. ``config`` overrides the tile heuristics (tests, tuning)."""
    return _forward(x, w13, w2, router_logits, top_k, renormalize, config=config)


def triton_fused_moe_fp8(x, w13_q, w13_scale, w2_q, w2_scale, router_logits, top_k, renormalize, *,
                         config: MoeConfig | None = None):
    """``fused_moe_fp8``. ``config`` overrides the tile heuristics (tests, tuning)."""
    return _forward(x, w13_q, w2_q, router_logits, top_k, renormalize, w13_scale=w13_scale, w2_scale=w2_scale,
                    config=config)


# ----------------------------------------------------------------------------------------------------------
# supports + registration
# ----------------------------------------------------------------------------------------------------------


def _check_shapes(device_type, x, w13, w2, router_logits, top_k):
    tensors = (x, w13, w2, router_logits)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return "x, w13, w2 and router_logits must be tensors"
    if any(t.device.type != device_type for t in tensors):
        return f"tensors must be on the {device_type} device"
    if router_logits.dtype not in _LOGIT_DTYPES:
        return f"router_logits dtype {router_logits.dtype}: need fp32, bf16, fp16 or fp64"
    problem = kernel_shape_problem(x, w13, w2, router_logits)
    if problem:
        return problem
    e = w13.shape[0]
    if e > _MAX_EXPERTS:
        return f"{e} experts: at most {_MAX_EXPERTS}"
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= min(e, _MAX_TOP_K):
        return f"top_k must be an int in [1, {min(e, _MAX_TOP_K)}], got {top_k!r}"
    return True


def quantized_experts_verdict(device_type: str, capability, x, tensors, router_logits, experts: int, top_k: int):
    """What the grouped-GEMM launches need of a quantized-experts call beyond its op's own checks (True if met):
    every tensor on ``device_type``, x and router_logits in dtypes the kernels take, the expert and top-k limits."""
    if any(t.device.type != device_type for t in tensors):
        return f"tensors must be on the {device_type} device"
    if x.dtype not in _DTYPES:
        return f"x dtype {x.dtype}: need fp32, bf16 or fp16"
    if router_logits.dtype not in _LOGIT_DTYPES:
        return f"router_logits dtype {router_logits.dtype}: need fp32, bf16, fp16 or fp64"
    if experts > _MAX_EXPERTS or top_k > _MAX_TOP_K:
        return f"{experts} experts, top_k {top_k}: at most {_MAX_EXPERTS} experts and top_k {_MAX_TOP_K}"
    if capability is not None and tuple(capability) < (8, 0) and x.dtype == torch.bfloat16:
        return f"bf16 tl.dot needs compute capability >= 8.0, this device has {tuple(capability)}"
    return True


@functools.cache
def _hip_arch(device: torch.device) -> str:
    return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]


def _fp8_verdict(device_type: str, capability, fp8: torch.dtype, device: torch.device):
    """Whether this device's Triton backend multiplies ``fp8`` tiles: the interpreter (cpu) does both formats;
    NVIDIA needs e4m3fn and sm_89+; ROCm needs e4m3fnuz on gfx94x (MI300) and e4m3fn on gfx95x."""
    if device_type == "cpu":
        return True
    if device_type != "cuda":
        return f"FP8 tl.dot is not enabled on {device_type}"
    if torch.version.hip is not None:
        if capability is not None:
            arch = {(9, 4): "gfx94", (9, 5): "gfx95"}.get(tuple(capability), f"capability {tuple(capability)}")
        else:
            arch = _hip_arch(device)
        if arch.startswith("gfx94"):
            return True if fp8 == torch.float8_e4m3fnuz else f"{arch} multiplies float8_e4m3fnuz, not {fp8}"
        if arch.startswith("gfx95"):
            return True if fp8 == torch.float8_e4m3fn else f"{arch} multiplies float8_e4m3fn, not {fp8}"
        return f"FP8 tl.dot needs gfx94x (e4m3fnuz) or gfx95x (e4m3fn); this GPU is {arch}"
    if fp8 != torch.float8_e4m3fn:
        return "NVIDIA tensor cores take float8_e4m3fn, not e4m3fnuz"
    if capability is None or tuple(capability) < (8, 9):
        return f"FP8 tl.dot needs compute capability >= 8.9, this device has {capability}"
    return True


def make_supports(device_type: str, capability: tuple[int, int] | None = None):
    """(supports for fused_moe, supports for fused_moe_fp8) for tensors on ``device_type``."""
    def supports(x, w13, w2, router_logits, top_k, renormalize):
        ok = _check_shapes(device_type, x, w13, w2, router_logits, top_k)
        if ok is not True:
            return ok
        if x.dtype not in _DTYPES or not x.dtype == w13.dtype == w2.dtype:
            return f"x, w13, w2 dtypes {x.dtype}, {w13.dtype}, {w2.dtype}: need one of fp32, bf16, fp16 for all three"
        if capability is not None and tuple(capability) < (8, 0) and x.dtype == torch.bfloat16:
            return f"bf16 tl.dot needs compute capability >= 8.0, this device has {tuple(capability)}"
        return True

    def supports_fp8(x, w13_q, w13_scale, w2_q, w2_scale, router_logits, top_k, renormalize):
        ok = _check_shapes(device_type, x, w13_q, w2_q, router_logits, top_k)
        if ok is not True:
            return ok
        if x.dtype not in _DTYPES:
            return f"x dtype {x.dtype}: need fp32, bf16 or fp16"
        fp8 = w13_q.dtype
        if fp8 not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz) or w2_q.dtype != fp8:
            return f"w13_q, w2_q dtypes {w13_q.dtype}, {w2_q.dtype}: need both float8_e4m3fn or both e4m3fnuz"
        e, two_i, h = w13_q.shape
        for name, s in (("w13_scale", w13_scale), ("w2_scale", w2_scale)):
            if not isinstance(s, torch.Tensor) or s.device.type != device_type or s.dtype != torch.float32:
                return f"{name} must be a float32 tensor on the {device_type} device"
        block = block_scaled(w13_scale, w2_scale, two_i, h)
        if block is None:
            return "w13_scale and w2_scale must both be 128x128 block scales or neither"
        if block:
            if h % BLOCK_SCALE_K or two_i // 2 % BLOCK_SCALE_K:
                return f"block scales with hidden {h}, I {two_i // 2}: the kernel takes whole 128-wide blocks"
            if not (w13_scale.is_contiguous() and w2_scale.is_contiguous()):
                return "block scales must be contiguous"
        else:
            for name, s, n in (("w13_scale", w13_scale, two_i), ("w2_scale", w2_scale, h)):
                if tuple(s.shape) not in ((e,), (e, 1, 1), (e, n, 1)):
                    return f"{name} shape {tuple(s.shape)}: need [{e}], [{e}, 1, 1], [{e}, {n}, 1] or 128x128 blocks"
        return _fp8_verdict(device_type, capability, fp8, x.device)

    return supports, supports_fp8


def register(registry, device_type: str, capability: tuple[int, int] | None = None) -> None:
    supports, supports_fp8 = make_supports(device_type, capability)
    registry.register(fused_moe, triton_fused_moe, name="triton_fused_moe", supports=supports, priority=PRIORITY,
                      note="Triton: routing + expert alignment on device, grouped GEMMs with fused SiLU-and-mul")
    registry.register(fused_moe_fp8, triton_fused_moe_fp8, name="triton_fused_moe_fp8", supports=supports_fp8,
                      priority=PRIORITY, note="Triton W8A8 FP8: per-token dynamic activations, FP8 grouped GEMMs; "
                      "128x128 block weights with 1x128 activation groups, each K tile scaled before the fp32 sum")
