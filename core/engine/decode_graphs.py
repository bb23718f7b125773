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

Speculative verify steps (each sequence's last token plus up to k drafts) replay too, where captures compute:
graphs keyed by (bucket, q), q = k + 1 <= ``MAX_VERIFY_TOKENS`` query tokens per sequence, every sequence a chunk
of exactly q rows. A sequence with r < k drafts fills its chunk from the front with q - 1 - r tokens it already
computed (their KV is in the cache: their slots are -1, so nothing is rewritten; their logits are dropped), so one
graph serves any mix of draft lengths. Only the verify graphs stop when such a capture fails.
"""

from __future__ import annotations

import logging
import math

import torch

from engine.core.models.batch import ForwardBatch
from engine.core.models.decoder import DecoderModel

log = logging.getLogger("engine")


# Query tokens per sequence a verify graph takes (k = 8 drafts): the static buffers hold this many rows a sequence.
MAX_VERIFY_TOKENS = 9


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
        rows = big * MAX_VERIFY_TOKENS  # token rows: a verify step of q tokens a sequence uses q of them per sequence
        # All per-step inputs live in two device buffers (int64: ids, positions, slots, then the rows and
        # sources of inputs taken from the device; int32: seq_lens, then the block tables row by row), each
        # filled by ONE copy from a pinned host twin: a step costs two host-to-device copies and no pinned
        # allocation. The host twins come in two sets used in turn: with async scheduling a step is prepared
        # while the previous one's copies may still be queued (the one before that has completed: the engine
        # waited for its sampled tokens).
        self._dev64 = torch.zeros(3 * rows + 2 * big, dtype=torch.int64, device=dev)
        self._dev32 = torch.zeros(big * (1 + w), dtype=torch.int32, device=dev)
        pin = dev.type != "cpu" and torch.accelerator.is_available()
        self._host = []
        # On the host the device buffers are their own twins: a step's kernels have finished when the next step's
        # inputs are written (no copy to skip past; each cold torch call costs tens of us there).
        host = dev.type == "cpu"
        for _ in range(2):
            host64 = self._dev64 if host else torch.zeros(3 * rows + 2 * big, dtype=torch.int64, pin_memory=pin)
            host32 = self._dev32 if host else torch.zeros(big * (1 + w), dtype=torch.int32, pin_memory=pin)
            h64, h32 = host64.numpy(), host32.numpy()
            h32[:big] = 1  # padding rows attend to one token
            h64[2 * rows:3 * rows] = -1  # and write nothing
            self._host.append((host64, host32, h64, h32))
        self._turn = 0
        self._dev64.copy_(self._host[0][0])
        self._dev32.copy_(self._host[0][1])
        self._outputs: dict[tuple[int, int], torch.Tensor] = {}  # (bucket, n) -> the first n rows of its logits
        self.ids, self.positions, self.slots = self._dev64[:3 * rows].view(3, rows)
        self._dst, self._src = self._dev64[3 * rows:].view(2, big)
        self.seq_lens = self._dev32[:big]
        self.tables = self._dev32[big:].view(big, w)
        self.big, self.num_rows = big, rows
        # cu_seqlens_q of every sequence holding q rows, one tensor per q (graphs read them where they were captured)
        self._cu = {q: torch.arange(0, q * big + 1, q, dtype=torch.int32, device=dev)
                    for q in range(1, MAX_VERIFY_TOKENS + 1)}
        self.cu = self._cu[1]
        self.rows = torch.arange(rows, dtype=torch.int64, device=dev)
        self.graphs: dict[int, tuple] = {}  # bucket -> (replay, logits)
        self.verify_graphs: dict[tuple[int, int], tuple] = {}  # (bucket, q) -> (replay, logits)
        self.disabled: str | None = None
        self.lazy = platform.graph_capture_computes
        # Verify graphs are captured on first use, which only a capture that computes makes free (GPUs: not yet).
        self.verify_disabled: str | None = None if self.lazy else "verify steps replay only where captures compute"
        self._warm: set = set()  # lazy: buckets (and (bucket, q) verify keys) whose eager first step has run

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

    def _forward(self, b: int, q: int = 1) -> torch.Tensor:
        """The step of bucket ``b`` with ``q`` query rows a sequence, on the static buffers; logits of every row."""
        t = b * q
        batch = ForwardBatch(positions=self.positions[:t], slot_mapping=self.slots[:t], block_tables=self.tables[:b],
                             seq_lens=self.seq_lens[:b], cu_seqlens_q=self._cu[q][:b + 1], is_decode=q == 1,
                             logits_indices=self.rows[:t])
        hidden = self.model.forward(self.ids[:t], batch, self.kv_caches)
        return self.model.logits(hidden)

    def forget(self) -> None:
        """Lazy graphs only: drop the captured buckets, so each is captured again on its next uses (a tool that
        wraps the kernels to time them does this to time the replayed calls too)."""
        if not self.lazy:
            raise RuntimeError("DecodeGraphs.forget: graphs captured at start-up cannot be captured again")
        self._drop_graphs()
        self._warm.clear()

    def _set_graph(self, key, replay, logits: torch.Tensor) -> None:
        """``key``: a bucket (decode) or (bucket, q) (verify)."""
        (self.graphs if isinstance(key, int) else self.verify_graphs)[key] = (replay, logits)
        self._outputs = {k: v for k, v in self._outputs.items() if k[0] != key}  # views of the old logits

    def _drop_graphs(self, verify_only: bool = False) -> None:
        if not verify_only:
            self.graphs.clear()
        self.verify_graphs.clear()
        self._outputs = {k: v for k, v in self._outputs.items() if verify_only and isinstance(k[0], int)}

    def bucket_for(self, n: int) -> int | None:
        if self.disabled is not None:
            return None
        if self.lazy:
            return next((b for b in self.buckets if b >= n), None)
        if not self.graphs:
            return None
        return next((b for b in self.buckets if b >= n and b in self.graphs), None)

    def verify_bucket_for(self, n: int, q: int) -> int | None:
        """The bucket a verify step of n sequences with q query rows each replays in, or None (run it eagerly)."""
        if self.verify_disabled is not None or q > MAX_VERIFY_TOKENS:
            return None
        return self.bucket_for(n)

    def _fill(self, b: int, q: int, ids, positions, slots, tables, seq_lens, dst=(), src=()) -> None:
        """Write a step of len(seq_lens) sequences of q rows each into the next host twin and, off the host, copy
        it to the device buffers; the bucket's other sequences become padding. ``dst``/``src``: rows whose input id
        comes from the device (zeroed here; see ``run``) and their source rows."""
        n, t, big, w, rows_ = len(seq_lens), len(ids), self.big, self.width, self.num_rows
        host64, host32, h64, h32 = self._host[self._turn]
        self._turn ^= 1
        h64[:t] = ids
        h64[t:b * q] = 0  # padding rows read a valid token (a row may hold a placeholder from an earlier step)
        if dst:
            h64[dst] = 0  # never a placeholder in the buffer, not even in rows a later, smaller bucket leaves
            h64[3 * rows_:3 * rows_ + len(dst)] = dst
            h64[3 * rows_ + big:3 * rows_ + big + len(src)] = src
        h64[rows_:rows_ + t] = positions
        h64[rows_ + t:rows_ + b * q] = 0
        h64[2 * rows_:2 * rows_ + t] = slots
        h64[2 * rows_ + t:2 * rows_ + b * q] = -1  # padding rows write nothing
        h32[:n] = seq_lens
        h32[n:b] = q  # a padding sequence's q rows attend to 1..q tokens (of whatever its table row points at)
        table_rows = h32[big:big + b * w].reshape(b, w)
        for i, row in enumerate(tables):
            table_rows[i, :len(row)] = row
        if host64 is not self._dev64:
            self._dev64.copy_(host64, non_blocking=True)
            self._dev32[:big + b * w].copy_(host32[:big + b * w], non_blocking=True)

    def run(self, b: int, ids, positions, slots, tables, seq_lens, fix=None) -> torch.Tensor:
        """Replay bucket ``b`` on the n <= b sequences given (host lists); returns their logits [n, vocab] (a view
        of the graph's output, valid until the next replay). ``fix``: (rows, source rows, tokens) — input ids
        taken from a device tensor of tokens instead of ``ids`` (async scheduling; see ModelRunner.run)."""
        if fix is None:
            self._fill(b, 1, ids, positions, slots, tables, seq_lens)
            return self._replay(b, b, len(ids))
        dst, src, tokens = fix
        k = len(dst)
        self._fill(b, 1, ids, positions, slots, tables, seq_lens, dst, src)
        if dst == src == list(range(k)):  # the usual case: the same sequences in the same order
            self.ids[:k].copy_(tokens[:k])
        else:
            self.ids.index_copy_(0, self._dst[:k], tokens.index_select(0, self._src[:k]))
        return self._replay(b, b, len(ids))

    def run_verify(self, b: int, q: int, ids, positions, slots, tables, seq_lens) -> torch.Tensor:
        """Replay the verify graph (b, q) on n = len(seq_lens) <= b sequences of exactly q rows each (host lists,
        ``ids`` etc. n * q long); returns the logits of their rows [n * q, vocab] (a view, valid until the next
        replay)."""
        self._fill(b, q, ids, positions, slots, tables, seq_lens)
        return self._replay((b, q), b, len(ids))

    def _replay(self, key, b: int, rows: int) -> torch.Tensor:
        entry = (self.graphs if isinstance(key, int) else self.verify_graphs).get(key)
        if entry is None:  # lazy: not captured yet
            return self._first_uses(key)[:rows]
        replay, logits = entry
        replay()
        out = self._outputs.get((key, rows))
        if out is None:  # a view made once: slicing anew each step cost ~40 us on a CPU (cold, after the step)
            out = self._outputs[(key, rows)] = logits[:rows]
        return out

    def _first_uses(self, key) -> torch.Tensor:
        """A lazy graph's first step (eager) or second (the capture, which computes it); its logits. ``key``: a
        bucket, or (bucket, q) for a verify graph."""
        b, q = (key, 1) if isinstance(key, int) else key
        if key not in self._warm:
            self._warm.add(key)
            return self._forward(b, q)
        try:
            replay, logits, _ = self.platform.capture_graph(lambda: self._forward(b, q))
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if q == 1:
                self._drop_graphs()
                self.disabled = reason
                log.warning("decode graphs disabled, decode runs eagerly: capture of batch size %d failed: %s",
                            b, reason)
            else:
                self._drop_graphs(verify_only=True)
                self.verify_disabled = reason
                log.warning("verify graphs disabled, speculative verify steps run eagerly: capture of batch size %d "
                            "with %d tokens a sequence failed: %s", b, q, reason)
            # The capture may have stopped midway; the step again, eagerly (its KV writes repeat the same values).
            return self._forward(b, q)
        self._set_graph(key, replay, logits)
        return logits
