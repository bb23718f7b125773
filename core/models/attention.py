"""The self-attention block of Llama-style models (GQA, RoPE, optional q/k norm and q/k/v bias)."""

from __future__ import annotations

import torch

from engine.core.ops.attention import paged_attention_decode, paged_attention_prefill
from engine.core.ops.kv_cache import write_kv_cache
from engine.core.ops.norm import rms_norm
from engine.core.ops.registry import CallSite, OpDef, active_registry
from engine.core.ops.rotary import rotary_embedding
from engine.core.ops.rotary_kv import rotary_write_kv

from .batch import ForwardBatch
from .config import ModelConfig
from .layers import Linear, stack_rows


class SelfAttention:
    def __init__(self, cfg: ModelConfig, w: dict, prefix: str, cos_sin_cache: torch.Tensor):
        self.h, self.hk, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.scale = self.d ** -0.5
        self.cos_sin = cos_sin_cache
        p = prefix + "self_attn."
        self.q, self.k, self.v, self.o = (w[p + n + "_proj.weight"] for n in "qkvo")
        self.q_bias, self.k_bias, self.v_bias, self.o_bias = (w.get(p + n + "_proj.bias") for n in "qkvo")
        biases = (self.q_bias, self.k_bias, self.v_bias)
        # q, k and v as one GEMM where they can share one (a decode step is bound by per-call costs).
        self.qkv = stack_rows(self.q, self.k, self.v) if all(b is None for b in biases) or all(
            b is not None for b in biases) else None
        self.qkv_bias = torch.cat(biases) if self.qkv is not None and self.q_bias is not None else None
        self.qkv_split = [self.h * self.d, self.hk * self.d, self.hk * self.d]
        if self.qkv is not None:  # the stacked copy replaces them
            self.q = self.k = self.v = self.q_bias = self.k_bias = self.v_bias = None
        self.q_norm, self.k_norm = w.get(p + "q_norm.weight"), w.get(p + "k_norm.weight")
        if cfg.qk_norm and (self.q_norm is None or self.k_norm is None):
            raise ValueError(f"{p}q_norm / k_norm weights are missing but the config asks for q/k norm")
        if self.qkv is not None:
            self.qkv_proj = Linear(self.qkv, self.qkv_bias)
        else:
            pairs = ((self.q, self.q_bias), (self.k, self.k_bias), (self.v, self.v_bias))
            self.q_proj, self.k_proj, self.v_proj = (Linear(w, b) for w, b in pairs)
        self.o_proj = Linear(self.o, self.o_bias)
        self.q_norm_op, self.k_norm_op = CallSite(rms_norm), CallSite(rms_norm)
        self.rotary = CallSite(rotary_embedding)
        self.write_kv = CallSite(write_kv_cache)
        self.rotary_kv = CallSite(rotary_write_kv)
        self.decode = CallSite(paged_attention_decode)
        self.prefill = CallSite(paged_attention_prefill)
        self._plans: dict = {}  # (registry, epoch, key) -> _plan's answer

    def __call__(self, key, x: torch.Tensor, batch: ForwardBatch, kv: tuple[torch.Tensor, torch.Tensor]
                 ) -> torch.Tensor:
        """``key``: the step's shape key (DecoderModel.forward; see CallSite)."""
        t = x.shape[0]
        if self.qkv is not None:
            # Column slices of [t, q + k + v] (contiguous when t = 1), handed on as views where the kernels take them
            q, k, v = (y.view(t, -1, self.d) for y in self.qkv_proj(key, x).split(self.qkv_split, dim=-1))
        else:
            q = self.q_proj(key, x).view(t, self.h, self.d)
            k = self.k_proj(key, x).view(t, self.hk, self.d)
            v = self.v_proj(key, x).view(t, self.hk, self.d)
        fuse, qk_views, v_views = self._plan(key, q, k, v, batch, kv)
        if not qk_views:
            q, k = q.contiguous(), k.contiguous()
        if not v_views:
            v = v.contiguous()
        if self.q_norm is not None:
            q = self.q_norm_op(key, q, self.q_norm, self.eps)
            k = self.k_norm_op(key, k, self.k_norm, self.eps)
        key_cache, value_cache = kv
        if fuse:  # rotary, then k and v into the cache, in one kernel
            q_rot = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            self.rotary_kv(key, batch.positions, q, k, v, self.cos_sin, self.d, True, q_rot, key_cache, value_cache,
                           batch.slot_mapping)
            q = q_rot
        else:
            q, k = self.rotary(key, batch.positions, q, k, self.cos_sin, self.d, True)
            self.write_kv(key, k, v, key_cache, value_cache, batch.slot_mapping)
        if batch.is_decode:
            o = self.decode(key, q, key_cache, value_cache, batch.block_tables, batch.seq_lens, self.scale)
        else:
            o = self.prefill(key, q, key_cache, value_cache, batch.block_tables, batch.cu_seqlens_q, batch.seq_lens,
                             self.scale)
        return self.o_proj(key, o.reshape(t, self.h * self.d))

    def _plan(self, key, q, k, v, batch: ForwardBatch, kv) -> tuple[bool, bool, bool]:
        """(fuse rotary with the KV write?, q and k as strided views?, v as a strided view?), decided once per step
        shape and registry. Fused where the platform has a kernel for rotary_write_kv (else two ops, as before).
        A tensor stays a view of the fused qkv projection only where the kernels chosen for the views are those
        chosen for contiguous copies, and not an op's reference (references may assume contiguous inputs)."""
        registry = active_registry()
        cache_key = (registry, registry.epoch, key)
        got = self._plans.get(cache_key)
        if got is None:
            dq, dk, dv = (torch.empty(y.shape, dtype=y.dtype, device=y.device) for y in (q, k, v))
            kc, vc = kv
            pos, slots = batch.positions, batch.slot_mapping

            def chosen(op: OpDef, args):
                return next(i for i, why in registry.explain(op, args) if why is None)

            def same(op: OpDef, view_args, dense_args) -> bool:
                impl = chosen(op, view_args)
                return impl is chosen(op, dense_args) and impl is not op.reference_impl

            qk_norm = self.q_norm is None or all(
                same(rms_norm, (y, w, self.eps), (d, w, self.eps)) for y, d, w in ((q, dq, self.q_norm),
                                                                                   (k, dk, self.k_norm)))
            fused_args = (pos, dq, dk, dv, self.cos_sin, self.d, True, dq, kc, vc, slots)
            fuse = chosen(rotary_write_kv, fused_args) is not rotary_write_kv.reference_impl
            if fuse:
                qk = qk_norm and same(rotary_write_kv, (pos, q, k, dv, *fused_args[4:]), fused_args)
                vv = same(rotary_write_kv, (pos, dq, dk, v, *fused_args[4:]), fused_args)
            else:
                qk = qk_norm and same(rotary_embedding, (pos, q, k, self.cos_sin, self.d, True),
                                      (pos, dq, dk, self.cos_sin, self.d, True))
                vv = same(write_kv_cache, (dk, v, kc, vc, slots), (dk, dv, kc, vc, slots))
            if len(self._plans) > 256:  # many distinct prefill lengths: start over
                self._plans.clear()
            got = self._plans[cache_key] = (fuse, qk, vv)
        return got
