"""Memory planning: does the model fit the device, and how many KV-cache blocks does the rest hold.

Accelerator platforms size the KV cache from ``platform.memory_info()`` with ``gpu_memory_utilization``
(vLLM's knob: the fraction of the device's total memory this engine may use for weights, activations and
KV cache together). Host platforms keep a fixed default budget, since taking most of the machine's RAM for
a KV cache would starve everything else on it. Every check here runs before anything large is allocated on
the device, so a model or cache that does not fit is a clear error, not an out-of-memory crash mid-way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from engine.core.models.config import ModelConfig
from engine.core.models.weights import Weight, weight_bytes

GIB = 1 << 30


class DeviceMemoryError(ValueError):
    """The model or KV cache asked for does not fit the device."""


def weight_nbytes(weights: Iterable[Weight]) -> int:
    return sum(weight_bytes(w) for w in weights)


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    tensors, heads, channels = cfg.kv_cache_layout
    return tensors * cfg.num_layers * heads * channels * dtype.itemsize


def activation_reserve(cfg: ModelConfig, dtype: torch.dtype, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """A generous bound on the transient memory of one step: per batched token the residual stream, q/k/v,
    the attention output and the MLP's gate/up/down (fp32 upcasts included), and per sequence fp32 logits
    plus the sampler's copies of them."""
    inter = max(cfg.intermediate_size, cfg.moe_intermediate_size * max(cfg.num_experts_per_tok, 1))
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    per_token = (6 * cfg.hidden_size + 2 * qkv + 4 * inter) * max(dtype.itemsize, 4)
    return max_num_batched_tokens * per_token + max_num_seqs * cfg.vocab_size * 4 * 4


def usable_bytes(free: int, total: int, utilization: float) -> int:
    """What this engine may take: ``utilization`` of the total, less what others already hold."""
    if not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    return int(total * utilization) - (total - free)


def check_weights_fit(nbytes: int, free: int, total: int, utilization: float, device: str) -> int:
    """Raise DeviceMemoryError unless ``nbytes`` of weights fit; returns the usable budget."""
    budget = usable_bytes(free, total, utilization)
    if nbytes > budget:
        raise DeviceMemoryError(
            f"the model's weights need {nbytes / GIB:.2f} GiB but {device} has {budget / GIB:.2f} GiB usable "
            f"({free / GIB:.2f} GiB free of {total / GIB:.2f} GiB, gpu_memory_utilization={utilization}); "
            "use a smaller or more quantized model, free the device, or raise gpu_memory_utilization")
    return budget


def plan_kv_blocks(cfg: ModelConfig, dtype: torch.dtype, block_size: int, max_model_len: int, budget: int,
                   weights_bytes: int, max_num_batched_tokens: int, max_num_seqs: int, device: str) -> int:
    """KV-cache blocks that fit in ``budget`` after the weights and the activation reserve; at least one
    full-length sequence (``max_model_len`` tokens) must fit, else DeviceMemoryError says what to change."""
    reserve = activation_reserve(cfg, dtype, max_num_batched_tokens, max_num_seqs)
    block_bytes = kv_bytes_per_token(cfg, dtype) * block_size
    blocks = (budget - weights_bytes - reserve) // block_bytes
    need = math.ceil(max_model_len / block_size)
    if blocks < need:
        raise DeviceMemoryError(
            f"the KV cache for one {max_model_len}-token sequence needs {need * block_bytes / GIB:.2f} GiB, but "
            f"{device} has {max(budget - weights_bytes - reserve, 0) / GIB:.2f} GiB left after the weights "
            f"({weights_bytes / GIB:.2f} GiB) and activations ({reserve / GIB:.2f} GiB); lower max_model_len or "
            "max_num_batched_tokens, or raise gpu_memory_utilization")
    return int(blocks)


def check_kv_fits(num_blocks: int, block_size: int, cfg: ModelConfig, dtype: torch.dtype, budget: int,
                  weights_bytes: int, device: str) -> None:
    """An explicitly sized KV cache must fit in what the weights leave."""
    need = num_blocks * block_size * kv_bytes_per_token(cfg, dtype)
    left = budget - weights_bytes
    if need > left:
        raise DeviceMemoryError(f"a KV cache of {num_blocks} blocks needs {need / GIB:.2f} GiB but {device} has "
                                f"{left / GIB:.2f} GiB left after the weights; ask for fewer blocks")
