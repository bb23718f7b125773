"""Checking that a checkpoint's weights are the ones its config promises, with the shapes the models expect."""

from __future__ import annotations

from engine.core.models.config import ModelConfig
from engine.core.models.weights import Weight

from .errors import ModelLoadError


def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight a model of config ``c`` needs (HF names)."""
    h, d = c.hidden_size, c.head_dim
    q, kv = c.num_heads * d, c.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
        shapes |= _mlp_shapes(c, i, p)
        if c.is_mla:
            shapes |= _mla_shapes(c, p + "self_attn.")
            continue
        shapes |= {p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q)}
        if c.attention_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)}
        if c.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
    return shapes


def _mla_shapes(c: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    h, heads, rank, rope = c.hidden_size, c.num_heads, c.kv_lora_rank, c.qk_rope_head_dim
    qk = c.qk_nope_head_dim + rope
    out = {p + "kv_a_proj_with_mqa.weight": (rank + rope, h), p + "kv_a_layernorm.weight": (rank,),
           p + "kv_b_proj.weight": (heads * (c.qk_nope_head_dim + c.v_head_dim), rank),
           p + "o_proj.weight": (h, heads * c.v_head_dim)}
    if c.q_lora_rank:
        return out | {p + "q_a_proj.weight": (c.q_lora_rank, h), p + "q_a_layernorm.weight": (c.q_lora_rank,),
                      p + "q_b_proj.weight": (heads * qk, c.q_lora_rank)}
    return out | {p + "q_proj.weight": (heads * qk, h)}


def _mlp_shapes(c: ModelConfig, i: int, p: str) -> dict[str, tuple[int, ...]]:
    h = c.hidden_size

    def gated(prefix: str, inter: int, names=("gate_proj", "up_proj", "down_proj")) -> dict[str, tuple[int, ...]]:
        g, u, dn = (f"{prefix}{n}.weight" for n in names)
        return {g: (inter, h), u: (inter, h), dn: (h, inter)}

    if not c.layer_is_moe(i):
        return gated(p + "mlp.", c.intermediate_size)
    e, inter = c.num_experts, c.moe_intermediate_size
    if c.arch == "mixtral":
        out = {p + "block_sparse_moe.gate.weight": (e, h)}
        for x in range(e):
            out |= gated(f"{p}block_sparse_moe.experts.{x}.", inter, ("w1", "w3", "w2"))
        return out
    out = {p + "mlp.gate.weight": (e, h)}
    for x in range(e):
        out |= gated(f"{p}mlp.experts.{x}.", inter)
    if c.is_mla:  # DeepSeek: ungated shared experts, one MLP of their summed width
        return out | (gated(p + "mlp.shared_experts.", c.shared_expert_intermediate_size)
                      if c.shared_expert_intermediate_size else {})
    if c.shared_expert_intermediate_size:
        out |= gated(p + "mlp.shared_expert.", c.shared_expert_intermediate_size)
        out[p + "mlp.shared_expert_gate.weight"] = (1, h)
    return out


def check_config(c: ModelConfig, source: str) -> None:
    """ModelLoadError when the config's sizes are not positive integers or do not fit together."""
    sizes = {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "num_layers": c.num_layers,
             "num_heads": c.num_heads, "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
             "max_position": c.max_position}
    if not c.is_moe or c.mlp_only_layers or c.decoder_sparse_step > 1:
        sizes["intermediate_size"] = c.intermediate_size
    if c.is_moe:
        sizes |= {"num_experts_per_tok": c.num_experts_per_tok, "moe_intermediate_size": c.moe_intermediate_size}
    bad = [f"{k}={v!r}" for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v <= 0]
    if bad:
        raise ModelLoadError(f"{source}: the model config has invalid sizes ({', '.join(bad)}); the file is "
                             "corrupted or not a model this loader reads")
    if c.num_heads % c.num_kv_heads:
        raise ModelLoadError(f"{source}: {c.num_heads} attention heads cannot be shared by {c.num_kv_heads} KV heads")
    if c.num_experts_per_tok > c.num_experts:
        raise ModelLoadError(f"{source}: {c.num_experts_per_tok} experts per token but only {c.num_experts} experts")


def check_weights(config: ModelConfig, weights: dict[str, Weight], source: str) -> None:
    """ModelLoadError naming the first missing or misshapen weights; extra weights (e.g. o_proj.bias) pass."""
    expected = expected_shapes(config)
    missing = [n for n in expected if n not in weights]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelLoadError(f"{source} lacks weights its config needs: {', '.join(missing[:3])}{more}. "
                             "The checkpoint is incomplete or does not match its config.")
    wrong = [f"{n} is {list(weights[n].shape)}, expected {list(s)}" for n, s in expected.items()
             if tuple(weights[n].shape) != s]
    if wrong:
        raise ModelLoadError(f"{source} has weights whose shapes do not match its config: {'; '.join(wrong[:3])}")
