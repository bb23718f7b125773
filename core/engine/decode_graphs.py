"""Decode steps captured as device graphs, one per batch-size bucket, and replayed (vLLM's CUDA graphs).

A decode step is hundreds of small kernel launches; replaying a captured graph issues them all at once, which is
what lets single-request decode approach the weight-read roofline on a GPU. Every bucket reads its inputs from one
set of static buffers: a real batch of n sequences is copied into their first n rows, the rest of the bucket is
padding (slot -1: nothing is written to the cache; one attended token; its logits are discarded). The block-table
width is the one for ``max_model_len``, so any sequence fits.

Capture needs every op on the decode path to be capture-safe (no host reads); the platform decides whether it
can capture at all (``Platform.capture_graph``). When a capture fails the runner says why once and stays eager.
"""

from __future__ import annotations

import logging
import math

import torch

from engine.core.models.batch import ForwardBatch
from engine.core.models.decoder import DecoderModel

log = logging.getLogger("engine")


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to ``max_num_seqs`` (which is always the last bucket)."""
    out = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    out += list(range(16, max_num_seqs, 8))
    return out + [max_num_seqs]


class DecodeGraphs:
    """``run(ids, positions, slots, tables, seq_lens) -> logits [n, vocab]`` for a pure decode step of n
    sequences (host lists), by replaying the smallest captured bucket that holds n."""

    def __init__(self, platform, model: DecoderModel, kv_caches, block_size: int, max_model_len: int,
                 max_num_seqs: int):
        self.platform, self.model, self.kv_caches = platform, model, kv_caches
        self.buckets = batch_buckets(max_num_seqs)
        self.width = math.ceil(max_model_len / block_size)
        dev, big = model.device, max_num_seqs
        self.ids = torch.zeros(big, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(big, dtype=torch.int64, device=dev)
        self.slots = torch.full((big,), -1, dtype=torch.int64, device=dev)
        self.tables = torch.zeros((big, self.width), dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(big, dtype=torch.int32, device=dev)
        self.cu = torch.arange(big + 1, dtype=torch.int32, device=dev)
        self.rows = torch.arange(big, dtype=torch.int64, device=dev)
        self.graphs: dict[int, tuple] = {}  # bucket -> (replay, logits)
        self.disabled: str | None = None

    def capture(self) -> None:
        """Capture every bucket, largest first (later ones reuse its memory pool)."""
        pool = None
        for b in sorted(self.buckets, reverse=True):
            try:
                self._forward(b)  # eager warm-up: compiles kernels and fills the dispatch cache off the graph
                self.platform.synchronize()
                replay, logits, pool = self.platform.capture_graph(lambda b=b: self._forward(b), pool)
            except Exception as exc:
                self.graphs.clear()
                self.disabled = f"{type(exc).__name__}: {exc}"
                log.warning("decode graphs disabled, decode runs eagerly: capture of batch size %d failed: %s",
                            b, self.disabled)
                return
            self.graphs[b] = (replay, logits)

    def _forward(self, b: int) -> torch.Tensor:
        batch = ForwardBatch(positions=self.positions[:b], slot_mapping=self.slots[:b], block_tables=self.tables[:b],
                             seq_lens=self.seq_lens[:b], cu_seqlens_q=self.cu[:b + 1], is_decode=True,
                             logits_indices=self.rows[:b])
        hidden = self.model.forward(self.ids[:b], batch, self.kv_caches)
        return self.model.logits(hidden)

    def bucket_for(self, n: int) -> int | None:
        if not self.graphs:
            return None
        return next((b for b in self.buckets if b >= n and b in self.graphs), None)

    def run(self, b: int, ids, positions, slots, tables, seq_lens, upload) -> torch.Tensor:
        """Replay bucket ``b`` on the n <= b sequences given (host lists; ``upload(list, dtype)`` makes device
        tensors); returns their logits [n, vocab] (a view of the graph's output, valid until the next replay)."""
        n = len(ids)
        self.ids[:n].copy_(upload(ids, torch.int64), non_blocking=True)
        self.positions[:n].copy_(upload(positions, torch.int64), non_blocking=True)
        self.slots[:n].copy_(upload(slots, torch.int64), non_blocking=True)
        self.seq_lens[:n].copy_(upload(seq_lens, torch.int32), non_blocking=True)
        w = len(tables[0])
        self.tables[:n, :w].copy_(upload(tables, torch.int32), non_blocking=True)
        if n < b:  # padding rows: write nothing, attend to one token
            self.slots[n:b].fill_(-1)
            self.seq_lens[n:b].fill_(1)
        replay, logits = self.graphs[b]
        replay()
        return logits[:n]
