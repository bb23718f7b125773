"""What a checkpoint becomes in memory (``engine doctor --model``): its architecture, its format, which matrices stay
quantized in which form, which are expanded, and the bytes each takes, from the real loader (the load runs on the
host; nothing goes to a device)."""

from __future__ import annotations

import logging
from collections import defaultdict

import torch

from engine.core.models.weights import Fp8Weight, Int4Weight, Int8Weight, Nvfp4Weight, QuantizedWeight, weight_bytes

from .checkpoint import load_checkpoint

MIB = 2**20


def _kind(w) -> str:
    if isinstance(w, QuantizedWeight):
        import gguf

        name = gguf.GGMLQuantizationType(w.qtype).name
        if name in ("Q4_0", "Q8_0"):  # models.weights.native_int4
            op = "int4_linear" if name == "Q4_0" else "int8_linear"
            return f"GGUF {name} blocks ({op}, groups of 32, where the platform has that kernel)"
        return f"GGUF {name} blocks"
    if isinstance(w, Fp8Weight):
        acts = "static activations" if w.input_scale is not None else (
            "1x128 activation groups" if w.act_group else "per-token activations")
        return f"FP8 {w.q.dtype} per {w.granularity}, {acts}"
    if isinstance(w, Nvfp4Weight):
        return "NVFP4 (e2m1, e4m3 scales per 16)"
    if isinstance(w, Int4Weight):
        zero = "zero points" if w.zero is not None else "symmetric"
        return (f"INT4 groups of {w.group_size}, {str(w.scale.dtype).removeprefix('torch.')} scales, {zero} "
                "(int4_linear; GGUF Q4 blocks where the platform has no int4_linear kernel)")
    if isinstance(w, Int8Weight):
        zero, elsewhere = ("zero points", "expanded to the activation dtype") if w.zero is not None else (
            "symmetric", "GGUF Q8_0 blocks")
        return (f"INT8 groups of {w.group_size}, {str(w.scale.dtype).removeprefix('torch.')} scales, {zero} "
                f"(int8_linear; {elsewhere} where the platform has no int8_linear kernel)")
    return f"{str(w.dtype).removeprefix('torch.')} (unquantized)"


def describe(path: str | None, dtype: torch.dtype = torch.bfloat16) -> dict:
    """The summary of the model at ``path`` (None: the built-in default) loaded for ``dtype``; the loader's own
    messages (what it expanded and why) under "messages"."""
    messages: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler, logger = _Collect(level=logging.INFO), logging.getLogger("engine")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        ckpt = load_checkpoint(None if path in (None, "default") else path, dtype=dtype)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for w in ckpt.weights.values():
        g = groups[_kind(w)]
        g[0] += 1
        g[1] += weight_bytes(w)
    cfg = ckpt.config
    tensors, heads, channels = cfg.kv_cache_layout
    return {
        "source": ckpt.source, "architecture": cfg.arch, "layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
        "experts": cfg.num_experts, "context": cfg.max_position, "dtype": str(dtype).removeprefix("torch."),
        "weights": {k: {"tensors": n, "MiB": round(b / MIB, 1)} for k, (n, b) in sorted(groups.items())},
        "weights_MiB": round(sum(b for _, b in groups.values()) / MIB, 1),
        "kv_cache_bytes_per_token": tensors * cfg.num_layers * heads * channels * dtype.itemsize,
        "kv_cache": "latent (MLA)" if cfg.is_mla else f"{heads} KV heads x {channels}",
        "messages": messages,
    }


def format_summary(s: dict) -> list[str]:
    experts = f", {s['experts']} experts" if s["experts"] else ""
    lines = [f"Model: {s['source']}", f"  architecture: {s['architecture']}, {s['layers']} layers, hidden "
             f"{s['hidden_size']}{experts}, context {s['context']}",
             f"  in memory ({s['dtype']} activations): {s['weights_MiB']} MiB of weights"]
    lines += [f"    {k}: {v['tensors']} tensors, {v['MiB']} MiB" for k, v in s["weights"].items()]
    lines.append(f"  KV cache: {s['kv_cache']}, {s['kv_cache_bytes_per_token']} bytes per token")
    lines += [f"  loader: {m}" for m in s["messages"]]
    return lines
