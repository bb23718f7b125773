"""Continuous batching with chunked prefill and preemption by recomputation.

Each step the scheduler grants every sequence it schedules a number of new tokens to compute: running
decodes first (one token each), then running sequences still prefilling, then waiting sequences in arrival
order, all within ``max_num_batched_tokens``. A prompt longer than the remaining budget is split over steps.
When a running sequence needs a KV block and none is free, the newest running sequence not yet scheduled
this step is preempted: its blocks are freed and it goes back to the front of the waiting queue, to
recompute its prompt and the tokens generated so far (prefix caching usually makes that cheap).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus

PLACEHOLDER = -1  # an output token sampled on the device and not yet read back (async scheduling)


@dataclass
class SchedulerOutput:
    """One step's work. The runner computes tokens [num_computed_tokens, num_computed_tokens + n) of each
    scheduled sequence and samples a token only for those whose chunk reaches the end of their tokens
    (``num_computed_tokens + n == len(seq)``)."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # Speculative decoding: seq_id -> slots reserved past this step's tokens for draft tokens (see
    # Scheduler.num_lookahead_slots); absent for sequences that got none.
    lookahead: dict[int, int] = field(default_factory=dict)

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Decides which sequences run each step and finishes them on EOS, stop ids or length.

    A sequence ends with finish_reason "length" at ``params.max_tokens`` generated tokens, or once it holds
    ``max_model_len`` tokens (or as many as the whole KV cache can hold, whichever is smaller).
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, eos_token_ids: set[int] | None = None):
        for name, value in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Scheduler: {name} must be an int >= 1, got {value!r}")
        if max_model_len is not None and (not isinstance(max_model_len, int) or max_model_len < 1):
            raise ValueError(f"Scheduler: max_model_len must be an int >= 1 or None, got {max_model_len!r}")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = set(eos_token_ids or ())
        self.cache_capacity = block_manager.num_blocks * block_manager.block_size
        self.max_seq_len = min(max_model_len or math.inf, self.cache_capacity)
        self.waiting: deque[Sequence] = deque()
        # Set by a speculative engine before each step: how many draft tokens each decoding sequence may verify.
        self.num_lookahead_slots = 0
        self.running: list[Sequence] = []  # in admission order, oldest first

    # ---- queue management -------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence. Raises ValueError if its prompt cannot fit the context or the KV cache."""
        if seq.status is not SequenceStatus.WAITING or seq.block_table or seq.output_token_ids:
            raise ValueError(f"Scheduler.add: {seq} is not a fresh sequence")
        n = len(seq)
        if n == 0:
            raise ValueError("Scheduler.add: the prompt is empty; give at least one token")
        if self.max_model_len is not None and n > self.max_model_len:
            raise ValueError(f"prompt of {n} tokens exceeds the model's context of {self.max_model_len}")
        if n > self.cache_capacity:
            bm = self.block_manager
            raise ValueError(f"prompt of {n} tokens needs {-(-n // bm.block_size)} KV-cache blocks but the cache "
                             f"has only {bm.num_blocks} (block_size {bm.block_size}); give the KV cache more memory "
                             "or shorten the prompt")
        self.waiting.append(seq)

    def abort(self, request_id: str) -> Sequence | None:
        """Finish the unfinished sequence with this request id (finish_reason "abort"); None if there is none."""
        for seq in (*self.running, *self.waiting):
            if seq.request_id == request_id:
                self.finish(seq, "abort")
                return seq
        return None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark ``seq`` finished with ``reason`` and release its blocks (no-op if already finished)."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    # ---- the step ---------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        scheduled_ids: set[int] = set()
        decodes = [s for s in self.running if not s.in_prefill]
        prefills = [s for s in self.running if s.in_prefill]
        for seq in decodes + prefills:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(len(seq) - seq.num_computed_tokens, budget)
            while True:
                room = (len(seq.block_table) + bm.num_free_blocks) * bm.block_size - seq.num_computed_tokens
                if room >= 1:  # a prefill chunk shrinks to the room left rather than preempting anyone
                    n = min(n, room)
                    bm.append_slots(seq, n)
                    out.scheduled.append((seq, n))
                    scheduled_ids.add(seq.seq_id)
                    budget -= n
                    break
                victim = next(s for s in reversed(self.running) if s.seq_id not in scheduled_ids)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
        if out.preempted:  # admitting now would only preempt again
            return out
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not bm.allocate(seq, budget):
                break  # first come, first served: later arrivals do not overtake
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            n = min(len(seq) - seq.num_computed_tokens, budget)
            out.scheduled.append((seq, n))
            budget -= n
        if self.num_lookahead_slots:
            self._reserve_lookahead(out, budget)
        return out

    def update(self, scheduled: list[tuple[Sequence, int]] | SchedulerOutput,
               sampled: dict[int, int]) -> list[Sequence]:
        """Record a computed step. ``sampled`` maps seq_id to the token sampled for each sequence whose chunk
        reached the end of its tokens (and only those). Returns the sequences that finished."""
        if isinstance(scheduled, SchedulerOutput):
            scheduled = scheduled.scheduled
        scheduled = [(seq, n) for seq, n in scheduled if not seq.is_finished]  # skip those aborted mid-step
        for seq, n in scheduled:
            end = seq.num_computed_tokens + n
            if end > len(seq):
                raise RuntimeError(f"Scheduler.update: {seq} was granted {n} tokens, past its end")
            if (end == len(seq)) != (seq.seq_id in sampled):
                raise RuntimeError(f"Scheduler.update: {seq} {'needs' if end == len(seq) else 'must not get'} a "
                                   "sampled token (sample exactly the sequences whose chunk reaches their last token)")
        finished = []
        for seq, n in scheduled:
            seq.num_computed_tokens += n
            self.block_manager.mark_computed(seq)
            if seq.seq_id not in sampled:
                continue
            token = int(sampled[seq.seq_id])
            seq.output_token_ids.append(token)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    # ---- async scheduling: ``update`` in two halves -----------------------------------------------------
    def advance(self, scheduled: list[tuple[Sequence, int]], sampled_ids: set[int]) -> list[Sequence]:
        """``update`` before the sampled tokens are known: count the computed tokens and give each sampled
        sequence a PLACEHOLDER token, so the next step can be scheduled (lengths and KV slots do not depend on
        the token's value). Length limits finish sequences here; the token's own stop checks wait for
        ``resolve``. Sequences finished meanwhile (aborted, stopped) are skipped. Returns the sequences that
        got a placeholder, in order."""
        out = []
        for seq, n in scheduled:
            if seq.is_finished:
                continue
            if (seq.num_computed_tokens + n == len(seq)) != (seq.seq_id in sampled_ids):
                raise RuntimeError(f"Scheduler.advance: {seq} was granted {n} tokens but its sampled state disagrees")
            seq.num_computed_tokens += n
            self.block_manager.mark_computed(seq)  # only computed tokens are hashed: never the placeholder
            if seq.seq_id not in sampled_ids:
                continue
            seq.output_token_ids.append(PLACEHOLDER)
            out.append(seq)
            if len(seq.output_token_ids) >= seq.params.max_tokens or len(seq) >= self.max_seq_len:
                self.finish(seq, "length")
        return out

    def resolve(self, seq: Sequence, token: int) -> None:
        """Put the sampled ``token`` in place of ``seq``'s last (placeholder) token and apply its stop checks,
        as ``update`` would have. A sequence already finished by length whose token is a stop token ends with
        "stop" instead, as ``update`` decides (its blocks are already free)."""
        if not seq.output_token_ids or seq.output_token_ids[-1] != PLACEHOLDER:
            raise RuntimeError(f"Scheduler.resolve: {seq} has no placeholder token to resolve")
        token = int(token)
        seq.output_token_ids[-1] = token
        reason = self._stop_reason(seq, token)
        if reason is None:
            return
        if not seq.is_finished:
            self.finish(seq, reason)
        elif seq.finish_reason == "length":
            seq.finish_reason = reason

    # ---- internals --------------------------------------------------------------------------------------
    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
            return "stop"
        if len(seq.output_token_ids) >= p.max_tokens or len(seq) >= self.max_seq_len:
            return "length"
        return None

    def _reserve_lookahead(self, out: SchedulerOutput, budget: int) -> None:
        """Reserve slots for up to ``num_lookahead_slots`` draft tokens after each decoding sequence's token,
        from the budget and free blocks left once everything else is scheduled: speculation never preempts or
        delays a request. The engine trims what the verification rejects (BlockManager.trim)."""
        bm = self.block_manager
        for seq, n in out.scheduled:
            if budget <= 0:
                break
            if seq.num_computed_tokens + n != len(seq) or n != 1:  # only decodes speculate
                continue
            room = (len(seq.block_table) + bm.num_free_blocks) * bm.block_size - len(seq)
            ahead = min(self.num_lookahead_slots, room, budget, self.max_seq_len - len(seq))  # no slot past the context
            if ahead > 0:
                bm.append_slots(seq, n + ahead)
                out.lookahead[seq.seq_id] = ahead
                budget -= ahead

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
