"""``rotary_embedding`` in Triton, out of place (the contract returns new q and k), neox and GPT-J pairings,
partial rotary (channels past rot_dim copied through).

One launch for q and k: program (t, 0) rotates every head of token t's q, program (t, 1) every head of its k; the
token's cos/sin row is read once per program. Tile [BLOCK_H heads, rot_dim / 2 pairs]. fp32 math in the reference's
order (``a*cos - b*sin``, ``b*cos + a*sin``), one rounding. q and k may be strided views (e.g. slices of a fused qkv
projection): any [T, H*D] or [T, H, D] layout with per-element strides.

``rotary_write_kv`` is the same kernel with program (t, 1) storing the rotated k, and v, straight into cache slot
``slot_mapping[t]`` (the attention block's rotary and KV write in one launch; a negative slot stores nothing).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from engine.core.ops.rotary import rotary_embedding
from engine.core.ops.rotary_kv import rotary_write_kv
from engine.platforms.triton_kernels import interpreting
from engine.platforms.triton_kernels.norm import cast_rne

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PRIORITY = 10


@triton.jit
def _rotate_heads(x_ptr, y_ptr, H, s_h, s_d, cos, sin, HD: tl.constexpr, ROT: tl.constexpr, NEOX: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr, EMULATE: tl.constexpr):
    """Rotate heads [0, H) of one token: x_ptr / y_ptr point at the token's row; y is contiguous [H, HD]."""
    h = tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_R)
    m = (h[:, None] < H) & (j[None, :] < ROT // 2)
    if NEOX:
        ia = j
        ib = j + ROT // 2
    else:
        ia = 2 * j
        ib = 2 * j + 1
    xa = x_ptr + h[:, None] * s_h
    a = tl.load(xa + ia[None, :] * s_d, mask=m, other=0.0).to(tl.float32)
    b = tl.load(xa + ib[None, :] * s_d, mask=m, other=0.0).to(tl.float32)
    ra = a * cos[None, :] - b * sin[None, :]
    rb = b * cos[None, :] + a * sin[None, :]
    ya = y_ptr + h[:, None] * HD
    tl.store(ya + ia[None, :], cast_rne(ra, y_ptr.dtype.element_ty, EMULATE), mask=m)
    tl.store(ya + ib[None, :], cast_rne(rb, y_ptr.dtype.element_ty, EMULATE), mask=m)
    if ROT < HD:  # the channels past rot_dim pass through
        c = ROT + tl.arange(0, BLOCK_T)
        mt = (h[:, None] < H) & (c[None, :] < HD)
        tail = tl.load(xa + c[None, :] * s_d, mask=mt)
        tl.store(ya + c[None, :], tail, mask=mt)


@triton.jit
def _cos_sin_row(pos_ptr, cs_ptr, t, s_pos, s_cp, s_cr, ROT: tl.constexpr, BLOCK_R: tl.constexpr):
    """Token t's cos and sin halves of its position's cache row, as fp32 [BLOCK_R] (zero past ROT / 2)."""
    pos = tl.load(pos_ptr + t * s_pos)
    j = tl.arange(0, BLOCK_R)
    mj = j < ROT // 2
    cs_row = cs_ptr + pos * s_cp
    cos = tl.load(cs_row + j * s_cr, mask=mj, other=0.0).to(tl.float32)
    sin = tl.load(cs_row + (j + ROT // 2) * s_cr, mask=mj, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _rotary_kernel(pos_ptr, q_ptr, k_ptr, qo_ptr, ko_ptr, cs_ptr, HQ, HK,
                   s_pos, s_qt, s_qh, s_qd, s_kt, s_kh, s_kd, s_cp, s_cr,
                   HD: tl.constexpr, ROT: tl.constexpr, NEOX: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr, EMULATE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin_row(pos_ptr, cs_ptr, t, s_pos, s_cp, s_cr, ROT, BLOCK_R)
    if tl.program_id(1) == 0:
        _rotate_heads(q_ptr + t * s_qt, qo_ptr + t * (HQ * HD), HQ, s_qh, s_qd, cos, sin,
                      HD, ROT, NEOX, BLOCK_H, BLOCK_R, BLOCK_T, EMULATE)
    else:
        _rotate_heads(k_ptr + t * s_kt, ko_ptr + t * (HK * HD), HK, s_kh, s_kd, cos, sin,
                      HD, ROT, NEOX, BLOCK_H, BLOCK_R, BLOCK_T, EMULATE)


@triton.jit
def _rotary_write_kv_kernel(pos_ptr, q_ptr, k_ptr, v_ptr, qo_ptr, kc_ptr, vc_ptr, slot_ptr, cs_ptr, HQ, HK,
                            s_pos, s_slot, s_qt, s_qh, s_qd, s_kt, s_kh, s_kd, s_vt, s_vh, s_vd, s_cp, s_cr,
                            HD: tl.constexpr, ROT: tl.constexpr, NEOX: tl.constexpr, BLOCK_H: tl.constexpr,
                            BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                            EMULATE: tl.constexpr):
    """_rotary_kernel with program (t, 1) storing the rotated k, and copying v, straight into cache slot
    slot_mapping[t] (contiguous [Hk, D] per slot); a negative slot masks every store of that program."""
    t = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin_row(pos_ptr, cs_ptr, t, s_pos, s_cp, s_cr, ROT, BLOCK_R)
    if tl.program_id(1) == 0:
        _rotate_heads(q_ptr + t * s_qt, qo_ptr + t * (HQ * HD), HQ, s_qh, s_qd, cos, sin,
                      HD, ROT, NEOX, BLOCK_H, BLOCK_R, BLOCK_T, EMULATE)
    else:
        slot = tl.load(slot_ptr + t * s_slot)
        h_end = tl.where(slot >= 0, HK, 0)
        dst = tl.maximum(slot, 0) * (HK * HD)
        _rotate_heads(k_ptr + t * s_kt, kc_ptr + dst, h_end, s_kh, s_kd, cos, sin,
                      HD, ROT, NEOX, BLOCK_H, BLOCK_R, BLOCK_T, EMULATE)
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        m = (h[:, None] < h_end) & (d[None, :] < HD)
        v = tl.load(v_ptr + t * s_vt + h[:, None] * s_vh + d[None, :] * s_vd, mask=m)
        tl.store(vc_ptr + dst + h[:, None] * HD + d[None, :], v, mask=m)


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """x as [T, H, D]: a view where the strides allow (the usual case), else a copy (x is only read)."""
    t = x.shape[0]
    if x.dim() == 3 and x.shape[2] == head_dim:
        return x
    return x.reshape(t, math.prod(x.shape[1:]) // head_dim, head_dim)


def triton_rotary_embedding(positions, q, k, cos_sin_cache, head_dim: int, is_neox: bool):
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    t = positions.shape[0]
    if t == 0:
        return q_out, k_out
    q3, k3 = _heads(q, head_dim), _heads(k, head_dim)
    hq, hk = q3.shape[1], k3.shape[1]
    rot = cos_sin_cache.shape[1]
    _rotary_kernel[(t, 2)](
        positions, q3, k3, q_out, k_out, cos_sin_cache, hq, hk,
        positions.stride(0), *q3.stride(), *k3.stride(), *cos_sin_cache.stride(),
        HD=head_dim, ROT=rot, NEOX=bool(is_neox), BLOCK_H=triton.next_power_of_2(max(hq, hk)),
        BLOCK_R=triton.next_power_of_2(rot // 2), BLOCK_T=triton.next_power_of_2(max(head_dim - rot, 1)),
        EMULATE=interpreting(), num_warps=4,
        enable_fp_fusion=False)  # a*cos - b*sin rounded twice, as in the reference, not contracted to an FMA
    return q_out, k_out


def triton_rotary_write_kv(positions, q, k, v, cos_sin_cache, head_dim: int, is_neox: bool, q_out, key_cache,
                           value_cache, slot_mapping) -> None:
    t = positions.shape[0]
    if t == 0:
        return
    hq, hk = q.shape[1], k.shape[1]
    rot = cos_sin_cache.shape[1]
    _rotary_write_kv_kernel[(t, 2)](
        positions, q, k, v, q_out, key_cache, value_cache, slot_mapping, cos_sin_cache, hq, hk,
        positions.stride(0), slot_mapping.stride(0), *q.stride(), *k.stride(), *v.stride(), *cos_sin_cache.stride(),
        HD=head_dim, ROT=rot, NEOX=bool(is_neox), BLOCK_H=triton.next_power_of_2(max(hq, hk)),
        BLOCK_R=triton.next_power_of_2(rot // 2), BLOCK_T=triton.next_power_of_2(max(head_dim - rot, 1)),
        BLOCK_D=triton.next_power_of_2(head_dim), EMULATE=interpreting(), num_warps=4, enable_fp_fusion=False)


def _supports_write_kv(device_type, positions, q, k, v, cos_sin_cache, head_dim, is_neox, q_out, key_cache,
                       value_cache, slot_mapping) -> bool | str:
    ok = _supports(device_type, positions, q, k, cos_sin_cache, head_dim, is_neox)
    if ok is not True:
        return ok
    ts = (v, q_out, key_cache, value_cache, slot_mapping)
    if not all(isinstance(x, torch.Tensor) for x in ts) or any(x.device.type != device_type for x in ts):
        return f"v, q_out, the caches and slot_mapping must be tensors on {device_type}"
    if {v.dtype, q_out.dtype, key_cache.dtype, value_cache.dtype} != {q.dtype}:
        return "v, q_out and both caches must have q's dtype"
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape or q.shape[2] != head_dim or k.shape[2] != head_dim:
        return f"q must be [T, Hq, {head_dim}], k and v [T, Hk, {head_dim}]"
    if q_out.shape != q.shape or not q_out.is_contiguous():
        return "q_out must be a contiguous tensor shaped like q"
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape != positions.shape:
        return "slot_mapping must be int64 [T]"
    if key_cache.dim() != 4 or value_cache.shape != key_cache.shape or key_cache.shape[2:] != k.shape[1:]:
        return "caches must be [num_blocks, block_size, Hk, D] matching k"
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        return "caches must be contiguous"
    return True


def _supports(device_type, positions, q, k, cos_sin_cache, head_dim, is_neox) -> bool | str:
    ts = (positions, q, k, cos_sin_cache)
    if not all(isinstance(x, torch.Tensor) for x in ts):
        return "positions, q, k and cos_sin_cache must be tensors"
    if any(x.device.type != device_type for x in ts):
        return f"tensors must be on {device_type}"
    if positions.dtype != torch.int64 or positions.dim() != 1:
        return "positions must be 1-D int64"
    if q.dtype not in DTYPES or k.dtype != q.dtype or cos_sin_cache.dtype not in (torch.float32, q.dtype):
        return f"q and k must share one dtype of {DTYPES}; cos_sin_cache float32 or q's dtype"
    if not isinstance(head_dim, int) or head_dim <= 0 or cos_sin_cache.dim() != 2:
        return "head_dim must be a positive int and cos_sin_cache [max_pos, rot_dim]"
    rot = cos_sin_cache.shape[1]
    if rot % 2 or not 0 < rot <= head_dim:
        return f"rot_dim {rot} must be even and in (0, head_dim={head_dim}]"
    t = positions.shape[0]
    for x in (q, k):
        if x.dim() < 2 or x.shape[0] != t or math.prod(x.shape[1:]) % head_dim:
            return f"q and k must be [T={t}, H*{head_dim}]"
    return True


def register(registry, device_type: str, capability=None) -> None:
    registry.register(rotary_embedding, triton_rotary_embedding, name="triton_rotary", priority=PRIORITY,
                      supports=lambda *args: _supports(device_type, *args),
                      note="q and k in one launch, neox and GPT-J, partial rotary; out of place")
    registry.register(rotary_write_kv, triton_rotary_write_kv, name="triton_rotary_write_kv", priority=PRIORITY,
                      supports=lambda *args: _supports_write_kv(device_type, *args),
                      note="rotary with the rotated k and v stored straight into their cache slots, one launch")
