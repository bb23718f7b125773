"""ModelRunner: owns the KV cache, turns a scheduled step into a flat ForwardBatch, returns logits."""

from __future__ import annotations

import functools

import torch

from engine.core.models.batch import ForwardBatch
from engine.core.models.decoder import DecoderModel
from engine.core.platform import Platform

from .decode_graphs import DecodeGraphs
from .sampler import take_rows
from .sequence import Sequence


class ModelRunner:
    """``run(scheduled)`` computes a step. With ``enable_graphs(...)`` pure decode steps replay captured device
    graphs (decode_graphs.py); prefill and mixed steps always run eagerly."""

    def __init__(self, model: DecoderModel, num_blocks: int, block_size: int, platform: Platform | None = None):
        cfg = model.cfg
        self.model, self.block_size, self.num_blocks = model, block_size, num_blocks
        self.graphs: DecodeGraphs | None = None
        tensors, heads, channels = cfg.kv_cache_layout
        shape = (num_blocks, block_size, heads, channels)
        # Fresh caches hold garbage until written; attention never reads past seq_lens, so no zero-fill is needed.
        self.platform = platform or Platform()
        if tensors == 2:
            self.kv_caches = self.platform.empty_kv_caches(cfg.num_layers, shape, model.dtype, model.device)
        else:  # one latent cache a layer (MLA): each (key, value) pair the platform makes serves two layers
            pairs = self.platform.empty_kv_caches((cfg.num_layers + 1) // 2, shape, model.dtype, model.device)
            self.kv_caches = [t for pair in pairs for t in pair][:cfg.num_layers]
        self._blocks_reached = 0

    def _host_batch(self, scheduled: list[tuple[Sequence, int]], pad_tables: bool = True,
                    drafts: dict[int, list[int]] | None = None):
        """The step's flat batch as host lists: ids, positions, slots, cu_seqlens, seq_lens, block tables (padded
        to one width unless ``pad_tables`` is False), logits rows, and the sequences whose next token is
        sampled. A sequence with ``drafts[seq_id]`` (k speculative tokens, only for one whose chunk reaches its
        end) also computes those k tokens after its own, and gets k + 1 logits rows: the last k + 1 of its chunk."""
        bs = self.block_size
        drafts = drafts or {}
        ids, positions, slots, cu, seq_lens, sampled, logits_rows = [], [], [], [0], [], [], []
        for seq, n in scheduled:
            start = seq.num_computed_tokens
            ids.extend(seq.tokens_between(start, start + n))
            extra = drafts.get(seq.seq_id, ()) if start + n == len(seq) else ()
            ids.extend(extra)
            n += len(extra)
            pos = range(start, start + n)
            positions.extend(pos)
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in pos)
            cu.append(cu[-1] + n)
            seq_lens.append(start + n)
            if start + n == len(seq) + len(extra):  # the chunk reaches the end: its last rows predict the next
                sampled.append(seq)
                logits_rows.extend(range(cu[-1] - 1 - len(extra), cu[-1]))
        if pad_tables:
            width = max(len(s.block_table) for s, _ in scheduled)
            tables = [s.block_table + [0] * (width - len(s.block_table)) for s, _ in scheduled]
        else:
            tables = [s.block_table for s, _ in scheduled]
        self._note_blocks_reached(max(slots, default=-1))
        return ids, positions, slots, cu, seq_lens, tables, logits_rows, sampled

    def build_batch(self, scheduled: list[tuple[Sequence, int]], drafts: dict[int, list[int]] | None = None
                    ) -> tuple[torch.Tensor, ForwardBatch, list[Sequence]]:
        """Flatten the step's new tokens (and any draft tokens, see ``_host_batch``); also return the sequences
        whose next token is to be sampled."""
        ids, positions, slots, cu, seq_lens, tables, logits_rows, sampled = self._host_batch(scheduled, True, drafts)
        up = self._upload
        batch = ForwardBatch(
            positions=up(positions, torch.int64),
            slot_mapping=up(slots, torch.int64),
            block_tables=up(tables, torch.int32),
            seq_lens=up(seq_lens, torch.int32),
            cu_seqlens_q=up(cu, torch.int32),
            is_decode=len(ids) == len(scheduled),
            logits_indices=up(logits_rows, torch.int64),
        )
        return up(ids, torch.int64), batch, sampled

    def _upload(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """A host list as a tensor on the model's device. Off the host it goes through pinned memory with a
        non-blocking copy: a copy from pageable memory would wait for the device to finish the last step."""
        t = torch.tensor(values, dtype=dtype)
        if self.model.device.type == "cpu":
            return t
        return (t.pin_memory() if _can_pin() else t).to(self.model.device, non_blocking=True)

    def enable_graphs(self, platform, max_model_len: int, max_num_seqs: int) -> None:
        """Capture decode graphs for batch sizes up to ``max_num_seqs`` (see decode_graphs.py)."""
        with torch.inference_mode():
            graphs = DecodeGraphs(platform, self.model, self.kv_caches, self.block_size, max_model_len, max_num_seqs)
            graphs.capture()
        self.graphs = graphs if graphs.graphs or graphs.lazy else None

    @torch.inference_mode()
    def run(self, scheduled: list[tuple[Sequence, int]], drafts: dict[int, list[int]] | None = None,
            prev: tuple[torch.Tensor, dict[int, int]] | None = None) -> tuple[torch.Tensor, list[Sequence]]:
        """Compute the step; returns fp32 logits [rows, vocab] and the sequences they belong to: one row per
        sampled sequence, or 1 + k consecutive rows for one verifying k ``drafts`` (verify steps replay graphs
        where DecodeGraphs has them, else run eagerly).

        ``prev`` (async scheduling): the previous step's sampled tokens, still on the device, and the row of each
        sequence's token in them. A scheduled sequence listed there ends in a placeholder token (it must be its
        last, and the chunk's last, token); its input id is taken from the device instead of the host."""
        drafts = {i: d for i, d in (drafts or {}).items() if d}
        if drafts and self.graphs is not None:
            got = self._replay_verify(scheduled, drafts)
            if got is not None:
                return got
        fix = self._device_inputs(scheduled, prev) if prev is not None else None
        bucket = None
        if self.graphs is not None and not drafts and all(n == 1 for _, n in scheduled):
            bucket = self.graphs.bucket_for(len(scheduled))
        if bucket is not None:
            ids, positions, slots, _, seq_lens, tables, _, sampled = self._host_batch(scheduled, pad_tables=False)
            return self.graphs.run(bucket, ids, positions, slots, tables, seq_lens, fix), sampled
        ids, batch, sampled = self.build_batch(scheduled, drafts)
        if fix is not None:
            dst, src, tokens = fix
            ids.index_copy_(0, self._upload(dst, torch.int64), tokens.index_select(0, self._upload(src, torch.int64)))
        hidden = self.model.forward(ids, batch, self.kv_caches)
        if not sampled:
            return hidden.new_empty((0, 0), dtype=torch.float32), sampled
        return self.model.logits(hidden[batch.logits_indices]), sampled

    def _replay_verify(self, scheduled: list[tuple[Sequence, int]], drafts: dict[int, list[int]]
                       ) -> tuple[torch.Tensor, list[Sequence]] | None:
        """A verify step through a (bucket, rows) graph (decode_graphs.py): each sequence's chunk (its new token and
        drafts), the padding put first in front of chunks as tokens already computed (slots -1), the rest in the
        bucket's padding sequences. None (run it eagerly) where no graph fits or a sequence is not decoding (its
        one new token its last)."""
        n = len(scheduled)
        t = n + sum(len(d) for d in drafts.values())
        key = self.graphs.verify_key(n, t)
        if key is None:
            return None
        b, rows = key
        spare = rows - t - (b - n)
        bs = self.block_size
        ids, positions, slots, cu, seq_lens, tables, keep = [], [], [], [0], [], [], []
        for seq, m in scheduled:
            start, extra = seq.num_computed_tokens, drafts.get(seq.seq_id, ())
            if m != 1 or start + 1 != len(seq):
                return None
            front = min(spare, start)
            spare -= front
            end = start + len(extra) + 1
            ids.extend(seq.tokens_between(start - front, start + 1))
            ids.extend(extra)
            positions.extend(range(start - front, end))
            slots.extend([-1] * front)  # already in the cache: not rewritten
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            keep.extend(range(cu[-1] + front, cu[-1] + front + len(extra) + 1))
            cu.append(cu[-1] + front + len(extra) + 1)
            seq_lens.append(end)
            tables.append(table)
        if spare and (n == b or 1 + spare > self.graphs.width * bs):
            return None
        for j in range(n, b):  # padding sequences: one row each, the first also what is left; they write nothing
            pad = 1 + spare if j == n else 1
            ids.extend([0] * pad)
            positions.extend(range(pad))
            slots.extend([-1] * pad)
            cu.append(cu[-1] + pad)
            seq_lens.append(pad)
        self._note_blocks_reached(max(slots))
        logits = self.graphs.run_verify(key, ids, positions, slots, cu, tables, seq_lens)
        if keep != list(range(len(keep))) or len(keep) != rows:
            logits = take_rows(logits, keep)
        return logits, [seq for seq, _ in scheduled]

    def _note_blocks_reached(self, max_slot: int) -> None:
        reached = max_slot // self.block_size + 1
        if reached > self._blocks_reached:
            self._blocks_reached = reached
            self.platform.kv_blocks_reached(self.kv_caches, reached)

    @staticmethod
    def _device_inputs(scheduled: list[tuple[Sequence, int]], prev: tuple[torch.Tensor, dict[int, int]]
                       ) -> tuple[list[int], list[int], torch.Tensor] | None:
        """(rows of the flat batch, rows of ``prev``'s tokens, the tokens) for the inputs still on the device."""
        tokens, rows = prev
        dst, src, end = [], [], 0
        for seq, n in scheduled:
            end += n
            row = rows.get(seq.seq_id)
            if row is None:
                continue
            if seq.num_computed_tokens + n != len(seq):
                raise RuntimeError(f"ModelRunner.run: {seq} ends in a token still on the device but its chunk does "
                                   "not reach it")
            dst.append(end - 1)
            src.append(row)
        return (dst, src, tokens) if dst else None


@functools.cache
def _can_pin() -> bool:
    return torch.accelerator.is_available()
