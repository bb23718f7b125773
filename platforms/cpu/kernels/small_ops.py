"""Native silu_and_mul, rotary_embedding and rotary_write_kv (fp32 / bf16 / fp16 storage, fp32 math).

Like the attention wrappers, these leave validation to ``supports()`` (cached per shape signature)
and to the C++ side (first dimensions, positions in range); the only per-call work is the output
allocation and, for a layout the kernels cannot address, a contiguous copy.
"""

from __future__ import annotations

import math

import torch

from engine.core.ops.activation import silu_and_mul
from engine.core.ops.rotary import rotary_embedding
from engine.core.ops.rotary_kv import rotary_write_kv
from engine.platforms.cpu import _native

from ._common import PRIORITY, STORAGE_CODE, STORAGE_NAMES, isa_note, row_layout_ok, rows_of


def _supports_silu(x):
    if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
        return "x must be a cpu tensor"
    if x.dtype not in STORAGE_CODE:
        return f"dtype {x.dtype} not supported ({STORAGE_NAMES})"
    if x.dim() < 1 or x.shape[-1] == 0 or x.shape[-1] % 2:
        return "x must be [..., 2*d] with d > 0"
    if not row_layout_ok(x):
        return "x is not contiguous (nor a 2-D tensor with unit last stride)"
    return True


def _silu_and_mul(x):
    x2, rows, stride = rows_of(x)
    d = x.shape[-1] // 2
    out = x.new_empty((x.shape[0], d) if x.dim() == 2 else (*x.shape[:-1], d))
    _native.silu_and_mul(x2.data_ptr(), stride, out.data_ptr(), d, rows, d, STORAGE_CODE[x.dtype])
    return out


def _token_rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(x or a contiguous copy, elements between tokens, elements per token), each token's values contiguous."""
    n = math.prod(x.shape[1:])
    if x.is_contiguous():
        return x, n, n
    # A [T, ...] view whose per-token block is dense (e.g. q sliced out of a fused qkv projection).
    if x.shape[0] and x[0].is_contiguous():
        return x, x.stride(0), n
    return x.contiguous(), n, n


def _supports_rotary(positions, q, k, cos_sin_cache, head_dim, is_neox):
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in (positions, q, k, cos_sin_cache)):
        return "tensors must be on the cpu device"
    if q.dtype not in STORAGE_CODE or k.dtype != q.dtype:
        return f"q/k dtypes {q.dtype}/{k.dtype}: need one of {STORAGE_NAMES}"
    if cos_sin_cache.dtype != torch.float32 or cos_sin_cache.dim() != 2 or not cos_sin_cache.is_contiguous():
        return "cos_sin_cache must be a contiguous fp32 [max_pos, rot_dim] tensor"
    if positions.dtype != torch.int64 or positions.dim() != 1 or not positions.is_contiguous():
        return "positions must be a contiguous 1-D int64 tensor"
    rot = cos_sin_cache.shape[1]
    if head_dim <= 0 or rot <= 0 or rot % 2 or rot > head_dim:
        return f"need 0 < rot_dim ({rot}) <= head_dim ({head_dim}), rot_dim even"
    for x in (q, k):
        if x.dim() < 2 or math.prod(x.shape[1:]) % head_dim:
            return f"q and k must be [T, H*{head_dim}] (or [T, H, {head_dim}])"
    return True


def _rotary(positions, q, k, cos_sin_cache, head_dim, is_neox):
    q2, qs, qn = _token_rows(q)
    k2, ks, kn = _token_rows(k)
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format)  # cheaper than torch.empty(shape)
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format)
    max_pos, rot = cos_sin_cache.shape
    _native.rotary_embedding(positions.data_ptr(), positions.shape[0], q2.data_ptr(), qs, q.shape[0],
                             qn // head_dim, q_out.data_ptr(), k2.data_ptr(), ks, k.shape[0], kn // head_dim,
                             k_out.data_ptr(), cos_sin_cache.data_ptr(), max_pos, rot, head_dim, is_neox,
                             STORAGE_CODE[q.dtype])
    return q_out, k_out


def _supports_rotary_write_kv(positions, q, k, v, cos_sin_cache, head_dim, is_neox, q_out, key_cache, value_cache,
                              slot_mapping):
    verdict = _supports_rotary(positions, q, k, cos_sin_cache, head_dim, is_neox)
    if verdict is not True:
        return verdict
    tensors = (v, q_out, key_cache, value_cache, slot_mapping)
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tensors):
        return "v, q_out, the caches and slot_mapping must be cpu tensors"
    if {v.dtype, q_out.dtype, key_cache.dtype, value_cache.dtype} != {q.dtype}:
        return "q, k, v, q_out and the caches must share one dtype"
    if q.dim() != 3 or q_out.shape != q.shape or v.dim() != 3 or v.shape != k.shape or k.dim() != 3 \
            or k.shape[2] != head_dim or key_cache.dim() != 4 or value_cache.shape != key_cache.shape \
            or key_cache.shape[2:] != k.shape[1:]:
        return "q, q_out [T, Hq, D], k, v [T, Hk, D] and the caches [num_blocks, block_size, Hk, D]"
    if not (q_out.is_contiguous() and key_cache.is_contiguous() and value_cache.is_contiguous()):
        return "q_out and the caches must be contiguous"
    if slot_mapping.dtype != torch.int64 or slot_mapping.dim() != 1 or not slot_mapping.is_contiguous():
        return "slot_mapping must be a contiguous 1-D int64 tensor"
    return True


def _rotary_write_kv(positions, q, k, v, cos_sin_cache, head_dim, is_neox, q_out, key_cache, value_cache,
                     slot_mapping):
    q2, qs, qn = _token_rows(q)
    k2, ks, kn = _token_rows(k)
    v2, vs, _ = _token_rows(v)
    max_pos, rot = cos_sin_cache.shape
    slots = key_cache.shape[0] * key_cache.shape[1]
    _native.rotary_write_kv(positions.data_ptr(), positions.shape[0], q2.data_ptr(), qs, q.shape[0],
                            qn // head_dim, q_out.data_ptr(), k2.data_ptr(), ks, k.shape[0], kn // head_dim,
                            v2.data_ptr(), vs, v.shape[0], key_cache.data_ptr(), value_cache.data_ptr(), slots,
                            value_cache.shape[0] * value_cache.shape[1], slot_mapping.data_ptr(),
                            slot_mapping.shape[0], cos_sin_cache.data_ptr(), max_pos, rot, head_dim, is_neox,
                            STORAGE_CODE[q.dtype])


def register(registry) -> None:
    note = isa_note()
    registry.register(silu_and_mul, _silu_and_mul, name="native", supports=_supports_silu, priority=PRIORITY,
                      note=note)
    registry.register(rotary_embedding, _rotary, name="native", supports=_supports_rotary, priority=PRIORITY,
                      note=note)
    registry.register(rotary_write_kv, _rotary_write_kv, name="native", supports=_supports_rotary_write_kv,
                      priority=PRIORITY, note=note + "; k rotated straight into the cache, v copied beside it")
