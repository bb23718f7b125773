"""mla_decode on the native paged attention: the absorbed MLA decode is attention of every head against one shared KV
head whose rows are the latent cache (Dqk channels, 576 for DeepSeek-V2/V3), the values being the first ``v_dim`` of
the same rows. The kernel is called with the latent cache as both key and value cache and the output's first
``v_dim`` channels kept: the P.V pass spends (Dqk - v_dim) / v_dim more (12.5% at 576 / 512) on channels it drops,
and in exchange the one tuned attention tile (csrc/paged_attention_impl.h, every ISA) serves MLA too."""

from __future__ import annotations

import torch

from engine.core.ops.mla import mla_decode

from ._common import PRIORITY, STORAGE_CODE, STORAGE_NAMES, isa_note
from .attention import attention_decode, head_dim_verdict


def _supports(q, kv_cache, block_tables, seq_lens, scale=None, v_dim=512):
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in (q, kv_cache, block_tables, seq_lens)):
        return "tensors must be on the cpu device"
    if q.dtype not in STORAGE_CODE or kv_cache.dtype != q.dtype:
        return f"q/kv_cache dtypes {q.dtype}/{kv_cache.dtype}: need one of {STORAGE_NAMES}"
    if q.dim() != 3 or kv_cache.dim() != 3 or kv_cache.shape[2] != q.shape[2] or kv_cache.shape[1] == 0:
        return "q must be [B, H, Dqk] and kv_cache [num_pages, page_size > 0, Dqk]"
    if (why := head_dim_verdict(q.shape[2])) is not None:
        return why
    if not 0 < v_dim <= q.shape[2]:
        return f"v_dim {v_dim} not in (0, {q.shape[2]}]"
    if not (q.is_contiguous() and kv_cache.is_contiguous()):
        return "q and kv_cache must be contiguous"
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2:
        return "block_tables must be 2-D int32"
    if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1 or not seq_lens.is_contiguous():
        return "seq_lens must be a contiguous 1-D int32 tensor"
    return True


def _mla_decode(q, kv_cache, block_tables, seq_lens, scale, v_dim=512):
    kv = kv_cache.unsqueeze(2)  # [pages, page_size, 1 head, Dqk]: a view
    out = attention_decode(q, kv, kv, block_tables, seq_lens, scale)
    return out if v_dim == q.shape[2] else out[..., :v_dim].contiguous()  # the op's output is a dense [B, H, v_dim]


def register(registry) -> None:
    registry.register(mla_decode, _mla_decode, name="native", supports=_supports, priority=PRIORITY,
                      note="the native paged attention with the latent cache as its one KV head; " + isa_note())
