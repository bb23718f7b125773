"""Multi-head latent attention (MLA), DeepSeek-V2/V3's attention block, with a paged latent KV cache.

Per token the cache holds one latent row shared by every head: the normalized kv_lora_rank compression of the
hidden state, then the rotary key of qk_rope_head_dim channels (after rotary). Attention runs in that latent
space with the up-projections absorbed (kv_b_proj split per head into W_UK for keys and W_UV for values):
``q_latent = q_nope @ W_UK``, scores ``[q_latent, q_rope] . latent_row``, ``o = (softmax @ latent[:kv_lora]) @
W_UV^T``. Decode runs ``mla_decode``; prefill runs ``paged_attention_prefill`` with the latent cache as both the key
and the value cache of one KV head (the output's rope channels are dropped), so both reach the platform's kernels.
"""

from __future__ import annotations

import torch

from engine.core.ops.attention import paged_attention_prefill
from engine.core.ops.kv_cache import write_kv_cache
from engine.core.ops.mla import mla_decode
from engine.core.ops.norm import rms_norm
from engine.core.ops.registry import CallSite
from engine.core.ops.rotary import rotary_embedding, yarn_mscale

from .batch import ForwardBatch
from .config import ModelConfig
from .layers import Linear
from .weights import dense_weight


def softmax_scale(cfg: ModelConfig) -> float:
    """1/sqrt(qk_nope + qk_rope), times YaRN's mscale(factor, mscale_all_dim) squared where the rope scaling has
    one (DeepSeek's reference folds it into the scores of all channels, not only the rotary ones)."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    s = cfg.rope_scaling or {}
    if s.get("rope_type") == "yarn" and s.get("mscale_all_dim"):
        scale *= yarn_mscale(float(s["factor"]), float(s["mscale_all_dim"])) ** 2
    return scale


class LatentAttention:
    def __init__(self, cfg: ModelConfig, w: dict, prefix: str, cos_sin_cache: torch.Tensor, dtype: torch.dtype):
        p = prefix + "self_attn."
        self.h, self.eps = cfg.num_heads, cfg.rms_norm_eps
        self.nope, self.rope, self.v_dim, self.rank = (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim,
                                                       cfg.kv_lora_rank)
        self.is_neox = not cfg.rope_interleave
        self.scale, self.cos_sin = softmax_scale(cfg), cos_sin_cache
        if cfg.q_lora_rank:
            self.q_a, self.q_b = Linear(w[p + "q_a_proj.weight"]), Linear(w[p + "q_b_proj.weight"])
            self.q_a_norm = w[p + "q_a_layernorm.weight"]
            self.q_proj = None
        else:
            self.q_proj = Linear(w[p + "q_proj.weight"])
        self.kv_a = Linear(w[p + "kv_a_proj_with_mqa.weight"])
        self.kv_a_norm = w[p + "kv_a_layernorm.weight"]
        self.o_proj = Linear(w[p + "o_proj.weight"])
        kv_b = dense_weight(w[p + "kv_b_proj.weight"], dtype)
        if tuple(kv_b.shape) != (self.h * (self.nope + self.v_dim), self.rank):
            raise ValueError(f"{p}kv_b_proj.weight is {tuple(kv_b.shape)}, expected "
                             f"({self.h * (self.nope + self.v_dim)}, {self.rank}) from the config")
        per_head = kv_b.view(self.h, self.nope + self.v_dim, self.rank)
        self.w_uk = per_head[:, :self.nope].contiguous()  # [H, nope, rank]: q_nope -> latent query
        self.w_uv_t = per_head[:, self.nope:].transpose(1, 2).contiguous()  # [H, rank, v]: latent output -> v
        self.norm_q, self.norm_kv = CallSite(rms_norm), CallSite(rms_norm)
        self.rotary, self.write = CallSite(rotary_embedding), CallSite(write_kv_cache)
        self.decode, self.prefill = CallSite(mla_decode), CallSite(paged_attention_prefill)

    def __call__(self, key, x: torch.Tensor, batch: ForwardBatch, cache: torch.Tensor) -> torch.Tensor:
        """``cache``: this layer's latent cache [num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]."""
        t = x.shape[0]
        if self.q_proj is None:
            q = self.q_b(key, self.norm_q(key, self.q_a(key, x), self.q_a_norm, self.eps))
        else:
            q = self.q_proj(key, x)
        q = q.view(t, self.h, self.nope + self.rope)
        kv = self.kv_a(key, x)
        latent = self.norm_kv(key, kv[:, :self.rank].contiguous(), self.kv_a_norm, self.eps)
        q_rope, k_rope = self.rotary(key, batch.positions, q[..., self.nope:].contiguous(),
                                     kv[:, None, self.rank:].contiguous(), self.cos_sin, self.rope, self.is_neox)
        row = torch.cat([latent, k_rope.reshape(t, self.rope)], dim=-1).unsqueeze(1)  # [t, 1, rank + rope]
        self.write(key, row, row, cache, cache, batch.slot_mapping)
        q_latent = torch.bmm(q[..., :self.nope].transpose(0, 1), self.w_uk).transpose(0, 1)  # [t, H, rank]
        q_full = torch.cat([q_latent, q_rope.reshape(t, self.h, self.rope)], dim=-1)
        if batch.is_decode:
            o = self.decode(key, q_full, cache.view(cache.shape[0], cache.shape[1], -1), batch.block_tables,
                            batch.seq_lens, self.scale, self.rank)
        else:
            o = self.prefill(key, q_full, cache, cache, batch.block_tables, batch.cu_seqlens_q, batch.seq_lens,
                             self.scale)[..., :self.rank]
        o = torch.bmm(o.transpose(0, 1).to(self.w_uv_t.dtype), self.w_uv_t).transpose(0, 1)  # [t, H, v]
        return self.o_proj(key, o.reshape(t, self.h * self.v_dim).to(x.dtype))
