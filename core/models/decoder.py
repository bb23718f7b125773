"""DecoderModel: the Llama-style decoder (Llama, Mistral, Qwen2, Qwen3, SmolLM2), its MoE variants
(Mixtral, Qwen2-MoE, Qwen3-MoE) and DeepSeek-V3 (latent attention, grouped-routing MoE), written only against
engine.core.ops."""

from __future__ import annotations

import dataclasses

import torch

from engine.core.ops.comm import all_gather, all_reduce
from engine.core.ops.gguf_quant import GGUF_QTYPES
from engine.core.ops.norm import fused_add_rms_norm, rms_norm
from engine.core.ops.registry import CallSite
from engine.core.ops.rotary import build_cos_sin_cache

from .attention import SelfAttention
from .batch import ForwardBatch
from .config import MLA_ARCHS, SUPPORTED_ARCHS, ModelConfig
from .deepseek_moe import DeepseekMoE
from .layers import Embedding, Linear
from .mla import LatentAttention
from .mlp import GatedMLP, SparseMoE
from .weights import QuantizedWeight, native_int4, to_device


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, w: dict, i: int, cos_sin: torch.Tensor, dtype: torch.dtype,
                 tensor_parallel: bool = False):
        p = f"model.layers.{i}."
        # a tensor-parallel rank's attention and MLP outputs are partial sums (row-parallel o / down): summed over
        # the ranks before the residual add
        self.reduce_attn, self.reduce_mlp = (CallSite(all_reduce), CallSite(all_reduce)) if tensor_parallel else (
            None, None)
        self.eps = cfg.rms_norm_eps
        self.input_norm = w[p + "input_layernorm.weight"]
        self.post_norm = w[p + "post_attention_layernorm.weight"]
        self.attn = LatentAttention(cfg, w, p, cos_sin, dtype) if cfg.is_mla else SelfAttention(cfg, w, p, cos_sin)
        if cfg.layer_is_moe(i):
            self.mlp = DeepseekMoE(cfg, w, p) if cfg.arch in MLA_ARCHS.values() else SparseMoE(cfg, w, p)
        else:
            self.mlp = GatedMLP(*(w[f"{p}mlp.{n}_proj.weight"] for n in ("gate", "up", "down")))
        self.first_norm, self.add_norm_in, self.add_norm_post = (CallSite(rms_norm), CallSite(fused_add_rms_norm),
                                                                 CallSite(fused_add_rms_norm))

    def __call__(self, key, x, residual, batch, kv):
        if residual is None:
            residual, x = x, self.first_norm(key, x, self.input_norm, self.eps)
        else:
            x, residual = self.add_norm_in(key, x, residual, self.input_norm, self.eps)
        x = self.attn(key, x, batch, kv)
        if self.reduce_attn is not None:
            x = self.reduce_attn(key, x)
        x, residual = self.add_norm_post(key, x, residual, self.post_norm, self.eps)
        x = self.mlp(key, x)
        if self.reduce_mlp is not None:
            x = self.reduce_mlp(key, x)
        return x, residual


class DecoderModel:
    """``forward(input_ids [T], batch, kv_caches) -> hidden [T, hidden]``; ``logits(hidden) -> [N, vocab]`` fp32.

    ``kv_caches`` holds one (key_cache, value_cache) pair per layer, each
    [num_blocks, block_size, num_kv_heads, head_dim] in the model dtype, or for MLA one latent cache per layer
    (ModelConfig.kv_cache_layout). With ``quantize_activations`` every
    GGUF-quantized matrix multiplies activations rounded to Q8 blocks (ops.gguf_linear_q8act, llama.cpp's CPU
    arithmetic); otherwise activations stay in ``dtype`` (ops.gguf_linear). Weights are moved to ``device``.
    ``tensor_parallel`` (rank, world): ``cfg`` and ``weights`` are that rank's share (tensor_parallel.shard_model);
    the forward pass all-reduces the embedding and each layer's attention and MLP outputs over the default process
    group (ops.all_reduce), and ``logits`` all-gathers the vocabulary slices."""

    def __init__(self, cfg: ModelConfig, weights: dict, dtype: torch.dtype = torch.float32, device="cpu",
                 quantize_activations: bool = False, tensor_parallel: tuple[int, int] | None = None):
        if cfg.arch not in SUPPORTED_ARCHS.values():
            raise ValueError(f"unsupported architecture {cfg.arch!r}; supported: {sorted(SUPPORTED_ARCHS)}")
        self.cfg, self.dtype, self.device = cfg, dtype, torch.device(device)
        self.quantize_activations = quantize_activations
        # Everything the forward pass reads lives on the platform's device, moved once here (one tensor at a
        # time, so the host copy of each can be freed by the caller as it goes).
        weights = {name: to_device(w, self.device)
                   for name, w in native_int4(weights, quantize_activations, dtype).items()}
        if quantize_activations:
            # the Q8-activation op takes the 32-element block types; K-quant weights keep their activations
            weights = {name: dataclasses.replace(w, quantize_activations=True)
                       if isinstance(w, QuantizedWeight) and w.qtype in GGUF_QTYPES else w
                       for name, w in weights.items()}
        cos_sin = build_cos_sin_cache(cfg.max_position, cfg.rotary_dim, cfg.rope_theta, torch.float32,
                                      cfg.rope_scaling, device=self.device)
        self.embed_tokens = weights["model.embed_tokens.weight"]
        self.layers = [DecoderLayer(cfg, weights, i, cos_sin, dtype, tensor_parallel is not None)
                       for i in range(cfg.num_layers)]
        self.norm = weights["model.norm.weight"]
        self.lm_head = weights.get("lm_head.weight", self.embed_tokens if cfg.tie_word_embeddings else None)
        if self.lm_head is None:
            raise ValueError("the checkpoint has no lm_head.weight and does not tie embeddings")
        # Each op call site resolves its kernel once per step shape (CallSite), not on every call.
        self.embed_site = Embedding(self.embed_tokens, dtype)
        self.vocab_slice = None  # tensor parallel: (lo, hi, world) of this rank's vocabulary rows
        if tensor_parallel is not None:
            from .tensor_parallel import vocab_range

            rank, world = tensor_parallel
            lo, hi = vocab_range(cfg.vocab_size, rank, world)
            self.vocab_slice = (lo, hi, world)
            self.reduce_embed = CallSite(all_reduce)
        self.final_norm = CallSite(fused_add_rms_norm)
        self.lm_head_site = Linear(self.lm_head)

    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch, kv_caches) -> torch.Tensor:
        # Every op argument's dtype, device, shape and contiguity in this step follows from these (the weights,
        # caches and dtype are fixed): the key each CallSite caches its kernel choice under.
        tables = batch.block_tables.shape
        key = (input_ids.shape[0], tables[0], tables[1] if len(tables) > 1 else 0, batch.is_decode)
        if self.vocab_slice is None:
            x = self.embed_site(key, input_ids)
        else:  # this rank's vocabulary rows, zeros for the others' ids, summed over the ranks
            lo, hi, _ = self.vocab_slice
            local = input_ids - lo
            mine = (local >= 0) & (local < hi - lo)
            x = self.embed_site(key, torch.where(mine, local, 0)) * mine[:, None].to(self.dtype)
            x = self.reduce_embed(key, x)
        residual = None
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(key, x, residual, batch, kv)
        x, _ = self.final_norm(key, x, residual, self.norm, self.cfg.rms_norm_eps)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [N, vocab] of hidden [N, hidden]. Tensor parallel: every rank must call it on the same rows
        (the slices are all-gathered)."""
        out = self.lm_head_site((hidden.shape, hidden.is_contiguous()), hidden).float()
        if self.vocab_slice is None:
            return out
        lo, hi, world = self.vocab_slice
        per = -(-self.cfg.vocab_size // world)
        if out.shape[1] < per:  # the last slice, short of the others
            out = torch.nn.functional.pad(out, (0, per - out.shape[1]))
        parts = all_gather(out)  # [world, N, per]
        return parts.permute(1, 0, 2).reshape(out.shape[0], world * per)[:, :self.cfg.vocab_size]
