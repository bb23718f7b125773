"""The self-attention block of Llama-style models (GQA, RoPE, optional q/k norm and q/k/v bias)."""

from __future__ import annotations

import torch

from engine.core.ops.attention import paged_attention_decode, paged_attention_prefill
from engine.core.ops.kv_cache import write_kv_cache
from engine.core.ops.norm import rms_norm
from engine.core.ops.registry import CallSite
from engine.core.ops.rotary import rotary_embedding

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
        self.decode = CallSite(paged_attention_decode)
        self.prefill = CallSite(paged_attention_prefill)

    def __call__(self, key, x: torch.Tensor, batch: ForwardBatch, kv: tuple[torch.Tensor, torch.Tensor]
                 ) -> torch.Tensor:
        """``key``: the step's shape key (DecoderModel.forward; see CallSite)."""
        t = x.shape[0]
        if self.qkv is not None:
            q, k, v = self.qkv_proj(key, x).split(self.qkv_split, dim=-1)
            # Column slices of [t, q + k + v]: contiguous when t = 1; copied for the kernels when not.
            q, k, v = (y.contiguous().view(t, -1, self.d) for y in (q, k, v))
        else:
            q = self.q_proj(key, x).view(t, self.h, self.d)
            k = self.k_proj(key, x).view(t, self.hk, self.d)
            v = self.v_proj(key, x).view(t, self.hk, self.d)
        if self.q_norm is not None:
            q = self.q_norm_op(key, q, self.q_norm, self.eps)
            k = self.k_norm_op(key, k, self.k_norm, self.eps)
        q, k = self.rotary(key, batch.positions, q, k, self.cos_sin, self.d, True)
        key_cache, value_cache = kv
        self.write_kv(key, k, v, key_cache, value_cache, batch.slot_mapping)
        if batch.is_decode:
            o = self.decode(key, q, key_cache, value_cache, batch.block_tables, batch.seq_lens, self.scale)
        else:
            o = self.prefill(key, q, key_cache, value_cache, batch.block_tables, batch.cu_seqlens_q, batch.seq_lens,
                             self.scale)
        return self.o_proj(key, o.reshape(t, self.h * self.d))
