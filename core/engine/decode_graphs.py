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

Speculative verify steps (each sequence's last token plus its drafts) replay too: graphs keyed by (bucket, T), T a
row bucket (``VERIFY_ROW_BUCKETS``, at most ``MAX_VERIFY_ROWS``) holding every sequence's chunk plus padding. They
are captured on a key's second use wherever the platform captures (a capture that only records, as on GPUs, is
then replayed to compute that step; the decode graphs' memory pool is shared). The padding goes first to the front
of real sequences' chunks, as tokens they already computed (their KV is in the cache: their slots are -1, so nothing
is rewritten; their logits are dropped), then to the bucket's padding sequences. Only the verify graphs stop when
such a capture fails.
"""

from __future__ import annotations

import logging
import math

import torch

from engine.core.models.batch import ForwardBatch
from engine.core.models.decoder import DecoderModel

log = logging.getLogger("engine")


# Token rows of the verify graphs: a verify step of t rows over n sequences replays in the smallest bucket that holds
# t plus one row for each padding sequence. Larger steps run eagerly: a CPU graph keeps every intermediate tensor
# alive (~1.4 MiB a row for the built-in model, mostly logits), and at 64 rows the Python it saves matters less.
MAX_VERIFY_ROWS = 64
VERIFY_ROW_BUCKETS = (*range(2, 9), 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, MAX_VERIFY_ROWS)
# Bytes the verify graphs may hold together (what their captures allocated, ``_graph_bytes``): past it the least
# recently replayed are dropped (captured again if used again), and a graph larger than it alone runs eagerly. The
# built-in model holds ~1.4 MiB a row; an 8B-shaped one ~6.
VERIFY_GRAPH_BYTES = 1 << 30


def _graph_bytes(replay, logits: torch.Tensor) -> int:
    """What a verify graph holds: its capture's own allocations where the platform reports them (CPU graphs:
    ``replay.fresh_bytes``), else at least its logits, which stay allocated as long as the graph (a device graph's
    intermediates live in the memory pool the graphs share)."""
    fresh = getattr(replay, "fresh_bytes", None)
    return fresh if fresh is not None else logits.numel() * logits.element_size()


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
        rows = max(big, MAX_VERIFY_ROWS)  # token rows: one a sequence at decode, up to MAX_VERIFY_ROWS to verify
        # All per-step inputs live in two device buffers (int64: ids, positions, slots, then the rows and
        # sources of inputs taken from the device; int32: seq_lens, then the block tables row by row), each
        # filled by ONE copy from a pinned host twin: a step costs two host-to-device copies and no pinned
        # allocation. The host twins come in two sets used in turn: with async scheduling a step is prepared
        # while the previous one's copies may still be queued (the one before that has completed: the engine
        # waited for its sampled tokens).
        self._dev64 = torch.zeros(3 * rows + 2 * big, dtype=torch.int64, device=dev)
        self._dev32 = torch.zeros(big * (2 + w) + 1, dtype=torch.int32, device=dev)
        pin = dev.type != "cpu" and torch.accelerator.is_available()
        self._host = []
        # On the host the device buffers are their own twins: a step's kernels have finished when the next step's
        # inputs are written (no copy to skip past; each cold torch call costs tens of us there).
        host = dev.type == "cpu"
        for _ in range(2):
            host64 = self._dev64 if host else torch.zeros(3 * rows + 2 * big, dtype=torch.int64, pin_memory=pin)
            host32 = self._dev32 if host else torch.zeros(big * (2 + w) + 1, dtype=torch.int32, pin_memory=pin)
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
        self.verify_cu = self._dev32[big:2 * big + 1]  # a verify step's cu_seqlens_q (decode: the fixed self.cu)
        self.tables = self._dev32[2 * big + 1:].view(big, w)
        self.big, self.num_rows = big, rows
        self.cu = torch.arange(big + 1, dtype=torch.int32, device=dev)
        self.rows = torch.arange(rows, dtype=torch.int64, device=dev)
        self.graphs: dict[int, tuple] = {}  # bucket -> (replay, logits)
        self.verify_graphs: dict[tuple[int, int], tuple] = {}  # (bucket, rows) -> (replay, logits), oldest use first
        self.verify_bytes = 0  # what the verify graphs hold (VERIFY_GRAPH_BYTES)
        self._verify_eager: set[tuple[int, int]] = set()  # keys whose graph alone exceeds VERIFY_GRAPH_BYTES
        self.disabled: str | None = None
        self.lazy = platform.graph_capture_computes
        self.verify_disabled: str | None = None
        self._pool = None  # the device graphs' shared memory pool (captures that only record)
        self._warm: set = set()  # keys whose eager first step has run (lazy buckets; verify keys everywhere)

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
        self._pool = pool

    def _forward(self, key) -> torch.Tensor:
        """The step of ``key`` (a bucket: decode; (bucket, rows): verify) on the static buffers; logits of every
        row."""
        b, t, cu, decode = (key, key, self.cu, True) if isinstance(key, int) else (*key, self.verify_cu, False)
        batch = ForwardBatch(positions=self.positions[:t], slot_mapping=self.slots[:t], block_tables=self.tables[:b],
                             seq_lens=self.seq_lens[:b], cu_seqlens_q=cu[:b + 1], is_decode=decode,
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
        """``key``: a bucket (decode) or (bucket, rows) (verify; kept within VERIFY_GRAPH_BYTES)."""
        self._outputs = {k: v for k, v in self._outputs.items() if k[0] != key}  # views of the old logits
        if isinstance(key, int):
            self.graphs[key] = (replay, logits)
            return
        size = _graph_bytes(replay, logits)
        if size > VERIFY_GRAPH_BYTES:
            self._verify_eager.add(key)
            return
        while self.verify_graphs and self.verify_bytes + size > VERIFY_GRAPH_BYTES:
            self._forget_verify(next(iter(self.verify_graphs)))
        self.verify_graphs[key] = (replay, logits)
        self.verify_bytes += size

    def _forget_verify(self, key) -> None:
        replay, logits = self.verify_graphs.pop(key)
        self.verify_bytes -= _graph_bytes(replay, logits)
        self._warm.discard(key)
        self._outputs = {k: v for k, v in self._outputs.items() if k[0] != key}

    def _drop_graphs(self, verify_only: bool = False) -> None:
        if not verify_only:
            self.graphs.clear()
        self.verify_graphs.clear()
        self.verify_bytes = 0
        self._outputs = {k: v for k, v in self._outputs.items() if verify_only and isinstance(k[0], int)}

    def bucket_for(self, n: int) -> int | None:
        if self.disabled is not None:
            return None
        if self.lazy:
            return next((b for b in self.buckets if b >= n), None)
        if not self.graphs:
            return None
        return next((b for b in self.buckets if b >= n and b in self.graphs), None)

    def verify_key(self, n: int, t: int) -> tuple[int, int] | None:
        """(bucket, rows) for a verify step of ``t`` rows over ``n`` sequences, or None (run it eagerly)."""
        if self.verify_disabled is not None:
            return None
        b = self.bucket_for(n)
        need = None if b is None else t + b - n  # one row for each padding sequence
        rows = next((r for r in VERIFY_ROW_BUCKETS if need is not None and r >= need), None)
        return None if rows is None or (b, rows) in self._verify_eager else (b, rows)

    def _next_host(self):
        host = self._host[self._turn]
        self._turn ^= 1
        return host

    def _copy_in(self, host64, host32, n64: int, n32: int) -> None:
        """Off the host: the first n64 / n32 entries of the host twins to the device buffers."""
        if host64 is not self._dev64:
            self._dev64[:n64].copy_(host64[:n64], non_blocking=True)
            self._dev32[:n32].copy_(host32[:n32], non_blocking=True)

    def _fill(self, b: int, ids, positions, slots, tables, seq_lens, dst=(), src=()) -> None:
        """Write a decode step of n = len(ids) sequences into the next host twin (and copy it to the device); the
        bucket's other sequences become padding. ``dst``/``src``: rows whose input id comes from the device
        (zeroed here; see ``run``) and their source rows."""
        n, big, w, r = len(ids), self.big, self.width, self.num_rows
        host64, host32, h64, h32 = self._next_host()
        h64[:n] = ids
        h64[n:b] = 0  # padding rows read a valid token (a row may hold a placeholder from an earlier step)
        if dst:
            h64[dst] = 0  # never a placeholder in the buffer, not even in rows a later, smaller bucket leaves
            h64[3 * r:3 * r + len(dst)] = dst
            h64[3 * r + big:3 * r + big + len(src)] = src
        h64[r:r + n] = positions
        h64[2 * r:2 * r + n] = slots
        h64[2 * r + n:2 * r + b] = -1  # padding rows write nothing
        h32[:n] = seq_lens
        h32[n:b] = 1
        self._write_tables(h32, b, tables)
        self._copy_in(host64, host32, 3 * r + 2 * big, 2 * big + 1 + b * w)

    def _write_tables(self, h32, b: int, tables) -> None:
        rows = h32[2 * self.big + 1:2 * self.big + 1 + b * self.width].reshape(b, self.width)
        for i, row in enumerate(tables):
            rows[i, :len(row)] = row

    def run(self, b: int, ids, positions, slots, tables, seq_lens, fix=None) -> torch.Tensor:
        """Replay bucket ``b`` on the n <= b sequences given (host lists); returns their logits [n, vocab] (a view
        of the graph's output, valid until the next replay). ``fix``: (rows, source rows, tokens) — input ids
        taken from a device tensor of tokens instead of ``ids`` (async scheduling; see ModelRunner.run)."""
        if fix is None:
            self._fill(b, ids, positions, slots, tables, seq_lens)
            return self._replay(b, len(ids))
        dst, src, tokens = fix
        k = len(dst)
        self._fill(b, ids, positions, slots, tables, seq_lens, dst, src)
        if dst == src == list(range(k)):  # the usual case: the same sequences in the same order
            self.ids[:k].copy_(tokens[:k])
        else:
            self.ids.index_copy_(0, self._dst[:k], tokens.index_select(0, self._src[:k]))
        return self._replay(b, len(ids))

    def run_verify(self, key: tuple[int, int], ids, positions, slots, cu, tables, seq_lens) -> torch.Tensor:
        """Replay the verify graph ``key`` = (b, rows) (``verify_key``) on a step laid out in full by the caller:
        ``rows`` ids, positions and slots, b sequences' cu_seqlens_q (b + 1) and seq_lens, and the block tables
        of the sequences that have one (a padding sequence keeps whatever row it finds). Returns the logits of all
        rows [rows, vocab] (a view, valid until the next replay)."""
        b, t = key
        r = self.num_rows
        host64, host32, h64, h32 = self._next_host()
        h64[:t] = ids
        h64[r:r + t] = positions
        h64[2 * r:2 * r + t] = slots
        h32[:b] = seq_lens
        h32[self.big:self.big + b + 1] = cu
        self._write_tables(h32, b, tables)
        self._copy_in(host64, host32, 3 * r, 2 * self.big + 1 + b * self.width)
        return self._replay(key, t)

    def _replay(self, key, rows: int) -> torch.Tensor:
        if isinstance(key, int):
            entry = self.graphs.get(key)
        else:
            entry = self.verify_graphs.pop(key, None)
            if entry is not None:
                self.verify_graphs[key] = entry  # the most recently used last
        if entry is None:  # lazy: not captured yet
            return self._first_uses(key)[:rows]
        replay, logits = entry
        replay()
        out = self._outputs.get((key, rows))
        if out is None:  # a view made once: slicing anew each step cost ~40 us on a CPU (cold, after the step)
            out = self._outputs[(key, rows)] = logits[:rows]
        return out

    def _first_uses(self, key) -> torch.Tensor:
        """A lazy graph's first step (eager) or second (the capture, and the step computed by it or by a replay
        after it); its logits. ``key``: a bucket, or (bucket, rows) for a verify graph (lazy on every platform)."""
        if key not in self._warm:
            self._warm.add(key)
            return self._forward(key)
        try:
            replay, logits, pool = self.platform.capture_graph(lambda: self._forward(key), self._pool)
            if not self.lazy:  # the capture only recorded: this step's logits come from a replay
                self._pool = pool
                replay()
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if isinstance(key, int):
                self._drop_graphs()
                self.disabled = reason
                log.warning("decode graphs disabled, decode runs eagerly: capture of batch size %d failed: %s",
                            key, reason)
            else:
                self._drop_graphs(verify_only=True)
                self.verify_disabled = reason
                log.warning("verify graphs disabled, speculative verify steps run eagerly: capture of batch size %d "
                            "with %d rows failed: %s", *key, reason)
            # The capture may have stopped midway; the step again, eagerly (its KV writes repeat the same values).
            return self._forward(key)
        self._set_graph(key, replay, logits)
        return logits
