"""MLA decode in Triton (``mla_decode``, :mod:`engine.core.ops.mla`): one query per sequence, every head attending to
one shared paged latent cache [num_pages, page_size, Dqk].

Grid (B, head chunks of BLOCK_H, P). A program owns BLOCK_H heads of one sequence (tl.dot's M, padded to 16), so
each latent row is read once per BLOCK_H heads. Each row splits into its value channels [0, v_dim) (the latent,
which the scores and the output both use) and the rest [v_dim, Dqk) (the rotary key, scores only): two dot
products make the scores, one the output, and no channel is padded to Dqk's next power of two (576 -> 1024). Long
contexts are split over P partitions (split-KV) chosen from shapes only, reduced by the paged attention's reduce
kernel, so a call is CUDA-graph capturable. Softmax and accumulation in fp32; the output in q's dtype.

Untuned: tile sizes are first guesses (16 heads x 32 rows, 4 warps), not yet measured on a GPU (issue 27's goal:
>= 80% of the latent cache's read bandwidth at batch 64, context 4096, on the H200).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.core.ops.mla import mla_decode as mla_decode_op

from .attention import (
    _LOG2E,
    _cdiv,
    _dot_options,
    _online_softmax_step,
    _pow2,
    _store_decode,
    plan_split_kv,
    reduce_split_kv,
)

PRIORITY = 10
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BLOCK_H = 16
_MAX_V_DIM = 1024
_INTERPRETER_SMS = 4


@triton.jit
def _mla_decode_kernel(
    q_ptr, kv_ptr, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr,
    qk_scale,  # scale * log2(e)
    stride_qb, stride_qh, stride_qd,
    stride_btb, stride_btn, stride_len,
    stride_kp, stride_kt, stride_kd,
    max_ctx, part_tokens, num_parts,
    NUM_HEADS: tl.constexpr, V_DIM: tl.constexpr, BLOCK_V: tl.constexpr, R_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    b = tl.program_id(0)
    h0 = tl.program_id(1) * BLOCK_H
    part = tl.program_id(2)
    seq_len = tl.minimum(tl.load(lens_ptr + b * stride_len), max_ctx)
    start = part * part_tokens
    if start >= seq_len:  # an empty partition: the reduce kernel does not read it
        return
    end = tl.minimum(start + part_tokens, seq_len)

    heads = h0 + tl.arange(0, BLOCK_H)
    h_mask = heads < NUM_HEADS
    offs_v = tl.arange(0, BLOCK_V)
    v_mask = offs_v < V_DIM
    q_row = q_ptr + b * stride_qb + heads[:, None] * stride_qh
    q_v = tl.load(q_row + offs_v[None, :] * stride_qd, mask=h_mask[:, None] & v_mask[None, :], other=0.0)
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < R_DIM
    if R_DIM > 0:
        q_r = tl.load(q_row + (V_DIM + offs_r[None, :]) * stride_qd, mask=h_mask[:, None] & r_mask[None, :],
                      other=0.0)
    if UPCAST:
        q_v = q_v.to(tl.float32)
        if R_DIM > 0:
            q_r = q_r.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_V], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    bt_row = bt_ptr + b * stride_btb
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + offs_n
        valid = tok < end
        page = tl.load(bt_row + (tok // PAGE) * stride_btn, mask=valid, other=0).to(tl.int64)
        rows = kv_ptr + page * stride_kp + (tok % PAGE) * stride_kt
        kv_v = tl.load(rows[:, None] + offs_v[None, :] * stride_kd, mask=valid[:, None] & v_mask[None, :], other=0.0)
        if UPCAST:
            kv_v = kv_v.to(tl.float32)
        s = tl.dot(q_v, tl.trans(kv_v), input_precision=PREC)
        if R_DIM > 0:
            kv_r = tl.load(rows[:, None] + (V_DIM + offs_r[None, :]) * stride_kd,
                           mask=valid[:, None] & r_mask[None, :], other=0.0)
            if UPCAST:
                kv_r = kv_r.to(tl.float32)
            s += tl.dot(q_r, tl.trans(kv_r), input_precision=PREC)
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))  # every tile holds at least one valid token
        m_i, l_i, acc = _online_softmax_step(s, m_i, l_i, acc, kv_v, PREC)
    _store_decode(out_ptr, m_ptr, l_ptr, acc_ptr, m_i, l_i, acc, b, heads, h_mask, offs_v, v_mask, part, num_parts,
                  NUM_HEADS, V_DIM, SPLIT)


def mla_decode_config(v_dim: int, rest: int, dtype: torch.dtype, interpreting: bool) -> dict:
    """Tile sizes: BLOCK_H heads, BLOCK_N latent rows a step (32 bf16 rows of 576 channels: 36 KB)."""
    cfg = {"BLOCK_H": _BLOCK_H, "BLOCK_V": max(16, _pow2(v_dim)), "BLOCK_R": max(16, _pow2(rest)) if rest else 16}
    if interpreting:
        return {**cfg, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    return {**cfg, "BLOCK_N": 16 if dtype == torch.float32 else 32, "num_warps": 4, "num_stages": 2}


def mla_decode(q, kv_cache, block_tables, seq_lens, scale, v_dim=512, *, partition_tokens: int | None = None,
               config: dict | None = None):
    """``mla_decode``. ``partition_tokens`` / ``config`` override the heuristics (tests, tuning)."""
    from . import interpreting

    b, h, d_qk = q.shape
    out = torch.empty((b, h, v_dim), dtype=q.dtype, device=q.device)
    if b == 0 or h == 0:
        return out
    page = kv_cache.shape[1]
    max_ctx = block_tables.shape[1] * page
    cfg = dict(mla_decode_config(v_dim, d_qk - v_dim, q.dtype, interpreting()), **(config or {}))
    block_n, chunks = cfg["BLOCK_N"], _cdiv(h, cfg["BLOCK_H"])
    parts, part_tokens, m, lsum, acc = plan_split_kv(out, chunks, max_ctx, block_n, partition_tokens,
                                                     _INTERPRETER_SMS)
    upcast, prec = _dot_options(q.dtype)
    split = parts > 1
    _mla_decode_kernel[(b, chunks, parts)](
        q, kv_cache, block_tables, seq_lens, out, m, lsum, acc,
        scale * _LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        block_tables.stride(0), block_tables.stride(1), seq_lens.stride(0),
        *kv_cache.stride(),
        max_ctx, part_tokens, parts,
        NUM_HEADS=h, V_DIM=v_dim, BLOCK_V=cfg["BLOCK_V"], R_DIM=d_qk - v_dim, BLOCK_R=cfg["BLOCK_R"],
        BLOCK_H=cfg["BLOCK_H"], PAGE=page, BLOCK_N=block_n, SPLIT=split, UPCAST=upcast, PREC=prec,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    reduce_split_kv(parts, part_tokens, m, lsum, acc, out, seq_lens, max_ctx, cfg["BLOCK_V"])
    return out


def make_supports(device_type: str, capability: tuple[int, int] | None = None):
    def supports(q, kv_cache, block_tables, seq_lens, scale=None, v_dim=512):
        tensors = (q, kv_cache, block_tables, seq_lens)
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            return "q, kv_cache, block_tables and seq_lens must be tensors"
        if any(t.device.type != device_type for t in tensors):
            return f"tensors must be on the {device_type} device"
        if q.dtype not in _DTYPES or kv_cache.dtype != q.dtype:
            return f"q/kv_cache dtypes {q.dtype}/{kv_cache.dtype}: need one dtype of fp32, bf16, fp16"
        if capability is not None and tuple(capability) < (8, 0) and q.dtype == torch.bfloat16:
            return f"bf16 tl.dot needs compute capability >= 8.0, this device has {tuple(capability)}"
        if q.dim() != 3 or kv_cache.dim() != 3 or kv_cache.shape[2] != q.shape[2] or kv_cache.shape[1] == 0:
            return "q must be [B, H, Dqk] and kv_cache [num_pages, page_size > 0, Dqk]"
        if not isinstance(v_dim, int) or not 0 < v_dim <= min(q.shape[2], _MAX_V_DIM):
            return f"v_dim {v_dim} must be in (0, min(Dqk, {_MAX_V_DIM})]"
        if block_tables.dtype != torch.int32 or block_tables.dim() != 2:
            return "block_tables must be a 2-D int32 tensor"
        if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1 or not (
                seq_lens.shape[0] == block_tables.shape[0] == q.shape[0]):
            return "seq_lens must be a 1-D int32 tensor with one entry per block_tables row and per query"
        return True

    return supports


def register(registry, device_type: str, capability: tuple[int, int] | None = None) -> None:
    registry.register(mla_decode_op, mla_decode, name="triton_mla_decode", supports=make_supports(device_type,
                      capability), priority=PRIORITY, note="Triton, 16 heads per program over one latent read, "
                                                           "split-KV + reduce")
