"""LLMEngine: the step loop tying scheduler, block manager, model runner, sampler and detokenizer together."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .detokenizer import IncrementalDetokenizer
from .model_runner import ModelRunner
from .outputs import RequestOutput, StepUpdate
from .sampler import Sampler
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence
from .stats import EngineStats, kv_occupancy


@dataclass
class _Request:
    seq: Sequence
    detok: IncrementalDetokenizer
    out: RequestOutput
    full: str = ""  # all text decoded so far, before any stop-string cut
    emitted: int = 0  # characters already streamed


class LLMEngine:
    """``add_request`` then call ``step`` until ``has_unfinished`` is False. Each step returns the
    updates of the requests that produced a token (or finished) in it."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, tokenizer, max_model_len: int):
        self.runner, self.scheduler, self.tokenizer = runner, scheduler, tokenizer
        self.max_model_len = max_model_len
        self.sampler = Sampler()
        self.num_preemptions = 0  # total over the engine's life
        self._requests: dict[int, _Request] = {}
        self.stats = EngineStats()  # per-step and per-request statistics (see stats.py)

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, prompt: str | None = None,
                    request_id: str | None = None) -> str:
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("the prompt is empty: give at least one token")
        if n >= self.max_model_len:
            raise ValueError(f"the prompt has {n} tokens but the context holds {self.max_model_len} "
                             "(prompt plus at least one generated token); shorten the prompt or raise max_model_len")
        vocab = self.runner.model.cfg.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        seq = Sequence(prompt_token_ids, params, request_id)
        detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens)
        out = RequestOutput(seq.request_id, prompt, list(prompt_token_ids))
        self.scheduler.add(seq)
        self._requests[seq.seq_id] = _Request(seq, detok, out)
        self.stats.on_arrival(seq.seq_id, seq.request_id, n, time.perf_counter())
        return seq.request_id

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[StepUpdate]:
        start = time.perf_counter()
        sched = self.scheduler.schedule()
        self.num_preemptions += len(sched.preempted)
        if not sched.scheduled:
            return []
        # A decode token feeds back a generated token; prompt tokens and recomputation are prefill (stats.py).
        num_decode = sum(1 for s, _ in sched.scheduled if s.output_token_ids and not s.in_prefill)
        num_prefill = sched.num_batched_tokens - num_decode
        kv_slots = kv_occupancy(self.scheduler.running, sched.scheduled, self.scheduler.block_manager.block_size)
        logits, sampled_seqs = self.runner.run(sched.scheduled)
        # The step's one read from the device: the sampled tokens, all at once.
        tokens = self.sampler.sample(logits, sampled_seqs).tolist() if sampled_seqs else []
        sampled = {s.seq_id: t for s, t in zip(sampled_seqs, tokens, strict=True)}
        self.scheduler.update(sched.scheduled, sampled)
        updates = []
        for seq in sampled_seqs:
            updates.append(self._advance(seq, sampled[seq.seq_id]))
        end = time.perf_counter()
        self.stats.on_step(start, end, num_prefill, num_decode, len(sched.scheduled), *kv_slots)
        for seq in sampled_seqs:
            self.stats.on_token(seq.seq_id, end, seq.is_finished)
        return updates

    def _advance(self, seq: Sequence, token: int) -> StepUpdate:
        req = self._requests[seq.seq_id]
        out, stops = req.out, seq.params.stop
        out.token_ids.append(token)
        out.num_cached_tokens = max(out.num_cached_tokens, seq.num_cached_tokens)
        old_len = len(req.full)
        if token not in seq.params.stop_token_ids:
            req.full += req.detok.add(token)
        if seq.is_finished:
            req.full += req.detok.flush()  # a character whose bytes never completed
        stop_at = self._find_stop(req.full, old_len, stops)
        text = req.full if stop_at is None else req.full[:stop_at]
        if stop_at is not None and not seq.is_finished:
            self.scheduler.finish(seq, "stop")
        # While running, hold back a tail that could be the start of a stop string, so streamed text never
        # shows part of one; at the end, release everything up to the cut.
        hold = 0 if seq.is_finished or not stops else max(len(x) for x in stops) - 1
        upto = max(req.emitted, len(text) - hold)
        delta, req.emitted = text[req.emitted:upto], upto
        out.text = text
        if seq.is_finished:
            out.finish_reason = seq.finish_reason
            del self._requests[seq.seq_id]
        return StepUpdate(seq.request_id, delta, [token], seq.is_finished, out)

    @staticmethod
    def _find_stop(text: str, old_len: int, stops: list[str]) -> int | None:
        """Earliest end-of-text cut for a stop string that appears in the newly added text."""
        best = None
        for s in stops:
            i = text.find(s, max(0, old_len - len(s) + 1))
            if i != -1 and (best is None or i < best):
                best = i
        return best
