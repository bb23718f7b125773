"""ForwardBatch: the per-step metadata the model runner hands the model, passed explicitly (no globals)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    """A flat batch of T new tokens from B sequences.

    ``positions`` [T] int64 and ``slot_mapping`` [T] int64 (KV-cache slot of each new token);
    ``block_tables`` [B, max_blocks] int32; ``seq_lens`` [B] int32: tokens in the cache after this step;
    ``cu_seqlens_q`` [B+1] int32: where each sequence's new tokens start in the flat batch;
    ``is_decode``: every sequence has exactly one new token (the decode attention kernel applies);
    ``logits_indices`` [N] int64: rows of the hidden states whose next-token logits are needed.
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    is_decode: bool
    logits_indices: torch.Tensor
