"""Decode steps captured as device graphs, one per batch-size bucket, and replayed (vLLM's CUDA graphs).

A decode step is hundreds of small kernel launches; replaying a captured graph issues them all at once, which is
what lets single-request decode approach the weight-read roofline on a GPU. Every bucket reads its inputs from one
set of static buffers: a real batch of n sequences is copied into their first n rows, the rest of the bucket is
padding (slot -1: nothing is written to the cache; one attended token; its logits are discarded). The block-table
width is the one for ``max_model_len``, so any sequence fits.

Capture needs every op on the decode path to be capture-safe (no host reads); the platform decides whether it
can capture at all (``Platform.capture_graph``). When a capture fails the runner says why once and stays eager.

Where a capture also computes (``Platform.graph_capture_computes``: the CPU records its kernel calls while running
them), nothing is captured at start-up: a bucket's first real step runs eagerly (resolving every call site's kernel
outside the capture), its second is the capture, and later ones replay. Start-up pays nothing, and only the
buckets a workload uses hold memory.
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
        dev, big, w = model.device, max_num_seqs, self.width
        # All per-step inputs live in two device buffers (int64: ids, positions, slots, then the rows and
        # sources of inputs taken from the device; int32: seq_lens, then the block tables row by row), each
        # filled by ONE copy from a pinned host twin: a step costs two host-to-device copies and no pinned
        # allocation. The host twins come in two sets used in turn: with async scheduling a step is prepared
        # while the previous one's copies may still be queued (the one before that has completed: the engine
        # waited for its sampled tokens).
        self._dev64 = torch.zeros(5 * big, dtype=torch.int64, device=dev)
        self._dev32 = torch.zeros(big * (1 + w), dtype=torch.int32, device=dev)
        pin = dev.type != "cpu" and torch.accelerator.is_available()
        self._host = []
        # On the host the device buffers are their own twins: a step's kernels have finished when the next step's
        # inputs are written (no copy to skip past; each cold torch call costs tens of us there).
        host = dev.type == "cpu"
        for _ in range(2):
            host64 = self._dev64 if host else torch.zeros(5 * big, dtype=torch.int64, pin_memory=pin)
            host32 = self._dev32 if host else torch.zeros(big * (1 + w), dtype=torch.int32, pin_memory=pin)
            h64, h32 = host64.numpy(), host32.numpy()
            h32[:big] = 1  # padding rows attend to one token
            h64[2 * big:3 * big] = -1  # and write nothing
            self._host.append((host64, host32, h64, h32))
        self._turn = 0
        self._dev64.copy_(self._host[0][0])
        self._dev32.copy_(self._host[0][1])
        self._outputs: dict[tuple[int, int], torch.Tensor] = {}  # (bucket, n) -> the first n rows of its logits
        self.ids, self.positions, self.slots, self._dst, self._src = self._dev64.view(5, big)
        self.seq_lens = self._dev32[:big]
        self.tables = self._dev32[big:].view(big, w)
        self.big = big
        self.cu = torch.arange(big + 1, dtype=torch.int32, device=dev)
        self.rows = torch.arange(big, dtype=torch.int64, device=dev)
        self.graphs: dict[int, tuple] = {}  # bucket -> (replay, logits)
        self.disabled: str | None = None
        self.lazy = platform.graph_capture_computes
        self._warm: set[int] = set()  # lazy: buckets whose eager first step has run

    def capture(self) -> None:
        """Capture every bucket, largest first (later ones reuse its memory pool); lazily: nothing yet."""
        if self.lazy:
            return
        pool = None
        for b in sorted(self.buckets, reverse=True):
            try:
                self._forward(b)  # eager warm-up: compiles kernels and fills the dispatch cache off the graph
                self.platform.synchronize()
                replay, logits, pool = self.platform.capture_graph(lambda b=b: self._forward(b), pool)
            except Exception as exc:
                self._drop_graphs()
                self.disabled = f"{type(exc).__name__}: {exc}"
                log.warning("decode graphs disabled, decode runs eagerly: capture of batch size %d failed: %s",
                            b, self.disabled)
                return
            self._set_graph(b, replay, logits)

    def _forward(self, b: int) -> torch.Tensor:
        batch = ForwardBatch(positions=self.positions[:b], slot_mapping=self.slots[:b], block_tables=self.tables[:b],
                             seq_lens=self.seq_lens[:b], cu_seqlens_q=self.cu[:b + 1], is_decode=True,
                             logits_indices=self.rows[:b])
        hidden = self.model.forward(self.ids[:b], batch, self.kv_caches)
        return self.model.logits(hidden)

    def forget(self) -> None:
        """Lazy graphs only: drop the captured buckets, so each is captured again on its next uses (a tool that
        wraps the kernels to time them does this to time the replayed calls too)."""
        if not self.lazy:
            raise RuntimeError("DecodeGraphs.forget: graphs captured at start-up cannot be captured again")
        self._drop_graphs()
        self._warm.clear()

    def _set_graph(self, b: int, replay, logits: torch.Tensor) -> None:
        self.graphs[b] = (replay, logits)
        self._outputs = {key: v for key, v in self._outputs.items() if key[0] != b}  # views of the old logits

    def _drop_graphs(self) -> None:
        self.graphs.clear()
        self._outputs.clear()

    def bucket_for(self, n: int) -> int | None:
        if self.disabled is not None:
            return None
        if self.lazy:
            return next((b for b in self.buckets if b >= n), None)
        if not self.graphs:
            return None
        return next((b for b in self.buckets if b >= n and b in self.graphs), None)

    def run(self, b: int, ids, positions, slots, tables, seq_lens, fix=None) -> torch.Tensor:
        """Replay bucket ``b`` on the n <= b sequences given (host lists); returns their logits [n, vocab] (a view
        of the graph's output, valid until the next replay). ``fix``: (rows, source rows, tokens) — input ids
        taken from a device tensor of tokens instead of ``ids`` (async scheduling; see ModelRunner.run)."""
        n, big, w = len(ids), self.big, self.width
        host64, host32, h64, h32 = self._host[self._turn]
        self._turn ^= 1
        h64[:n] = ids
        h64[n:b] = 0  # padding rows read a valid token (a row may hold a placeholder from an earlier step)
        h64[big:big + n] = positions
        h64[2 * big:2 * big + n] = slots
        h64[2 * big + n:2 * big + b] = -1  # padding rows write nothing
        k = 0
        if fix is not None:
            dst, src, tokens = fix
            k = len(dst)
            h64[dst] = 0  # never a placeholder in the buffer, not even in rows a later, smaller bucket leaves
            h64[3 * big:3 * big + k] = dst
            h64[4 * big:4 * big + k] = src
        h32[:n] = seq_lens
        h32[n:b] = 1
        rows = h32[big:big + b * w].reshape(b, w)
        for i, t in enumerate(tables):
            rows[i, :len(t)] = t
        if host64 is not self._dev64:
            self._dev64.copy_(host64, non_blocking=True)
            self._dev32[:big + b * w].copy_(host32[:big + b * w], non_blocking=True)
        if k:
            if dst == src == list(range(k)):  # the usual case: the same sequences in the same order
                self.ids[:k].copy_(tokens[:k])
            else:
                self.ids.index_copy_(0, self._dst[:k], tokens.index_select(0, self._src[:k]))
        entry = self.graphs.get(b)
        if entry is None:  # lazy: not captured yet
            return self._first_uses(b)[:n]
        replay, logits = entry
        replay()
        out = self._outputs.get((b, n))
        if out is None:  # a view made once: slicing anew each step cost ~40 us on a CPU (cold, after the step)
            out = self._outputs[(b, n)] = logits[:n]
        return out

    def _first_uses(self, b: int) -> torch.Tensor:
        """A lazy bucket's first step (eager) or second (the capture, which computes it); its logits."""
        if b not in self._warm:
            self._warm.add(b)
            return self._forward(b)
        try:
            replay, logits, _ = self.platform.capture_graph(lambda: self._forward(b))
        except Exception as exc:
            self._drop_graphs()
            self.disabled = f"{type(exc).__name__}: {exc}"
            log.warning("decode graphs disabled, decode runs eagerly: capture of batch size %d failed: %s",
                        b, self.disabled)
            # The capture may have stopped midway; the step again, eagerly (its KV writes repeat the same values).
            return self._forward(b)
        self._set_graph(b, replay, logits)
        return logits
