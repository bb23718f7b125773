"""Tensor parallelism, Megatron-style: one rank's share of a decoder's config and weights (dense and MoE).

Each rank holds a slice of every layer: column-parallel q/k/v and gate/up (rows of W: its heads, its part of the
intermediate size; for MoE, of every expert's and the shared expert's, the router whole) and row-parallel o/down
(the matching columns of W: each rank's product is a partial sum, and the model all-reduces it before the residual
add; a row-parallel bias stays on rank 0 only, so it is added once).
Heads are split by KV-head groups, as evenly as the KV heads allow (SmolLM2-135M's 9 query / 3 KV heads on 2 ranks:
6 + 3 query heads over 2 + 1 KV heads), so every rank's attention is ordinary GQA over its own heads and KV cache.
Embedding and LM head are vocab-parallel: each rank holds an equal slice of the vocabulary's rows (the vocabulary
padded to a multiple of the ranks); a rank embeds the ids in its slice (zero rows for the others) and the ranks
all-reduce, and each computes its slice of the logits, which an all-gather puts together. Norms stay whole.

Weights are sliced as they are stored: dense tensors by index, GGUF blocks (QuantizedWeight) by whole rows and by
whole blocks along K (a column range must start and end on a block boundary: 32 values, 256 for K-quants).
"""

from __future__ import annotations

import dataclasses

import torch

from engine.core.ops.gguf_kquants import K_QTYPES
from engine.core.ops.gguf_quant import ALL_QTYPES

from .config import ModelConfig
from .weights import Int4Weight, Int8Weight, QuantizedWeight, int4_as_gguf, int8_as_gguf


class TensorParallelError(ValueError):
    """A model or weight this tensor-parallel split cannot take; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class HeadRange:
    """Rank's query heads [q_lo, q_hi) and KV heads [kv_lo, kv_hi)."""

    q_lo: int
    q_hi: int
    kv_lo: int
    kv_hi: int


def split_evenly(n: int, world: int) -> list[tuple[int, int]]:
    """[lo, hi) of each of ``world`` parts of range(n), the first ``n % world`` one longer."""
    base, extra = divmod(n, world)
    out, lo = [], 0
    for r in range(world):
        hi = lo + base + (r < extra)
        out.append((lo, hi))
        lo = hi
    return out


def head_ranges(num_heads: int, num_kv_heads: int, world: int) -> list[HeadRange]:
    """Each rank's heads: KV heads split as evenly as they go, each with its group of query heads."""
    if num_kv_heads < world:
        raise TensorParallelError(f"tensor_parallel_size {world} is more than the model's {num_kv_heads} KV heads; "
                                  f"use at most {num_kv_heads} (replicated KV heads are not supported yet)")
    group = num_heads // num_kv_heads
    return [HeadRange(lo * group, hi * group, lo, hi) for lo, hi in split_evenly(num_kv_heads, world)]


def _block(w: QuantizedWeight) -> tuple[int, int]:
    """(values per block, bytes per block) of a GGUF weight."""
    if w.qtype not in ALL_QTYPES:
        raise TensorParallelError(f"GGUF type {w.qtype} is not known to the tensor-parallel split")
    _, block, size = ALL_QTYPES[w.qtype]
    return block, size


def _as_blocks(w):
    """4- and 8-bit group-quantized weights are split as the GGUF blocks they also are."""
    try:
        if isinstance(w, Int4Weight):
            return int4_as_gguf(w)
        if isinstance(w, Int8Weight):
            return int8_as_gguf(w)
    except ValueError as exc:
        raise TensorParallelError(f"this weight cannot be split across ranks: {exc}") from exc
    return w


def shard_rows(w, lo: int, hi: int):
    """Rows [lo, hi) of a weight (output features), or of a bias vector."""
    w = _as_blocks(w)
    if isinstance(w, QuantizedWeight):
        return dataclasses.replace(w, raw=w.raw[lo:hi].contiguous(), rows=hi - lo)
    if isinstance(w, torch.Tensor):
        return w[lo:hi].contiguous()
    raise TensorParallelError(f"{type(w).__name__} weights cannot be split across ranks yet (dense and GGUF can): "
                              "run this checkpoint with tensor_parallel_size=1")


def shard_cols(w, lo: int, hi: int):
    """Columns [lo, hi) of a weight (input features); GGUF weights only on block boundaries."""
    w = _as_blocks(w)
    if isinstance(w, QuantizedWeight):
        block, size = _block(w)
        if lo % block or hi % block:
            kind = "K-quant" if w.qtype in K_QTYPES else "GGUF"
            raise TensorParallelError(f"columns [{lo}, {hi}) of a {kind} weight do not fall on its {block}-value "
                                      "blocks; choose a tensor_parallel_size that divides the shapes into whole "
                                      "blocks, or load the model with dequantize=True")
        return dataclasses.replace(w, raw=w.raw[:, lo // block * size:hi // block * size].contiguous(), cols=hi - lo)
    if isinstance(w, torch.Tensor):
        return w[:, lo:hi].contiguous()
    raise TensorParallelError(f"{type(w).__name__} weights cannot be split across ranks yet (dense and GGUF can): "
                              "run this checkpoint with tensor_parallel_size=1")


def vocab_range(vocab_size: int, rank: int, world: int) -> tuple[int, int]:
    """[lo, hi) of ``rank``'s vocabulary rows: equal slices of ceil(vocab / world) (all-gather takes equal sizes),
    the last one cut at the vocabulary's end (the model pads it back)."""
    per = -(-vocab_size // world)
    return min(rank * per, vocab_size), min((rank + 1) * per, vocab_size)


def shard_model(cfg: ModelConfig, weights: dict, rank: int, world: int) -> tuple[ModelConfig, dict]:
    """(config, weights) of ``rank``'s share of a dense decoder. The config's head and intermediate counts become the
    rank's (its vocab_size stays the whole vocabulary's: the model reads its slice from vocab_range); the weights
    dict keeps its names."""
    if not 0 <= rank < world:
        raise TensorParallelError(f"rank {rank} is outside a tensor-parallel group of {world}")
    if world == 1:
        return cfg, dict(weights)
    if cfg.is_mla:
        raise TensorParallelError(f"tensor parallelism does not cover {cfg.arch} (latent attention) yet: use "
                                  "tensor_parallel_size=1")
    heads = head_ranges(cfg.num_heads, cfg.num_kv_heads, world)[rank]
    d = cfg.head_dim

    def mine(n: int) -> tuple[int, int]:
        return split_evenly(n, world)[rank]

    q = (heads.q_lo * d, heads.q_hi * d)
    kv = (heads.kv_lo * d, heads.kv_hi * d)
    out = {}
    for name, w in weights.items():
        if ".self_attn." in name and name.endswith(("q_proj.weight", "q_proj.bias")):
            out[name] = shard_rows(w, *q)
        elif ".self_attn." in name and name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight",
                                                      "v_proj.bias")):
            out[name] = shard_rows(w, *kv)
        elif name.endswith("o_proj.weight"):
            out[name] = shard_cols(w, *q)
        elif name.endswith(("gate_proj.weight", "up_proj.weight")) or _mixtral_expert(name, ("w1", "w3")):
            out[name] = shard_rows(w, *mine(w.shape[0]))  # every MLP (dense, expert, shared) in equal parts
        elif name.endswith("down_proj.weight") or _mixtral_expert(name, ("w2",)):
            out[name] = shard_cols(w, *mine(w.shape[1]))
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            out[name] = shard_rows(w, *vocab_range(cfg.vocab_size, rank, world))
        elif name.endswith(("o_proj.bias", "down_proj.bias")):
            if rank == 0:  # added once, after the all-reduce would otherwise sum it world times
                out[name] = w
        else:  # norms (q/k norms act per head_dim): whole on every rank
            out[name] = w
    sizes = {f: (lambda r: r[1] - r[0])(mine(getattr(cfg, f)))
             for f in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")}
    local = dataclasses.replace(cfg, num_heads=heads.q_hi - heads.q_lo, num_kv_heads=heads.kv_hi - heads.kv_lo,
                                **sizes)
    return local, out


def _mixtral_expert(name: str, projections: tuple[str, ...]) -> bool:
    """Mixtral's expert weights: ``...block_sparse_moe.experts.{e}.w1.weight`` (w1 gate, w3 up, w2 down)."""
    return ".experts." in name and name.rsplit(".", 2)[-2] in projections
