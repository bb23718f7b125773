"""Wrong kernels: each is the op's reference with one mistake (the mistake is the point)."""

from __future__ import annotations

import torch

from engine.core.ops.moe_fp8 import fused_moe_fp8
from engine.core.ops.norm import rms_norm


def _rms(x, weight, eps, acc=torch.float32):
    xf = x.to(acc)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(acc)).to(x.dtype)


def rms_eps_x10(x, weight, eps):
    return _rms(x, weight, eps * 10)


def rms_eps_dropped(x, weight, eps):
    return _rms(x, weight, 0.0)


def rms_first_8_rows(x, weight, eps):
    """Right for the first 8 rows (a kernel whose row loop stops after one tile); the rest forget the weight."""
    out = _rms(x, torch.ones_like(weight), eps)
    rows = out.reshape(-1, out.shape[-1])
    rows[:8] = _rms(x.reshape(-1, x.shape[-1])[:8], weight, eps)
    return out


def rms_low_precision_sum(x, weight, eps):
    """Squares summed in the input's own dtype (bf16/fp16), not fp32."""
    return _rms(x, weight, eps, acc=x.dtype)


_STALE: dict = {}


def rms_stale_result(x, weight, eps):
    """Remembers its first result per shape and returns it again (a cache keyed on shapes only)."""
    key = (tuple(x.shape), x.dtype)
    if key not in _STALE:
        _STALE[key] = _rms(x, weight, eps)
    return _STALE[key].clone()


def rms_reference(x, weight, eps):
    return rms_norm.reference(x, weight, eps)


def decode_first_128_keys(q, key_cache, value_cache, block_tables, seq_lens, scale):
    """Attends to at most the first 128 keys of each sequence (a kernel sized for short contexts)."""
    from engine.core.ops.attention import paged_decode_core

    return paged_decode_core(q, key_cache, value_cache, block_tables, seq_lens.clamp(max=128), scale)


def moe_fp8_down_scale(x, w13_q, w13_scale, w2_q, w2_scale, router_logits, top_k, renormalize):
    """The down projection's scale read 10% high."""
    return fused_moe_fp8.reference(x, w13_q, w13_scale, w2_q, w2_scale * 1.1, router_logits, top_k, renormalize)
