"""EngineStats: what each engine step computed and how long it took, the KV cache's fill, and per-request timing.

Recording costs O(sequences in the step) per step and nothing proportional to the vocabulary or the context.
Running totals are kept for the engine's whole life (or since ``reset``); the per-step and per-request
histories are bounded (the most recent ``max_history`` entries) so a long-lived engine does not grow without
limit. All times are ``time.perf_counter()`` seconds.

Definitions:

- a *decode* token is the one token computed for a sequence that has generated tokens and whose earlier
  tokens are all in the KV cache (the last generated token, fed back); every other computed token (prompt
  tokens, recomputation after preemption) is a *prefill* token. Without preemption or prefix-cache hits a
  request of P prompt and O output tokens computes P prefill and O - 1 decode tokens.
- KV slots *allocated* during a step: sum over running sequences of ``len(block_table) * block_size``;
  slots *used*: the tokens they hold once the step has written its new K/V (``num_computed_tokens`` plus the
  tokens granted this step). Waste = 1 - used / allocated: the unfilled tail of each sequence's last block,
  and any blocks reserved ahead. Shared prefix-cache blocks count once per sequence on both sides.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    start: float
    duration: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_seqs: int  # sequences scheduled in the step
    kv_slots_allocated: int
    kv_slots_used: int

    @property
    def kv_waste(self) -> float:
        """Fraction of allocated KV slots holding no token (0.0 when nothing is allocated)."""
        return 1.0 - self.kv_slots_used / self.kv_slots_allocated if self.kv_slots_allocated else 0.0


@dataclass
class RequestRecord:
    request_id: str
    arrival: float
    num_prompt_tokens: int
    first_token: float | None = None
    finish: float | None = None
    num_output_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        """Time to first token, from arrival (queueing included)."""
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def latency(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None with fewer than two outputs or while unfinished."""
        if self.finish is None or self.first_token is None or self.num_output_tokens < 2:
            return None
        return (self.finish - self.first_token) / (self.num_output_tokens - 1)


class EngineStats:
    """Filled by LLMEngine (``on_arrival``, ``on_step``, ``on_token``); read by ``engine bench`` and users."""

    def __init__(self, max_history: int = 65536):
        if not isinstance(max_history, int) or max_history < 1:
            raise ValueError(f"EngineStats: max_history must be an int >= 1, got {max_history!r}")
        self.max_history = max_history
        self.reset()

    def reset(self) -> None:
        """Forget everything recorded so far except requests still in flight (they keep being tracked)."""
        active = getattr(self, "_active", {})
        self._active: dict[int, RequestRecord] = active
        self.steps: deque[StepRecord] = deque(maxlen=self.max_history)
        self.finished: deque[RequestRecord] = deque(maxlen=self.max_history)
        self.num_steps = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.prefill_time = 0.0  # steps that computed any prefill token (mixed steps included)
        self.decode_only_tokens = 0  # decode tokens of decode-only steps
        self.decode_time = 0.0  # decode-only steps
        self.busy_time = 0.0
        self.kv_waste_time = 0.0  # integral of the waste fraction over busy time
        self.kv_waste_max = 0.0

    # ---- recording (called by LLMEngine) ----------------------------------------------------------------
    def on_arrival(self, seq_id: int, request_id: str, num_prompt_tokens: int, now: float) -> None:
        self._active[seq_id] = RequestRecord(request_id, now, num_prompt_tokens)

    def on_step(self, start: float, end: float, num_prefill_tokens: int, num_decode_tokens: int, num_seqs: int,
                kv_slots_allocated: int, kv_slots_used: int) -> None:
        """Record one step that ran the model (the KV figures from ``kv_occupancy``)."""
        rec = StepRecord(start, end - start, num_prefill_tokens, num_decode_tokens, num_seqs,
                         kv_slots_allocated, kv_slots_used)
        self.steps.append(rec)
        self.num_steps += 1
        self.prefill_tokens += num_prefill_tokens
        self.decode_tokens += num_decode_tokens
        if num_prefill_tokens:
            self.prefill_time += rec.duration
        else:
            self.decode_only_tokens += num_decode_tokens
            self.decode_time += rec.duration
        self.busy_time += rec.duration
        waste = rec.kv_waste
        self.kv_waste_time += waste * rec.duration
        self.kv_waste_max = max(self.kv_waste_max, waste)

    def on_token(self, seq_id: int, now: float, finished: bool) -> None:
        rec = self._active.get(seq_id)
        if rec is None:
            return
        if rec.first_token is None:
            rec.first_token = now
        rec.num_output_tokens += 1
        if finished:
            rec.finish = now
            self.finished.append(self._active.pop(seq_id))

    def drop(self, seq_id: int) -> None:
        """Forget an in-flight request (aborted): it is not counted among the finished ones."""
        self._active.pop(seq_id, None)

    # ---- summaries --------------------------------------------------------------------------------------
    @property
    def kv_waste_mean(self) -> float:
        """KV waste averaged over busy time (each step weighted by its duration)."""
        return self.kv_waste_time / self.busy_time if self.busy_time > 0 else 0.0

    @property
    def prefill_tok_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_time if self.prefill_time > 0 else 0.0

    @property
    def decode_tok_per_s(self) -> float:
        """Tokens computed in decode-only steps (one sampled token each) per second of those steps."""
        return self.decode_only_tokens / self.decode_time if self.decode_time > 0 else 0.0

    def summary(self) -> dict:
        """Totals, rates, KV waste and request-latency percentiles (p50/p90/p99) as a JSON-ready dict."""
        done = list(self.finished)
        return {
            "num_steps": self.num_steps,
            "num_finished_requests": len(done),
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "decode_only_tokens": self.decode_only_tokens,
            "prefill_time_s": self.prefill_time,
            "decode_time_s": self.decode_time,
            "busy_time_s": self.busy_time,
            "prefill_tok_per_s": self.prefill_tok_per_s,
            "decode_tok_per_s": self.decode_tok_per_s,
            "kv_waste_mean": self.kv_waste_mean,
            "kv_waste_max": self.kv_waste_max,
            "ttft_s": percentiles([r.ttft for r in done if r.ttft is not None]),
            "tpot_s": percentiles([r.tpot for r in done if r.tpot is not None]),
            "latency_s": percentiles([r.latency for r in done if r.latency is not None]),
        }


def kv_occupancy(running, scheduled, block_size: int) -> tuple[int, int]:
    """(slots allocated, slots holding a token) over the sequences holding KV blocks during a step.

    Call it after scheduling and before the step runs: ``scheduled`` (pairs (seq, n)) grants n new tokens,
    whose K/V the step writes, so a sequence holds ``num_computed_tokens + n`` tokens during the step.
    """
    granted = {seq.seq_id: n for seq, n in scheduled}
    blocks = used = 0
    for seq in running:
        blocks += len(seq.block_table)
        used += seq.num_computed_tokens + granted.get(seq.seq_id, 0)
    return blocks * block_size, used


def percentiles(values, qs=(50, 90, 99)) -> dict:
    """{"p50": ..., "p90": ..., "p99": ...} by linear interpolation between order statistics; None if empty."""
    xs = sorted(values)
    out = {}
    for q in qs:
        if not xs:
            out[f"p{q}"] = None
            continue
        pos = (len(xs) - 1) * q / 100
        lo, hi = math.floor(pos), math.ceil(pos)
        out[f"p{q}"] = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return out
