"""config.json (HF transformers, v4 or v5 layout) -> ModelConfig."""

from __future__ import annotations

import json
import os

from engine.core.models.config import SUPPORTED_ARCHS, ModelConfig

from .errors import ModelLoadError

_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                "qwen3_moe": "Qwen3MoeForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
                "deepseek_v3": "DeepseekV3ForCausalLM"}


def read_json(path: str) -> dict:
    """A JSON object from ``path``; ModelLoadError when it is not valid JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path} cannot be read as JSON ({e}); restore it from the model's source") from e
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def as_id_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _rope(cfg: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from v5 ``rope_parameters`` or v4 ``rope_theta`` + ``rope_scaling``."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or params)
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    scaling.pop("rope_theta", None)
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if scaling.get("rope_type", "default") == "default":
        return theta, None
    return theta, scaling


def hf_config(model_dir: str) -> ModelConfig:
    """ModelConfig of the HF model in ``model_dir``; ModelLoadError for what the models cannot run."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{model_dir} has no config.json; an HF model directory needs config.json, "
                             "*.safetensors and tokenizer.json (or pass a *.gguf file)")
    cfg = read_json(path)
    archs = cfg.get("architectures") or [_MODEL_TYPES.get(cfg.get("model_type"), str(cfg.get("model_type")))]
    name = next((a for a in archs if a in SUPPORTED_ARCHS), None)
    if name is None:
        raise ModelLoadError(f"{path}: architecture {archs} is not supported; supported: "
                             f"{', '.join(sorted(SUPPORTED_ARCHS))}")
    arch = SUPPORTED_ARCHS[name]
    if cfg.get("quantization_config") is not None and not isinstance(cfg["quantization_config"], dict):
        raise ModelLoadError(f"{path}: quantization_config must be an object")
    act = cfg.get("hidden_act", cfg.get("hidden_activation", "silu"))
    if act != "silu":
        raise ModelLoadError(f"{path}: hidden_act {act!r} is not supported (only silu)")
    if cfg.get("mlp_bias"):
        raise ModelLoadError(f"{path}: mlp_bias=true is not supported")
    try:
        return _build(cfg, arch)
    except KeyError as e:
        raise ModelLoadError(f"{path} lacks the field {e.args[0]!r}, which {name} needs") from e
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"{path} has a field of the wrong type ({e})") from e


def _build(cfg: dict, arch: str) -> ModelConfig:
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    theta, scaling = _rope(cfg)
    attention_bias = {"qwen2": True, "qwen2_moe": bool(cfg.get("qkv_bias", True)),
                      "mixtral": False}.get(arch, bool(cfg.get("attention_bias", False)))
    moe: dict = {}
    if arch == "mixtral":
        moe = dict(num_experts=int(cfg["num_local_experts"]), moe_intermediate_size=int(cfg["intermediate_size"]),
                   norm_topk_prob=True)
    elif arch in ("qwen2_moe", "qwen3_moe"):
        experts = cfg.get("num_experts", cfg.get("num_local_experts"))
        if experts is None:
            raise KeyError("num_experts")
        moe = dict(num_experts=int(experts), moe_intermediate_size=int(cfg["moe_intermediate_size"]),
                   norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                   decoder_sparse_step=int(cfg.get("decoder_sparse_step", 1)),
                   mlp_only_layers=[int(i) for i in cfg.get("mlp_only_layers") or []])
        if arch == "qwen2_moe":
            moe["shared_expert_intermediate_size"] = int(cfg["shared_expert_intermediate_size"])
    elif arch in ("deepseek_v2", "deepseek_v3"):
        moe = _deepseek(cfg, arch)
    if moe:
        moe["num_experts_per_tok"] = int(cfg["num_experts_per_tok"])
    eos = as_id_list(cfg.get("eos_token_id"))
    return ModelConfig(
        arch=arch, vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size") or 0), num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"]) if arch.startswith("deepseek")
        else int(cfg.get("head_dim") or (hidden // heads if heads else 0)),
        max_position=_context_length(cfg), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta, rope_scaling=scaling, tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=attention_bias, qk_norm=arch in ("qwen3", "qwen3_moe"),
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos, **moe)


def _deepseek(cfg: dict, arch: str) -> dict:
    """DeepSeek-V2/V3's MoE and MLA fields, routed as HF's DeepseekV2/V3 do: V3 sigmoid scores with a bias for the
    choice, groups ranked by their two best, renormalized if norm_topk_prob; V2 softmax scores, greedy or groups
    ranked by their best ("group_limited_greedy"), never renormalized; both scaled by routed_scaling_factor."""
    if cfg.get("attention_bias"):
        raise ValueError("attention_bias=true: DeepSeek models with projection biases are not supported")
    v3 = arch == "deepseek_v3"
    scoring = cfg.get("scoring_func", "sigmoid" if v3 else "softmax")
    if scoring != ("sigmoid" if v3 else "softmax"):
        raise ValueError(f"scoring_func {scoring!r}: {arch} routes with {'sigmoid' if v3 else 'softmax'} scores")
    groups = dict(n_group=int(cfg.get("n_group") or 1), topk_group=int(cfg.get("topk_group") or 1))
    if not v3:
        method = cfg.get("topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise ValueError(f"topk_method {method!r}: DeepSeek-V2 routes 'greedy' or 'group_limited_greedy'")
        if method == "greedy":
            groups = dict(n_group=1, topk_group=1)
    inter = int(cfg["moe_intermediate_size"])
    return dict(num_experts=int(cfg["n_routed_experts"]), moe_intermediate_size=inter,
                shared_expert_intermediate_size=inter * int(cfg.get("n_shared_experts") or 0),
                router_scoring=scoring, norm_topk_prob=v3 and bool(cfg.get("norm_topk_prob", True)), **groups,
                routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
                first_k_dense_replace=int(cfg.get("first_k_dense_replace", 0)),
                q_lora_rank=int(cfg.get("q_lora_rank") or 0), kv_lora_rank=int(cfg["kv_lora_rank"]),
                qk_nope_head_dim=int(cfg["qk_nope_head_dim"]), qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
                v_head_dim=int(cfg["v_head_dim"]),
                rope_interleave=bool(cfg.get("rope_interleave", True)) if v3 else True)  # V2: complex = pairs


def _context_length(cfg: dict) -> int:
    """max_position_embeddings, capped at an active sliding window: engine attends over the whole context,
    which equals sliding-window attention only while the context fits in the window."""
    n = int(cfg.get("max_position_embeddings", 4096))
    window = cfg.get("sliding_window")
    if isinstance(window, int) and window > 0 and cfg.get("use_sliding_window", True):
        n = min(n, window)
    return n
