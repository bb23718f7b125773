"""HF model directories: config.json + *.safetensors + tokenizer.json."""

from __future__ import annotations

import logging
import os
import re

import torch

from engine.core.models.weights import (
    Fp8Weight,
    Int4Weight,
    Int8Weight,
    Nvfp4Weight,
    QuantizedWeight,
    dense_weight,
    int4_as_gguf,
    int8_as_gguf,
    weight_bytes,
)
from engine.core.ops.fp8 import BLOCK_K

from .errors import ModelLoadError
from .hf_config import hf_config, read_json
from .hf_nvfp4 import modelopt_config
from .hf_quant import quant_scheme
from .hf_tokenizer import hf_tokenizer
from .safetensors_weights import load_safetensors, safetensors_files

log = logging.getLogger("engine")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def load_hf(model_dir: str, dtype: torch.dtype):
    """(config, weights, tokenizer) of the HF model in ``model_dir``. Weight names stay as the checkpoint
    writes them; a tied checkpoint's stored lm_head.weight and old rotary inv_freq buffers are dropped."""
    config = hf_config(model_dir)
    files = safetensors_files(model_dir)
    tokenizer = hf_tokenizer(model_dir, config.eos_token_ids)
    qc = read_json(os.path.join(model_dir, "config.json")).get("quantization_config") or modelopt_config(model_dir)
    scheme = quant_scheme(qc, model_dir) if qc else None
    # Layers past num_hidden_layers are not the model's: DeepSeek-V3 ships its multi-token-prediction layer there.
    def past_the_last_layer(name: str) -> bool:
        m = _LAYER.match(name)
        return m is not None and int(m[1]) >= config.num_layers

    weights = load_safetensors(files, dtype, keep=scheme.keeps if scheme else None, skip=past_the_last_layer)
    if scheme is not None:
        weights = _packed(scheme, weights, qc.get("quant_method"), model_dir, dtype)
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    for name in [n for n in weights if n.endswith("rotary_emb.inv_freq")]:
        del weights[name]
    return config, weights, tokenizer


def _packed(scheme, weights: dict, method: str, model_dir: str, dtype: torch.dtype) -> dict:
    """The quantized checkpoint's weights with each quantized matrix as one object, said at INFO level."""
    weights = scheme.pack(weights, model_dir)
    quantized = {n: w for n, w in weights.items()
                 if isinstance(w, (Fp8Weight, Nvfp4Weight, QuantizedWeight, Int4Weight, Int8Weight))}
    experts = [n for n in quantized if ".experts." in n]
    for n in experts:  # 4- and 8-bit experts run fused_moe_gguf, on GGUF blocks (8-bit: symmetric ones, as Q8_0)
        if isinstance(quantized[n], Int4Weight) or (isinstance(quantized[n], Int8Weight) and (
                quantized[n].zero is None or bool((quantized[n].zero == 128).all()))):
            quantized[n] = weights[n] = _as_gguf(quantized[n], n, model_dir)
    _expand_experts(weights, quantized, experts, dtype, model_dir)
    if "model.embed_tokens.weight" in quantized:
        raise ModelLoadError(f"{model_dir}: a quantized embedding table is not supported")
    log.info("engine: %s: %s checkpoint; %d matrices kept quantized (%s), %.1f MiB with their scales; the rest "
             "(embeddings, norms, unquantized layers) in %s", model_dir, method, len(quantized), scheme.description,
             sum(weight_bytes(w) for w in quantized.values()) / 2**20, str(dtype).removeprefix("torch."))
    return weights


def _as_gguf(w: Int4Weight | Int8Weight, name: str, model_dir: str) -> QuantizedWeight:
    try:
        return int4_as_gguf(w) if isinstance(w, Int4Weight) else int8_as_gguf(w)
    except ValueError as exc:
        raise ModelLoadError(f"{model_dir}: {name}: {exc}") from exc


def _expand_reason(w) -> str | None:
    """Why an expert matrix cannot stay quantized (None if a MoE op takes it: fused_moe_gguf INT4 and symmetric INT8
    experts repacked to GGUF blocks; fused_moe_nvfp4 NVFP4 experts; fused_moe_fp8 per-tensor or per-channel FP8
    scales with dynamic per-token activations, or whole 128x128 blocks with dynamic 1x128 activation groups)."""
    if isinstance(w, (QuantizedWeight, Nvfp4Weight)):
        return None
    if isinstance(w, Int8Weight):
        return "8-bit experts with zero points (GGUF Q8_0 blocks have none)"
    if w.granularity == "block":
        if w.input_scale is not None or w.act_group != BLOCK_K:
            return "FP8 128x128 weight blocks without 1x128 dynamic activation groups"
        if any(d % BLOCK_K for d in w.shape):
            return "FP8 128x128 weight blocks of a matrix that is not whole blocks"
        return None
    if w.input_scale is not None or w.act_group:
        return "FP8 static or grouped activation scales"
    return None


def _expand_experts(weights: dict, quantized: dict, experts: list[str], dtype: torch.dtype, model_dir: str) -> None:
    """Expert matrices no MoE kernel takes yet, expanded to ``dtype`` in ``weights`` (and dropped from
    ``quantized``), with one warning that says which, why and the memory it costs."""
    reasons = {n: why for n in experts if (why := _expand_reason(quantized[n])) is not None}
    if not reasons:
        return
    before = sum(weight_bytes(quantized[n]) for n in reasons)
    for n in reasons:
        weights[n] = dense_weight(quantized.pop(n), dtype)
    log.warning("engine: %s: %d expert matrices (%s) are expanded to %s (%.1f MiB instead of %.1f): no MoE kernel "
                "takes them yet; per-tensor or per-channel FP8 experts with dynamic activations, and whole 128x128 "
                "blocks with 1x128 activation groups, stay in FP8 (as NVFP4 and INT4 experts stay 4-bit)",
                model_dir, len(reasons), ", ".join(sorted(set(reasons.values()))), str(dtype).removeprefix("torch."),
                sum(weights[n].nbytes for n in reasons) / 2**20, before / 2**20)
