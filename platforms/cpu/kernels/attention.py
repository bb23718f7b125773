"""Native paged attention (decode and causal prefill) and write_kv_cache, fp32 / bf16 / fp16 storage, fp32 math.

These run about 30 times per decode step, so the wrappers do no validation of their own: dispatch
caches ``supports()`` per shape signature (every dimension but the first, dtypes, contiguity), and
what that cache cannot see (the first dimension of each tensor, seq_lens, cu_seqlens_q, block-table
and slot values) is checked in C++ before anything is read, raising ValueError.
"""

from __future__ import annotations

import torch

from engine.core.ops.attention import paged_attention_decode, paged_attention_prefill
from engine.core.ops.kv_cache import write_kv_cache
from engine.platforms.cpu import _native

from ._common import PRIORITY, STORAGE_CODE, STORAGE_NAMES, isa_note

_MAX_HEAD_DIM = 256
LATENT_DIM = 576  # DeepSeek-V2/V3's latent rows (512 + 64), the one width above _MAX_HEAD_DIM (csrc kAttnLatentDim)


def head_dim_verdict(d: int):
    """None where the native attention takes head_dim ``d``, else why not."""
    if d == LATENT_DIM or (d % 16 == 0 and 16 <= d <= _MAX_HEAD_DIM):
        return None
    return f"head_dim {d} not supported (a multiple of 16 up to {_MAX_HEAD_DIM}, or {LATENT_DIM})"


def _on_cpu(*tensors) -> bool:
    return all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tensors)


def _supports_attention(q, key_cache, value_cache, block_tables, seq_lens):
    if not _on_cpu(q, key_cache, value_cache, block_tables, seq_lens):
        return "tensors must be on the cpu device"
    if q.dtype not in STORAGE_CODE or key_cache.dtype != q.dtype or value_cache.dtype != q.dtype:
        return (f"q/key_cache/value_cache dtypes {q.dtype}/{key_cache.dtype}/{value_cache.dtype}: need one of "
                f"{STORAGE_NAMES}")
    if q.dim() != 3 or key_cache.dim() != 4 or value_cache.shape[1:] != key_cache.shape[1:]:
        return "q must be [T, Hq, D] and both caches [num_blocks, block_size, Hk, D]"
    hq, d = q.shape[1], q.shape[2]
    bs, hk = key_cache.shape[1], key_cache.shape[2]
    if key_cache.shape[3] != d or hk == 0 or hq % hk or bs == 0:
        return "need cache head_dim == q head_dim, Hq a multiple of Hk, block_size > 0"
    if (why := head_dim_verdict(d)) is not None:
        return why
    if not (q.is_contiguous() and key_cache.is_contiguous() and value_cache.is_contiguous()):
        return "q and the caches must be contiguous"
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2:
        return "block_tables must be 2-D int32"  # any strides: they are passed on every call
    if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1 or not seq_lens.is_contiguous():
        return "seq_lens must be a contiguous 1-D int32 tensor"
    return True


def _supports_decode(q, key_cache, value_cache, block_tables, seq_lens, scale=None):
    return _supports_attention(q, key_cache, value_cache, block_tables, seq_lens)


def _supports_prefill(q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, scale=None):
    if not _on_cpu(cu_seqlens_q) or cu_seqlens_q.dtype != torch.int32 or cu_seqlens_q.dim() != 1 \
            or not cu_seqlens_q.is_contiguous():
        return "cu_seqlens_q must be a contiguous 1-D int32 cpu tensor"
    return _supports_attention(q, key_cache, value_cache, block_tables, seq_lens)


def _attention(q, key_cache, value_cache, block_tables, cu_seqlens_q, cu_len, seq_lens, scale):
    out = torch.empty_like(q)
    t, hq, d = q.shape
    nb, bs, hk = key_cache.shape[:3]
    bt_rows, max_blocks = block_tables.shape
    s0, s1 = block_tables.stride()
    _native.paged_attention(q.data_ptr(), t, hq, d, key_cache.data_ptr(), value_cache.data_ptr(), nb,
                            value_cache.shape[0], bs, hk, block_tables.data_ptr(), bt_rows, max_blocks, s0, s1,
                            seq_lens.data_ptr(), seq_lens.shape[0], cu_seqlens_q, cu_len, out.data_ptr(), scale,
                            STORAGE_CODE[q.dtype])
    return out


def attention_decode(q, key_cache, value_cache, block_tables, seq_lens, scale):
    """The native decode on tensors already checked (kernels/mla.py calls it with one cache as keys and values)."""
    return _attention(q, key_cache, value_cache, block_tables, 0, 0, seq_lens, scale)


def _decode(q, key_cache, value_cache, block_tables, seq_lens, scale):
    return _attention(q, key_cache, value_cache, block_tables, 0, 0, seq_lens, scale)


def _prefill(q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, scale):
    return _attention(q, key_cache, value_cache, block_tables, cu_seqlens_q.data_ptr(), cu_seqlens_q.shape[0],
                      seq_lens, scale)


def _supports_write(key, value, key_cache, value_cache, slot_mapping):
    if not _on_cpu(key, value, key_cache, value_cache, slot_mapping):
        return "tensors must be on the cpu device"
    if key.dtype not in STORAGE_CODE or {value.dtype, key_cache.dtype, value_cache.dtype} != {key.dtype}:
        return f"key, value and caches must share one dtype of {STORAGE_NAMES}"
    if key.dim() != 3 or value.shape[1:] != key.shape[1:] or key_cache.dim() != 4 \
            or value_cache.shape[1:] != key_cache.shape[1:] or key_cache.shape[2:] != key.shape[1:]:
        return "key/value must be [T, Hk, D] and the caches [num_blocks, block_size, Hk, D]"
    if not all(t.is_contiguous() for t in (key, value, key_cache, value_cache, slot_mapping)):
        return "all tensors must be contiguous"
    if slot_mapping.dtype != torch.int64 or slot_mapping.dim() != 1:
        return "slot_mapping must be 1-D int64"
    return True


def _write(key, value, key_cache, value_cache, slot_mapping):
    nb, bs, hk, d = key_cache.shape
    _native.write_kv_cache(key.data_ptr(), key.shape[0], value.data_ptr(), value.shape[0], key_cache.data_ptr(),
                           value_cache.data_ptr(), nb * bs, value_cache.shape[0] * bs, slot_mapping.data_ptr(),
                           slot_mapping.shape[0], hk * d * key.element_size())


def register(registry) -> None:
    note = isa_note()
    registry.register(paged_attention_decode, _decode, name="native", supports=_supports_decode,
                      priority=PRIORITY, note=note)
    registry.register(paged_attention_prefill, _prefill, name="native", supports=_supports_prefill,
                      priority=PRIORITY, note=note)
    registry.register(write_kv_cache, _write, name="native", supports=_supports_write, priority=PRIORITY,
                      note="native C++ row copies")
