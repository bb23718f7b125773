"""GGUF files (llama, qwen2, qwen3; MoE: Mixtral as llama, qwen2moe, qwen3moe) -> ModelConfig + HF-named weights.

Q4_0 / Q4_1 / Q8_0 and Q4_K / Q5_K / Q6_K matrices (what Q4_K_M, Q5_K_M and Q6_K files hold) stay in their
blocks as QuantizedWeight unless ``dequantize`` is set; F32 / F16 / BF16 tensors become float tensors in the
requested dtype; every other quantization type (Q5_0, Q5_1, Q2_K, Q3_K, the I-quants, ...) is dequantized with
``gguf.quants.dequantize`` (through fp32) and then cast to the requested dtype. A load that expands quantized
tensors says so once, with the memory it costs (a warning; at info level when ``dequantize`` asked for it).

llama-architecture files store the attn_q / attn_k rows permuted for llama.cpp's rotary layout
(convert_hf_to_gguf.py permutes them); we undo that exactly as transformers does at GGUF load.
For quantized weights the permutation reorders whole rows, so it is applied to the raw rows.

MoE files hold each layer's experts as one 3-D tensor per projection (``ffn_gate_exps`` [E, I, hidden], ...); they
are split into the per-expert matrices the models stack (``mlp.experts.{e}.gate_proj.weight``), quantized ones as
views of their raw rows, and run by ``fused_moe_gguf`` in their blocks. Files that store every expert as its own
tensor (llama.cpp's format before 2024) are refused.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import torch

from engine.core.models.config import ModelConfig
from engine.core.models.weights import QuantizedWeight, Weight

from .errors import ModelLoadError
from .gguf_file import field, require

log = logging.getLogger("engine")

SUPPORTED_GGUF_ARCHS = ("llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe")
# GGUF MoE architecture -> (the models' architecture, whether the kept top-k weights are renormalized to sum 1)
_MOE_ARCHS = {"llama": ("mixtral", True), "qwen2moe": ("qwen2_moe", False), "qwen3moe": ("qwen3_moe", True)}
KEEP_QUANTIZED = {2: "Q4_0", 3: "Q4_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
F32, F16, BF16 = 0, 1, 30
# Tensor types that are not block-quantized: floats and integers (I8, I16, I32, I64, F64).
_PLAIN_TYPES = {F32, F16, BF16, 24, 25, 26, 27, 28}

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
          "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
          "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "ffn_gate_inp": "mlp.gate",
          "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
          "ffn_down_shexp": "mlp.shared_expert.down_proj", "ffn_gate_inp_shexp": "mlp.shared_expert_gate"}
_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_MIXTRAL = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}  # HF Mixtral's names for them
_BLK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str | None:
    """The HF-style name of a GGUF tensor name, or None for tensors the models do not use."""
    m = _BLK.match(gguf_name)
    if m:
        part = _LAYER.get(m.group(2))
        return f"model.layers.{m.group(1)}.{part}.{m.group(3)}" if part else None
    base, _, kind = gguf_name.rpartition(".")
    return f"{_TOP[base]}.{kind}" if base in _TOP and kind in ("weight", "bias") else None


def gguf_config(reader, path: str) -> ModelConfig:
    """ModelConfig from ``general.architecture`` and the ``{arch}.*`` metadata."""
    arch = require(reader, "general.architecture", path)
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise ModelLoadError(f"{path}: GGUF architecture {arch!r} is not supported; supported GGUF architectures: "
                             f"{', '.join(SUPPORTED_GGUF_ARCHS)}")
    moe = _moe_config(reader, arch, path)

    def get(key, default=None):
        key = f"{arch}.{key}"
        return field(reader, key, default) if default is not None else require(reader, key, path)

    hidden, heads = get("embedding_length"), get("attention.head_count")
    kv_heads = get("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        if len(set(kv_heads)) != 1:
            raise ModelLoadError(f"{path}: per-layer KV head counts {sorted(set(kv_heads))} are not supported")
        kv_heads = kv_heads[0]
    head_dim = field(reader, f"{arch}.attention.key_length") or (hidden // heads if heads else 0)
    rot = field(reader, f"{arch}.rope.dimension_count")
    if rot is not None and rot != head_dim:
        raise ModelLoadError(f"{path}: partial rotary ({rot} of {head_dim} head dims) is not supported")
    names = {t.name for t in reader.tensors}
    if "token_embd.weight" not in names:
        raise ModelLoadError(f"{path} has no token_embd.weight tensor; the file is incomplete")
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    model_arch = moe.pop("arch", arch)
    return ModelConfig(
        arch=model_arch, vocab_size=int(emb.shape[-1]), hidden_size=hidden,
        intermediate_size=field(reader, f"{arch}.feed_forward_length", 0) if moe else get("feed_forward_length"),
        num_layers=get("block_count"), num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        max_position=get("context_length"), rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        **moe,
        rope_theta=float(get("rope.freq_base", 10000.0)), rope_scaling=_rope_scaling(reader, arch),
        tie_word_embeddings="output.weight" not in names, attention_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id"))


def _moe_config(reader, arch: str, path: str) -> dict:
    """ModelConfig's MoE fields (with the models' ``arch``) for a MoE file, {} for a dense one."""
    experts = field(reader, f"{arch}.expert_count", 0)
    if arch in ("qwen2moe", "qwen3moe") and not experts:
        raise ModelLoadError(f"{path}: a {arch} file without {arch}.expert_count")
    if not experts:
        return {}
    names = {t.name for t in reader.tensors}
    if "blk.0.ffn_gate_exps.weight" not in names:
        raise ModelLoadError(f"{path}: its experts are not stored as one ffn_gate_exps / ffn_up_exps / ffn_down_exps "
                             "tensor per layer (llama.cpp's layout since 2024); convert the model again with a "
                             "current convert_hf_to_gguf.py")
    model_arch, renormalize = _MOE_ARCHS[arch]
    gate = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate_exps.weight")
    used = int(require(reader, f"{arch}.expert_used_count", path))
    out = dict(arch=model_arch, num_experts=int(experts), num_experts_per_tok=used,
               moe_intermediate_size=int(gate.shape[1]), norm_topk_prob=renormalize)
    if "blk.0.ffn_gate_shexp.weight" in names:
        shared = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate_shexp.weight")
        out["shared_expert_intermediate_size"] = int(shared.shape[1])
    return out


def _rope_scaling(reader, arch: str) -> dict | None:
    """HF-style rope_scaling from ``{arch}.rope.scaling.*``; a ``rope_freqs`` tensor (Llama 3.1 style per-dimension
    divisors of the inverse frequencies) becomes {"rope_type": "freq_factors", "freq_factors": [...]}."""
    kind = field(reader, f"{arch}.rope.scaling.type")
    factor = field(reader, f"{arch}.rope.scaling.factor") or field(reader, f"{arch}.rope.scale_linear")
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        return {"rope_type": "freq_factors", "freq_factors": np.asarray(freqs.data, dtype=np.float32).tolist()}
    if kind in (None, "none") and not factor:
        return None
    kind = kind or "linear"
    if kind not in ("linear", "yarn"):
        raise ModelLoadError(f"GGUF rope scaling {kind!r} is not supported (linear and yarn are)")
    out = {"rope_type": kind, "factor": float(factor or 1.0)}
    orig = field(reader, f"{arch}.rope.scaling.original_context_length")
    if orig:
        out["original_max_position_embeddings"] = int(orig)
    return out


def unpermute_order(rows: int, n_heads: int) -> np.ndarray:
    """The row order that undoes llama.cpp's q/k row permutation (transformers' reverse_permute): row i of the
    HF tensor is row order[i] of the GGUF one."""
    if rows % (2 * n_heads):
        raise ModelLoadError(f"a q/k tensor of {rows} rows cannot be split into {n_heads} heads of rotary pairs")
    return np.arange(rows).reshape(n_heads, rows // n_heads // 2, 2).transpose(0, 2, 1).reshape(-1)


def _host(data: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    """A mapped tensor's array as it is (no copy: its pages are read from the file when first used, as llama.cpp
    does), or a copy with its rows gathered in ``order``."""
    return data if order is None else np.take(data, order, axis=0)


def _tensor(t, dtype: torch.dtype, dequantize: bool, order: np.ndarray | None) -> Weight:
    """One tensor as a Weight; ``order`` (or None) reorders its rows (see unpermute_order)."""
    qtype = int(t.tensor_type)
    shape = tuple(reversed(t.shape))  # GGUF lists dims innermost first
    if qtype in (F32, F16):
        return torch.from_numpy(_host(t.data, order)).reshape(shape).to(dtype)
    if qtype == BF16:
        return torch.from_numpy(_host(t.data, order)).view(torch.bfloat16).reshape(shape).to(dtype)
    if qtype in KEEP_QUANTIZED and len(shape) in (2, 3) and not dequantize:  # 3-D: experts, as their rows
        rows = int(np.prod(shape[:-1]))
        raw = torch.from_numpy(_host(t.data, order)).reshape(rows, -1)
        return QuantizedWeight(raw=raw, qtype=qtype, rows=rows, cols=shape[-1])
    import gguf  # the other quantization types, and any type when dequantizing

    values = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType(qtype))
    values = np.ascontiguousarray(values if order is None else values[order], dtype=np.float32)
    return torch.from_numpy(values).reshape(shape).to(dtype)


def _split_experts(w: Weight, experts: int, name: str) -> list[Weight]:
    """A layer's [E * rows, cols] (quantized) or [E, rows, cols] expert tensor as E matrices (views)."""
    if isinstance(w, QuantizedWeight):
        rows = w.rows // experts
        return [QuantizedWeight(raw=w.raw[e * rows:(e + 1) * rows], qtype=w.qtype, rows=rows, cols=w.cols)
                for e in range(experts)]
    if w.dim() != 3 or w.shape[0] != experts:
        raise ModelLoadError(f"{name} has shape {list(w.shape)}; expected [{experts}, rows, cols]")
    return list(w.unbind(0))


def gguf_weights(reader, config: ModelConfig, dtype: torch.dtype, dequantize: bool) -> dict[str, Weight]:
    """HF-named weights of a GGUF file (tensors the models do not use, like rope_freqs, are left out)."""
    weights: dict[str, Weight] = {}
    expanded: dict[int, list[int]] = {}  # quantized type -> [tensors, bytes in the file, bytes as floats]
    permuted = field(reader, "general.architecture") == "llama"  # llama.cpp's rotary row order (Mixtral too)
    for t in reader.tensors:
        m = _BLK.match(t.name)
        experts = _EXPERTS.get(m.group(2)) if m else None
        name = hf_name(t.name)
        if name is None and experts is None:
            continue
        order = None
        if permuted and (".attn_q." in t.name or ".attn_k." in t.name):
            heads = config.num_heads if ".attn_q." in t.name else config.num_kv_heads
            order = unpermute_order(t.shape[-1], heads)
        w = _tensor(t, dtype, dequantize, order)
        if experts is not None:
            moe = "block_sparse_moe" if config.arch == "mixtral" else "mlp"
            part = _MIXTRAL[experts] if config.arch == "mixtral" else experts
            for e, we in enumerate(_split_experts(w, config.num_experts, t.name)):
                weights[f"model.layers.{m.group(1)}.{moe}.experts.{e}.{part}.weight"] = we
        elif config.arch == "mixtral" and name.endswith(".mlp.gate.weight"):
            weights[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = w
        elif name.endswith("shared_expert_gate.weight"):
            weights[name] = w.reshape(1, -1)  # [hidden] in some files, [1, hidden] in others
        else:
            weights[name] = w
        if int(t.tensor_type) not in _PLAIN_TYPES and not isinstance(w, QuantizedWeight):
            stats = expanded.setdefault(int(t.tensor_type), [0, 0, 0])
            stats[0] += 1
            stats[1] += int(t.n_bytes)
            stats[2] += w.nbytes
    if expanded:
        _tell_expanded(expanded, dtype, dequantize)
    return weights


def expanded_message(expanded: dict[int, list[int]], dtype: torch.dtype, dequantize: bool) -> str:
    """The one line a load prints when it expands quantized GGUF tensors to floats (``expanded``: type ->
    [tensors, bytes in the file, bytes as floats])."""
    import gguf

    def type_name(qtype: int) -> str:
        try:
            return gguf.GGMLQuantizationType(qtype).name
        except ValueError:
            return f"type {qtype}"

    kinds = ", ".join(f"{type_name(q)} ({n} tensor{'s' if n != 1 else ''})"
                      for q, (n, _, _) in sorted(expanded.items()))
    file_bytes = sum(s[1] for s in expanded.values())
    float_bytes = sum(s[2] for s in expanded.values())
    dtype_name = str(dtype).removeprefix("torch.")
    why = ("dequantize=True" if dequantize else
           f"the engine keeps only {', '.join(KEEP_QUANTIZED.values())} matrices quantized")
    return (f"engine: GGUF {kinds} weights are expanded to {dtype_name} at load ({why}): {_size(float_bytes)} in "
            f"memory instead of {_size(file_bytes)} in the file")


def _tell_expanded(expanded: dict[int, list[int]], dtype: torch.dtype, dequantize: bool) -> None:
    """Warn that quantized tensors were expanded (info level when the caller asked for it with ``dequantize``)."""
    log.log(logging.INFO if dequantize else logging.WARNING, "%s", expanded_message(expanded, dtype, dequantize))


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def load_gguf(path: str, dtype: torch.dtype, dequantize: bool):
    """(config, weights, tokenizer) of the GGUF file at ``path``."""
    from .gguf_file import open_gguf
    from .gguf_tokenizer import gguf_tokenizer

    reader = open_gguf(path)
    config = gguf_config(reader, path)
    tokenizer = gguf_tokenizer(reader, path)
    return config, gguf_weights(reader, config, dtype, dequantize), tokenizer
