"""``write_kv_cache`` in Triton: scatter each token's keys and values to its cache slot, in place.

Program (t, j) copies heads [j*BLOCK_H, (j+1)*BLOCK_H) of token t's key and value rows to slot ``slot_mapping[t]``
of the caches ([num_blocks, block_size, Hk, D], contiguous, so slot s starts at element s * Hk * D). A negative slot
(padding) masks every store of the program: no branch on the value on the host, nothing read back.
Key and value may be strided views (e.g. slices of a fused qkv projection).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.core.ops.kv_cache import write_kv_cache

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PRIORITY = 10
TILE = 4096  # elements per program (heads per program = TILE // head_dim rounded up to a power of two)


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, H, D, s_slot,
                     s_kt, s_kh, s_kd, s_vt, s_vh, s_vd,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t * s_slot)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    h_end = tl.where(slot >= 0, H, 0)  # a padding token (slot < 0) stores nothing
    m = (h[:, None] < h_end) & (d[None, :] < D)
    dst = slot * (H * D) + h[:, None] * D + d[None, :]
    k = tl.load(k_ptr + t * s_kt + h[:, None] * s_kh + d[None, :] * s_kd, mask=m)
    tl.store(kc_ptr + dst, k, mask=m)
    v = tl.load(v_ptr + t * s_vt + h[:, None] * s_vh + d[None, :] * s_vd, mask=m)
    tl.store(vc_ptr + dst, v, mask=m)


def triton_write_kv_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    t, h, d = key.shape
    if t == 0 or h == 0 or d == 0:
        return
    block_d = triton.next_power_of_2(d)
    block_h = min(triton.next_power_of_2(h), max(1, TILE // block_d))
    _write_kv_kernel[(t, triton.cdiv(h, block_h))](
        key, value, key_cache, value_cache, slot_mapping, h, d, slot_mapping.stride(0),
        *key.stride(), *value.stride(), BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4)


def _supports(device_type, key, value, key_cache, value_cache, slot_mapping) -> bool | str:
    ts = (key, value, key_cache, value_cache, slot_mapping)
    if not all(isinstance(x, torch.Tensor) for x in ts):
        return "all arguments must be tensors"
    if any(x.device.type != device_type for x in ts):
        return f"tensors must be on {device_type}"
    if key.dtype not in DTYPES or {value.dtype, key_cache.dtype, value_cache.dtype} != {key.dtype}:
        return f"key, value and both caches must share one dtype of {DTYPES}"
    if slot_mapping.dtype != torch.int64 or slot_mapping.dim() != 1:
        return "slot_mapping must be 1-D int64"
    if key.dim() != 3 or value.shape != key.shape or key.shape[0] != slot_mapping.shape[0]:
        return "key and value must be [T, Hk, D] with T = len(slot_mapping)"
    if key_cache.dim() != 4 or value_cache.shape != key_cache.shape or key_cache.shape[2:] != key.shape[1:]:
        return "caches must be [num_blocks, block_size, Hk, D] matching key"
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        return "caches must be contiguous"
    return True


def register(registry, device_type: str, capability=None) -> None:
    registry.register(write_kv_cache, triton_write_kv_cache, name="triton_write_kv_cache", priority=PRIORITY,
                      supports=lambda *args: _supports(device_type, *args),
                      note="scatter to slots in place, negative slots skipped on the device")
