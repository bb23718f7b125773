"""Paged attention in Triton for the NHD cache layout [num_blocks, block_size, Hk, D].

Two kernels, both matching :mod:`engine.core.ops.attention` exactly (same masking, fp32 softmax and
accumulation, output in q's dtype):

``paged_attention_decode`` (one query per sequence)
    Grid (B, Hk x group chunks, P). A program owns every query head of one KV head (the GQA group is
    the M dimension of ``tl.dot``, padded to 16 rows), so each K/V row is read from memory once. Long
    contexts are split over P partitions of the context (split-KV); each writes its fp32 running max,
    sum and unnormalised accumulator to a workspace and a second kernel combines them. P is chosen on
    the host from *shapes only* (B, Hk, ``block_tables.shape[1]``, the SM count), never from
    ``seq_lens`` values: nothing is read back, so the call is CUDA-graph capturable. Partitions past a
    sequence's length exit at once, and the reduce reads only the partitions that hold tokens.

``paged_attention_prefill`` (variable-length, causal)
    Flash-attention style online softmax with fp32 accumulation. A program's BLOCK_M rows are
    BLOCK_Q = BLOCK_M // G_TILE queries x G_TILE query heads of one KV head (the GQA group, or a chunk of
    it, stacked along M), so each K/V tile is read once for the whole group and the causal diagonal is
    cut finer. The grid is (Hk x group chunks, T // BLOCK_Q + B), an upper bound on the number of query
    tiles computed from shapes alone, last tiles (longest causal rows) first; each program finds its
    sequence by a binary search over ``cu_seqlens_q`` on the device (sequence b's tiles start at
    ``cu_seqlens_q[b] // BLOCK_Q + b``) and spare programs exit at once, so there is no host sync here.
    Each sequence's q_len queries are its LAST tokens: query i sits at position ``seq_len - q_len + i``
    and sees every cached key up to it (prefix-cache hits and earlier chunks included). Key tiles fully below the tile's
    first query position run without a mask; only the diagonal tiles are masked.

Every input may be a strided view (caches too: a view of a combined KV allocation); strides are kernel
arguments and Triton specialises a stride of 1, so the contiguous case keeps its 16-byte loads. The output
is a new contiguous [T, Hq, D] tensor. Launches go to the current CUDA device (Triton's rule): call with
the tensors' device current, as the engine does (one process per GPU).

No values are validated (that would need a host read): like the reference, a decode ``seq_len`` past
``block_tables.shape[1] * block_size`` is clamped to it; prefill inputs must satisfy the op contract
(cu_seqlens_q from 0 to T, 0 <= q_len <= seq_len).

Under the Triton interpreter (CI on CPU) every tile is upcast to fp32 before ``tl.dot``: the
interpreter's bf16 dot returns garbage (FACTS.md). On a GPU bf16/fp16 tiles go to the tensor cores
as they are; fp32 inputs use ``input_precision="ieee"`` (tf32 would miss the fp32 tolerance).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from engine.core.ops.attention import paged_attention_decode, paged_attention_prefill

from . import interpreting, sm_count

PRIORITY = 10
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_LOG2E = 1.4426950408889634
_MAX_HEAD_DIM = 256
_MAX_GROUP_BLOCK = 64  # query heads per decode program; a larger GQA group is split over programs

# split-KV heuristic (decode): aim for _TARGET_WAVES x SM count programs, partitions of at least
# _MIN_PARTITION tokens, at most _MAX_PARTITIONS of them (the reduce kernel holds them in one tile)
_TARGET_WAVES = 2
_MIN_PARTITION = 256
_MAX_PARTITIONS = 64
_INTERPRETER_SMS = 16  # a stand-in SM count under the interpreter (no device to ask)


# ----------------------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def _online_softmax_step(s, m_i, l_i, acc, v, PREC: tl.constexpr):
    """One key tile of an online softmax: scores ``s`` [M, N] in the log2 domain (masked keys at -inf, at least one
    key finite per row), values ``v`` [N, D]; returns the new running max, sum and unnormalised accumulator."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _store_decode(out_ptr, m_ptr, l_ptr, acc_ptr, m_i, l_i, acc, b, heads, h_mask, offs_d, d_mask, part, num_parts,
                  NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr):
    """A decode program's result: with split-KV its partition's max, sum and accumulator into the [B, Hq, P]
    workspaces (acc [B, Hq, P, D]) for the reduce kernel, else the normalised output [B, Hq, D]."""
    out_mask = h_mask[:, None] & d_mask[None, :]
    if SPLIT:
        ws = (b * NUM_Q_HEADS + heads) * num_parts + part
        tl.store(m_ptr + ws, m_i, mask=h_mask)
        tl.store(l_ptr + ws, l_i, mask=h_mask)
        tl.store(acc_ptr + ws[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=out_mask)
    else:
        tl.store(out_ptr + (b * NUM_Q_HEADS + heads[:, None]) * HEAD_DIM + offs_d[None, :],
                 (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr,
    qk_scale,  # scale * log2(e): scores live in the log2 domain (exp2)
    stride_qb, stride_qh, stride_qd,
    stride_btb, stride_btn, stride_len,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    max_ctx,  # block_tables.shape[1] * block_size
    part_tokens,  # tokens per partition, a multiple of BLOCK_N
    num_parts,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    NUM_G_CHUNKS: tl.constexpr = (GROUP + BLOCK_G - 1) // BLOCK_G
    b = tl.program_id(0)
    kvh = tl.program_id(1) // NUM_G_CHUNKS
    g0 = (tl.program_id(1) % NUM_G_CHUNKS) * BLOCK_G
    part = tl.program_id(2)

    seq_len = tl.minimum(tl.load(lens_ptr + b * stride_len), max_ctx)
    start = part * part_tokens
    if start >= seq_len:  # an empty partition: the reduce kernel does not read it
        return
    end = tl.minimum(start + part_tokens, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    g_mask = g0 + offs_g < GROUP
    heads = kvh * GROUP + g0 + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    bt_row = bt_ptr + b * stride_btb
    k_head = k_ptr + kvh * stride_kh + offs_d[None, :] * stride_kd
    v_head = v_ptr + kvh * stride_vh + offs_d[None, :] * stride_vd
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + offs_n
        valid = tok < end
        page = tl.load(bt_row + (tok // BLOCK_SIZE) * stride_btn, mask=valid, other=0).to(tl.int64)
        slot = tok % BLOCK_SIZE
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_head + (page * stride_kb + slot * stride_kt)[:, None], mask=kv_mask, other=0.0)
        v = tl.load(v_head + (page * stride_vb + slot * stride_vt)[:, None], mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))  # every tile holds at least one valid token
        m_i, l_i, acc = _online_softmax_step(s, m_i, l_i, acc, v, PREC)
    _store_decode(out_ptr, m_ptr, l_ptr, acc_ptr, m_i, l_i, acc, b, heads, g_mask, offs_d, d_mask, part, num_parts,
                  NUM_Q_HEADS, HEAD_DIM, SPLIT)


@triton.jit
def _decode_reduce_kernel(
    m_ptr, l_ptr, acc_ptr, out_ptr, lens_ptr, stride_len,
    max_ctx, part_tokens, num_parts,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.minimum(tl.load(lens_ptr + b * stride_len), max_ctx)
    n_parts = (seq_len + part_tokens - 1) // part_tokens  # only these were written
    offs_p = tl.arange(0, BLOCK_P)
    p_mask = offs_p < n_parts
    ws = (b * NUM_Q_HEADS + h) * num_parts + offs_p
    m = tl.load(m_ptr + ws, mask=p_mask, other=float("-inf"))
    lsum = tl.load(l_ptr + ws, mask=p_mask, other=0.0)
    m_max = tl.max(m, 0)
    w = tl.where(p_mask, tl.exp2(m - m_max), 0.0)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    acc = tl.load(acc_ptr + ws[:, None] * HEAD_DIM + offs_d[None, :], mask=p_mask[:, None] & d_mask[None, :],
                  other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(lsum * w, 0)
    tl.store(out_ptr + (b * NUM_Q_HEADS + h) * HEAD_DIM + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


@triton.jit
def _find_seq(cu_ptr, stride_cu, tile, num_seqs, BLOCK_Q: tl.constexpr):
    """The last b in [0, num_seqs) whose first query tile, cu_seqlens_q[b] // BLOCK_Q + b, is <= tile."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(cu_ptr + mid * stride_cu) // BLOCK_Q + mid
        if first <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _prefill_tile(q, m_i, l_i, acc, k_head, v_head, bt_row, stride_btn, stride_kb, stride_kt, stride_vb, stride_vt,
                  n0, kv_end, q_pos, offs_n, d_mask, qk_scale,
                  BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr, UPCAST: tl.constexpr,
                  PREC: tl.constexpr):
    tok = n0 + offs_n
    if MASKED:
        valid = tok < kv_end
        page = tl.load(bt_row + (tok // BLOCK_SIZE) * stride_btn, mask=valid, other=0)
    else:  # every token is below the tile's first query: no bounds checks
        page = tl.load(bt_row + (tok // BLOCK_SIZE) * stride_btn)
    page = page.to(tl.int64)
    slot = tok % BLOCK_SIZE
    k_ptrs = k_head + (page * stride_kb + slot * stride_kt)[:, None]
    v_ptrs = v_head + (page * stride_vb + slot * stride_vt)[:, None]
    if MASKED:
        if EVEN_D:
            kv_mask = valid[:, None]
        else:
            kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    elif EVEN_D:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=d_mask[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    if MASKED:
        s = tl.where((tok[None, :] <= q_pos[:, None]) & valid[None, :], s, float("-inf"))
    # finite row maxima: key 0 <= every row's position is in the first tile
    return _online_softmax_step(s, m_i, l_i, acc, v, PREC)


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, cu_ptr, lens_ptr, out_ptr,
    qk_scale,
    stride_qt, stride_qh, stride_qd,
    stride_btb, stride_btn, stride_cu, stride_len,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    num_seqs, max_ctx, num_tiles,
    NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, G_TILE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    # The M rows of a program are BLOCK_Q queries x G_TILE query heads of one KV head (query-major: row r is
    # query m0 + r // G_TILE, head g0 + r % G_TILE), so each K/V tile is read once for G_TILE heads.
    BLOCK_Q: tl.constexpr = BLOCK_M // G_TILE
    NUM_G_CHUNKS: tl.constexpr = (GROUP + G_TILE - 1) // G_TILE
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    # heads vary fastest: the programs of one query tile run together and share K/V in L2
    kvh = tl.program_id(0) // NUM_G_CHUNKS
    g0 = (tl.program_id(0) % NUM_G_CHUNKS) * G_TILE
    tile = num_tiles - 1 - tl.program_id(1)  # last tiles (the longest causal rows) first
    b = _find_seq(cu_ptr, stride_cu, tile, num_seqs, BLOCK_Q)
    q_start = tl.load(cu_ptr + b * stride_cu)
    q_len = tl.load(cu_ptr + (b + 1) * stride_cu) - q_start
    m0 = (tile - (q_start // BLOCK_Q + b)) * BLOCK_Q
    if m0 >= q_len:  # one of the spare programs of the upper-bound grid
        return
    seq_len = tl.minimum(tl.load(lens_ptr + b * stride_len), max_ctx)
    ctx = seq_len - q_len  # position of the sequence's first query

    rows = tl.arange(0, BLOCK_M)
    if G_TILE == 1:
        qi = m0 + rows
        g = g0 + tl.zeros([BLOCK_M], tl.int32)
    else:
        qi = m0 + rows // G_TILE
        g = g0 + rows % G_TILE
    row_mask = qi < q_len
    if BLOCK_Q * G_TILE < BLOCK_M:  # rows past the last whole query
        row_mask = row_mask & (rows < BLOCK_Q * G_TILE)
    if GROUP % G_TILE != 0:  # the last chunk of the group is short
        row_mask = row_mask & (g < GROUP)
    heads = kvh * GROUP + g
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q = tl.load(q_ptr + (q_start + qi)[:, None].to(tl.int64) * stride_qt + heads[:, None] * stride_qh
                + offs_d[None, :] * stride_qd, mask=row_mask[:, None] & d_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = ctx + qi

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    bt_row = bt_ptr + b * stride_btb
    k_head = k_ptr + kvh * stride_kh + offs_d[None, :] * stride_kd
    v_head = v_ptr + kvh * stride_vh + offs_d[None, :] * stride_vd
    # keys below the tile's first query position (ctx + m0) are visible to all its rows and all cached
    full_end = (ctx + m0 + 1) // BLOCK_N * BLOCK_N
    kv_end = ctx + tl.minimum(m0 + BLOCK_Q, q_len)  # one past the tile's last real query position
    for n0 in range(0, full_end, BLOCK_N):
        m_i, l_i, acc = _prefill_tile(q, m_i, l_i, acc, k_head, v_head, bt_row, stride_btn, stride_kb, stride_kt,
                                      stride_vb, stride_vt, n0, kv_end, q_pos, offs_n, d_mask, qk_scale,
                                      BLOCK_SIZE, False, EVEN_D, UPCAST, PREC)
    for n0 in range(full_end, kv_end, BLOCK_N):
        m_i, l_i, acc = _prefill_tile(q, m_i, l_i, acc, k_head, v_head, bt_row, stride_btn, stride_kb, stride_kt,
                                      stride_vb, stride_vt, n0, kv_end, q_pos, offs_n, d_mask, qk_scale,
                                      BLOCK_SIZE, True, EVEN_D, UPCAST, PREC)

    out = acc / l_i[:, None]
    out_rows = (q_start + qi).to(tl.int64) * NUM_Q_HEADS + heads
    tl.store(out_ptr + out_rows[:, None] * HEAD_DIM + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & d_mask[None, :])


# ----------------------------------------------------------------------------------------------------------
# launch configuration (shapes only)
# ----------------------------------------------------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _dot_options(dtype: torch.dtype) -> tuple[bool, str]:
    """(upcast tiles to fp32, tl.dot input_precision)."""
    upcast = interpreting()
    return upcast, ("ieee" if dtype == torch.float32 or upcast else "tf32")


def decode_config(head_dim: int, group: int, dtype: torch.dtype) -> dict:
    """Tile sizes and launch options for the decode kernel.

    BLOCK_N tokens per step: K and V tiles of 16 KB together (32 tokens of bf16 D=128), 2..64 tokens;
    num_stages=5 is what gives Triton's pipeliner two K/V buffers here (the page-index load feeding the
    K/V addresses takes stages of its own; at 3 or 4 stages it single-buffers, checked on sm_90 PTX with
    Triton 3.9), so one tile is in flight while the previous one is consumed, at ~38 KB of shared memory
    per program (5 programs per SM). The GQA group is padded to a power of two >= 16 (tl.dot's M)."""
    block_d = max(16, _pow2(head_dim))
    esize = torch.empty((), dtype=dtype).element_size()
    block_n = max(16, min(64, 16 * 1024 // (2 * block_d * esize)))
    block_g = min(max(16, _pow2(group)), _MAX_GROUP_BLOCK)
    if interpreting():
        return {"BLOCK_N": 32, "BLOCK_G": block_g, "BLOCK_D": block_d, "num_warps": 4, "num_stages": 1}
    return {"BLOCK_N": block_n, "BLOCK_G": block_g, "BLOCK_D": block_d,
            "num_warps": 8 if block_g * block_d >= 64 * 128 else 4, "num_stages": 5}


def decode_partitions(batch: int, programs_per_seq: int, max_ctx: int, block_n: int, sm_count: int) -> tuple[int, int]:
    """(P, tokens per partition) for split-KV decode, from shapes only.

    Enough partitions that B x programs_per_seq x P fills about _TARGET_WAVES waves of the SMs, each
    partition at least _MIN_PARTITION tokens, at most _MAX_PARTITIONS; a multiple of block_n tokens."""
    max_ctx = max(max_ctx, 1)
    want = _cdiv(_TARGET_WAVES * sm_count, max(batch * programs_per_seq, 1))
    parts = max(1, min(want, _cdiv(max_ctx, _MIN_PARTITION), _MAX_PARTITIONS))
    part_tokens = _cdiv(_cdiv(max_ctx, parts), block_n) * block_n
    return _cdiv(max_ctx, part_tokens), part_tokens


def prefill_config(head_dim: int, dtype: torch.dtype) -> dict:
    """Tile sizes for the prefill kernel (chosen so that sm_90 compiles them without register spills).

    ``G_TILE`` query heads of one KV head share a program (stacked along M, so each K/V tile is read once for
    all of them); None picks ``prefill_g_tile``: the whole GQA group while a tile keeps >= 16 queries."""
    block_d = max(16, _pow2(head_dim))
    if interpreting():
        return {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_D": block_d, "G_TILE": None, "num_warps": 4, "num_stages": 1}
    if dtype == torch.float32:  # ieee fp32 dots run on the FMA units: small tiles
        bm = 32 if block_d <= 64 else 16
        return {"BLOCK_M": bm, "BLOCK_N": 16, "BLOCK_D": block_d, "G_TILE": None, "num_warps": 4, "num_stages": 2}
    if block_d <= 64:
        return {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_D": block_d, "G_TILE": None, "num_warps": 4, "num_stages": 3}
    if block_d <= 128:
        return {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_D": block_d, "G_TILE": None, "num_warps": 8, "num_stages": 3}
    return {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_D": block_d, "G_TILE": None, "num_warps": 8, "num_stages": 2}


def prefill_g_tile(group: int, block_m: int, g_tile: int | None = None) -> int:
    """Query heads per prefill program: ``g_tile`` if given (clamped to 1..group), else as many of the group as
    leave >= 16 queries in a BLOCK_M tile."""
    if g_tile is None:
        g_tile = block_m // 16
    return max(1, min(group, g_tile, block_m))


# ----------------------------------------------------------------------------------------------------------
# op implementations
# ----------------------------------------------------------------------------------------------------------


def paged_decode(q, key_cache, value_cache, block_tables, seq_lens, scale, *, partition_tokens: int | None = None,
                 config: dict | None = None):
    """``paged_attention_decode``. ``partition_tokens`` / ``config`` override the heuristics (tests, tuning)."""
    b, hq, d = q.shape
    out = torch.empty((b, hq, d), dtype=q.dtype, device=q.device)
    _, bs, hk, _ = key_cache.shape
    max_ctx = block_tables.shape[1] * bs
    if b == 0 or hq == 0:
        return out
    group = hq // hk
    cfg = dict(decode_config(d, group, q.dtype), **(config or {}))
    block_n = cfg["BLOCK_N"]
    g_chunks = _cdiv(group, cfg["BLOCK_G"])
    parts, part_tokens, m, lsum, acc = plan_split_kv(out, hk * g_chunks, max_ctx, block_n, partition_tokens)
    upcast, prec = _dot_options(q.dtype)
    split = parts > 1
    _decode_kernel[(b, hk * g_chunks, parts)](
        q, key_cache, value_cache, block_tables, seq_lens, out, m, lsum, acc,
        scale * _LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        block_tables.stride(0), block_tables.stride(1), seq_lens.stride(0),
        *key_cache.stride(), *value_cache.stride(),
        max_ctx, part_tokens, parts,
        NUM_Q_HEADS=hq, GROUP=group, BLOCK_G=cfg["BLOCK_G"], HEAD_DIM=d, BLOCK_D=cfg["BLOCK_D"],
        BLOCK_SIZE=bs, BLOCK_N=block_n, SPLIT=split, UPCAST=upcast, PREC=prec,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    reduce_split_kv(parts, part_tokens, m, lsum, acc, out, seq_lens, max_ctx, cfg["BLOCK_D"])
    return out


def plan_split_kv(out: torch.Tensor, programs_per_seq: int, max_ctx: int, block_n: int,
                  partition_tokens: int | None = None, interpreter_sms: int = _INTERPRETER_SMS):
    """(P, tokens per partition, max / sum / accumulator workspaces) of a split-KV decode writing ``out`` [B, H, D]:
    P from shapes only (decode_partitions) unless ``partition_tokens`` forces it; with P = 1 the workspaces are
    ``out`` itself (unused) and one partition covers the whole table."""
    b, h, width = out.shape
    if partition_tokens is None:
        parts, part_tokens = decode_partitions(b, programs_per_seq, max_ctx, block_n,
                                               sm_count(out.device, interpreter_sms))
    else:
        part_tokens = _cdiv(partition_tokens, block_n) * block_n
        parts = max(1, _cdiv(max_ctx, part_tokens))
    if parts == 1:
        return 1, max(part_tokens, max_ctx), out, out, out
    m = torch.empty((b, h, parts), dtype=torch.float32, device=out.device)
    acc = torch.empty((b, h, parts, width), dtype=torch.float32, device=out.device)
    return parts, part_tokens, m, torch.empty_like(m), acc


def reduce_split_kv(parts, part_tokens, m, lsum, acc, out, seq_lens, max_ctx: int, block_d: int) -> None:
    """Combine a split-KV decode's partitions into ``out`` (nothing to do with one partition)."""
    if parts > 1:
        b, h, width = out.shape
        _decode_reduce_kernel[(b, h)](
            m, lsum, acc, out, seq_lens, seq_lens.stride(0), max_ctx, part_tokens, parts,
            NUM_Q_HEADS=h, HEAD_DIM=width, BLOCK_D=block_d, BLOCK_P=max(2, _pow2(parts)), num_warps=4,
        )


def paged_prefill(q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, scale, *,
                  config: dict | None = None):
    """``paged_attention_prefill``. ``config`` overrides the tile sizes (tests, tuning)."""
    t, hq, d = q.shape
    out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    num_seqs = seq_lens.shape[0]
    if t == 0 or hq == 0 or num_seqs == 0:
        return out
    _, bs, hk, _ = key_cache.shape
    cfg = dict(prefill_config(d, q.dtype), **(config or {}))
    block_m = cfg["BLOCK_M"]
    group = hq // hk
    g_tile = prefill_g_tile(group, block_m, cfg.get("G_TILE"))
    block_q = block_m // g_tile  # queries per tile
    num_tiles = t // block_q + num_seqs  # >= sum over b of cdiv(q_len_b, block_q), see _find_seq
    upcast, prec = _dot_options(q.dtype)
    _prefill_kernel[(hk * _cdiv(group, g_tile), num_tiles)](
        q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, out,
        scale * _LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        block_tables.stride(0), block_tables.stride(1), cu_seqlens_q.stride(0), seq_lens.stride(0),
        *key_cache.stride(), *value_cache.stride(),
        num_seqs, block_tables.shape[1] * bs, num_tiles,
        NUM_Q_HEADS=hq, GROUP=group, G_TILE=g_tile, HEAD_DIM=d, BLOCK_D=cfg["BLOCK_D"], BLOCK_SIZE=bs,
        BLOCK_M=block_m, BLOCK_N=cfg["BLOCK_N"], UPCAST=upcast, PREC=prec,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out


# ----------------------------------------------------------------------------------------------------------
# supports + registration
# ----------------------------------------------------------------------------------------------------------


def _supports_common(device_type, capability, q, key_cache, value_cache, block_tables, seq_lens):
    tensors = (q, key_cache, value_cache, block_tables, seq_lens)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return "q, key_cache, value_cache, block_tables and seq_lens must be tensors"
    if any(t.device.type != device_type for t in tensors):
        return f"tensors must be on the {device_type} device"
    if q.dtype not in _DTYPES or key_cache.dtype != q.dtype or value_cache.dtype != q.dtype:
        return (f"q/key_cache/value_cache dtypes {q.dtype}/{key_cache.dtype}/{value_cache.dtype}: "
                "need one dtype of fp32, bf16, fp16")
    if capability is not None and tuple(capability) < (8, 0) and q.dtype == torch.bfloat16:
        return f"bf16 tl.dot needs compute capability >= 8.0, this device has {tuple(capability)}"
    if q.dim() != 3 or key_cache.dim() != 4 or value_cache.shape != key_cache.shape:
        return "q must be [T, Hq, D] and both caches [num_blocks, block_size, Hk, D] of one shape"
    hq, d = q.shape[1], q.shape[2]
    bs, hk = key_cache.shape[1], key_cache.shape[2]
    if key_cache.shape[3] != d or hk == 0 or hq % hk or bs == 0:
        return "need cache head_dim == q head_dim, Hq a multiple of Hk, block_size > 0"
    if d % 16 or not 16 <= d <= _MAX_HEAD_DIM:
        return f"head_dim {d} not supported (a multiple of 16 from 16 to {_MAX_HEAD_DIM})"
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2:
        return "block_tables must be a 2-D int32 tensor"
    if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1 or seq_lens.shape[0] != block_tables.shape[0]:
        return "seq_lens must be a 1-D int32 tensor with one entry per block_tables row"
    return True


def make_supports(device_type: str, capability: tuple[int, int] | None = None):
    """(supports_decode, supports_prefill) for tensors on ``device_type``."""

    def supports_decode(q, key_cache, value_cache, block_tables, seq_lens, scale=None):
        ok = _supports_common(device_type, capability, q, key_cache, value_cache, block_tables, seq_lens)
        if ok is True and q.shape[0] != seq_lens.shape[0]:
            return "decode takes exactly one query per sequence (q.shape[0] == seq_lens.shape[0])"
        return ok

    def supports_prefill(q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, scale=None):
        ok = _supports_common(device_type, capability, q, key_cache, value_cache, block_tables, seq_lens)
        if ok is not True:
            return ok
        if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.device.type != device_type \
                or cu_seqlens_q.dtype != torch.int32 or cu_seqlens_q.shape != (seq_lens.shape[0] + 1,):
            return f"cu_seqlens_q must be an int32 [B+1] tensor on the {device_type} device"
        return True

    return supports_decode, supports_prefill


def register(registry, device_type: str, capability: tuple[int, int] | None = None) -> None:
    supports_decode, supports_prefill = make_supports(device_type, capability)
    registry.register(paged_attention_decode, paged_decode, name="triton_paged_decode", supports=supports_decode,
                      priority=PRIORITY, note="Triton, GQA group per program, split-KV + reduce")
    registry.register(paged_attention_prefill, paged_prefill, name="triton_paged_prefill",
                      supports=supports_prefill, priority=PRIORITY,
                      note="Triton flash-attention, causal varlen, device-side tile lookup")
