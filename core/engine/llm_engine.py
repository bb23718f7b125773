"""LLMEngine: the step loop tying scheduler, block manager, model runner, sampler and detokenizer together."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from .detokenizer import IncrementalDetokenizer
from .model_runner import ModelRunner
from .outputs import CompletionOutput, Logprob, RequestOutput, StepUpdate
from .sampler import DeviceSample, Sampler, TokenLogprobs
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence
from .stats import EngineStats, kv_occupancy


@dataclass
class _Completion:
    """One of a request's n sequences and its text state."""

    seq: Sequence
    detok: IncrementalDetokenizer
    out: CompletionOutput
    request: RequestOutput
    full: str = ""  # all text decoded so far, before any stop-string cut
    emitted: int = 0  # characters already streamed


@dataclass
class _InFlight:
    """A launched step whose sampled tokens are still on their way to the host (async scheduling): each of
    ``seqs`` ends in a placeholder token, the one in row ``rows[seq_id]`` of ``sample.tokens``."""

    seqs: list[Sequence]
    rows: dict[int, int]
    sample: DeviceSample


class LLMEngine:
    """``add_request`` then call ``step`` until ``has_unfinished`` is False. Each step returns the
    updates of the requests that produced a token (or finished) in it.

    With ``async_scheduling`` (vLLM's name; on where the platform says it pays, ``Platform.async_scheduling``)
    a step launches its device work, then turns the PREVIOUS step's sampled tokens into outputs (detokenizing,
    stop checks) while the device computes, and returns those: a token reaches its caller one step later, and
    the host work of one step hides behind the device work of the next. The sampled tokens never make a host
    round trip to become the next step's inputs (ModelRunner.run's ``prev``). A sequence that stops on a token
    has had one more token computed meanwhile; it is discarded (its KV slot was in the sequence's own blocks,
    freed with them). Steps fall back to the synchronous order where the next step's inputs need the tokens on
    the host: speculative decoding, penalties and logits processors (grammars). Greedy outputs are identical."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, tokenizer, max_model_len: int):
        self.runner, self.scheduler, self.tokenizer = runner, scheduler, tokenizer
        self.max_model_len = max_model_len
        self.sampler = Sampler()
        self.num_preemptions = 0  # total over the engine's life
        self._requests: dict[int, _Completion] = {}  # by seq_id, unfinished only
        self._by_request_id: dict[str, list[Sequence]] = {}  # unfinished requests' sequences
        self.stats = EngineStats()  # per-step and per-request statistics (see stats.py)
        self.speculator = None  # a spec_decode.Speculator when speculative decoding is on (set by LLM)
        self.async_scheduling = False  # set by LLM from the platform (see the class docstring)
        self._inflight: _InFlight | None = None
        self._stepping: list[Sequence] = []  # the sequences the step in progress scheduled (abort_failed_step)

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
        if request_id is not None and request_id in self._by_request_id:
            raise ValueError(f"request id {request_id!r} is already running; ids must be unique")
        seqs = [Sequence(prompt_token_ids, _child_params(params, i), request_id) for i in range(params.n)]
        request_id = seqs[0].request_id
        for seq in seqs[1:]:
            seq.request_id = request_id
        out = RequestOutput(request_id, prompt, list(prompt_token_ids))
        for seq in seqs:  # validates the first before any is queued
            self.scheduler.add(seq)
        now = time.perf_counter()
        for i, seq in enumerate(seqs):
            detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens)
            comp = CompletionOutput(i, logprobs=[] if params.logprobs is not None else None,
                                    cumulative_logprob=0.0 if params.logprobs is not None else None)
            out.outputs.append(comp)
            self._requests[seq.seq_id] = _Completion(seq, detok, comp, out)
            self.stats.on_arrival(seq.seq_id, request_id, n, now)
        self._by_request_id[request_id] = seqs
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Finish every unfinished completion of the request (finish_reason "abort") and free its KV blocks now.
        Returns the request's output, or None if no such request is running."""
        seqs = self._by_request_id.pop(request_id, None)
        if seqs is None:
            return None
        out = None
        for seq in seqs:
            comp = self._requests.pop(seq.seq_id, None)
            if comp is None:
                continue
            self.scheduler.finish(seq, "abort")
            comp.out.finish_reason = "abort"
            self.stats.drop(seq.seq_id)
            out = comp.request
        if self._inflight is not None and not any(s.seq_id in self._requests for s in self._inflight.seqs):
            # (async scheduling) the step in flight computes only aborted sequences: wait for it here, so that
            # has_unfinished() is False at once and its output buffers are not dropped while being written
            self._resolve()
        return out

    def abort_failed_step(self) -> list[str]:
        """After ``step()`` raised: end every request the failed step held (its scheduled sequences and any step in
        flight), finish_reason "abort", and free their KV blocks; return their ids. Requests the step did not hold
        are untouched, so the engine serves on."""
        held = list(self._stepping) + (list(self._inflight.seqs) if self._inflight is not None else [])
        self._inflight = None  # its tokens came from the failed step's batch: never read them
        self._stepping = []
        ids = list(dict.fromkeys(s.request_id for s in held if s.seq_id in self._requests))
        for request_id in ids:
            self.abort(request_id)
        return ids

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._inflight is not None

    def step(self) -> list[StepUpdate]:
        if self.async_scheduling and self.speculator is None:
            return self._step_async()
        updates = self._resolve() if self._inflight is not None else []  # async was switched off
        return updates + self._step_sync()

    def _step_async(self) -> list[StepUpdate]:
        start = time.perf_counter()
        updates = []
        if self._inflight is not None and any(_needs_host_tokens(s) for s in self._inflight.seqs):
            updates = self._resolve()  # their penalties or processors read the previous token on the host
        sched = self.scheduler.schedule()
        self._stepping = [s for s, _ in sched.scheduled]
        self.num_preemptions += len(sched.preempted)
        if not sched.scheduled:
            return updates + self._resolve() if self._inflight is not None else updates
        num_decode = sum(1 for s, _ in sched.scheduled if s.output_token_ids and not s.in_prefill)
        num_prefill = sched.num_batched_tokens - num_decode
        kv_slots = kv_occupancy(self.scheduler.running, sched.scheduled, self.scheduler.block_manager.block_size)
        prev = self._inflight
        logits, sampled_seqs = self.runner.run(sched.scheduled, prev=(prev.sample.tokens, prev.rows) if prev else None)
        sample = self.sampler.sample_on_device(logits, sampled_seqs).to_host() if sampled_seqs else None
        # The device computes this step while the host turns the previous one into outputs.
        if prev is not None:
            updates += self._resolve()
        rows = {s.seq_id: i for i, s in enumerate(sampled_seqs)}
        pending = self.scheduler.advance(sched.scheduled, set(rows))  # skips those the previous tokens stopped
        self._inflight = _InFlight(pending, {s.seq_id: rows[s.seq_id] for s in pending}, sample) if pending else None
        self.stats.on_step(start, time.perf_counter(), num_prefill, num_decode, len(sched.scheduled), *kv_slots)
        return updates

    def _resolve(self) -> list[StepUpdate]:
        """Read the in-flight step's tokens (waiting for them alone), put them in place of the placeholders,
        apply the stop checks and return the outputs."""
        inflight, self._inflight = self._inflight, None
        tokens, logprobs = inflight.sample.result()
        now = time.perf_counter()
        updates = []
        for seq in inflight.seqs:
            if seq.seq_id not in self._requests:  # aborted meanwhile
                continue
            row = inflight.rows[seq.seq_id]
            self.scheduler.resolve(seq, tokens[row])
            updates.append(self._advance(seq, tokens[row], logprobs[row]))
            self.stats.on_token(seq.seq_id, now, seq.is_finished)
        return updates

    def _step_sync(self) -> list[StepUpdate]:
        start = time.perf_counter()
        if self.speculator is not None:
            self.speculator.plan()
        sched = self.scheduler.schedule()
        self._stepping = [s for s, _ in sched.scheduled]
        self.num_preemptions += len(sched.preempted)
        if not sched.scheduled:
            return []
        # A decode token feeds back a generated token; prompt tokens and recomputation are prefill (stats.py).
        num_decode = sum(1 for s, _ in sched.scheduled if s.output_token_ids and not s.in_prefill)
        num_prefill = sched.num_batched_tokens - num_decode
        kv_slots = kv_occupancy(self.scheduler.running, sched.scheduled, self.scheduler.block_manager.block_size)
        drafts, q = self.speculator.propose(sched.scheduled, sched.lookahead) if self.speculator else ({}, None)
        logits, sampled_seqs = self.runner.run(sched.scheduled, drafts)
        counts = {}  # tokens emitted per sequence when a speculative step emits more than one
        if drafts:  # verify the draft tokens, emit the accepted ones (spec_decode/speculator.py)
            updates, counts = self.speculator.commit(self, sched.scheduled, logits, sampled_seqs, drafts, q)
        else:
            # The step's one read from the device: the sampled tokens, all at once.
            tokens, logprobs = (self.sampler.sample_with_logprobs(logits, sampled_seqs) if sampled_seqs
                                else ([], []))
            sampled = {s.seq_id: t for s, t in zip(sampled_seqs, tokens, strict=True)}
            self.scheduler.update(sched.scheduled, sampled)
            if self.speculator is not None:  # free the slots reserved for drafts nobody proposed
                self.speculator.release(sched.scheduled, sched.lookahead)
            updates = []
            for seq, lp in zip(sampled_seqs, logprobs, strict=True):
                updates.append(self._advance(seq, sampled[seq.seq_id], lp))
        end = time.perf_counter()
        self.stats.on_step(start, end, num_prefill, num_decode, len(sched.scheduled), *kv_slots)
        for seq in sampled_seqs:
            n = counts.get(seq.seq_id, 1)
            for i in range(n):
                self.stats.on_token(seq.seq_id, end, seq.is_finished and i == n - 1)
        return updates

    def _advance(self, seq: Sequence, token: int, logprobs: TokenLogprobs | None = None) -> StepUpdate:
        comp = self._requests[seq.seq_id]
        out, stops = comp.out, seq.params.stop
        out.token_ids.append(token)
        comp.request.num_cached_tokens = max(comp.request.num_cached_tokens, seq.num_cached_tokens)
        new_logprobs = None
        if logprobs is not None and out.logprobs is not None:
            new_logprobs = [self._logprob_dict(token, logprobs)]
            out.logprobs.extend(new_logprobs)
            out.cumulative_logprob += logprobs[0]
        old_len = len(comp.full)
        # The token that ends a sequence (a stop token id, or EOS) is not text, special tokens kept or not (vLLM's
        # rule too): with skip_special_tokens=False an answer would end in '<|im_end|>'.
        p = seq.params
        if token not in p.stop_token_ids and not (seq.is_finished and not p.ignore_eos
                                                  and token in self.scheduler.eos_token_ids):
            comp.full += comp.detok.add(token)
        if seq.is_finished:
            comp.full += comp.detok.flush()  # a character whose bytes never completed
        stop_at, stop_str = self._find_stop(comp.full, old_len, stops)
        text = comp.full if stop_at is None else comp.full[:stop_at]
        if stop_at is not None and not seq.is_finished:
            self.scheduler.finish(seq, "stop")
            out.stop_reason = stop_str
        elif seq.is_finished and token in seq.params.stop_token_ids:
            out.stop_reason = token
        # While running, hold back a tail that could be the start of a stop string, so streamed text never
        # shows part of one; at the end, release everything up to the cut.
        hold = 0 if seq.is_finished or not stops else max(len(x) for x in stops) - 1
        upto = max(comp.emitted, len(text) - hold)
        delta, comp.emitted = text[comp.emitted:upto], upto
        out.text = text
        request_finished = False
        if seq.is_finished:
            out.finish_reason = seq.finish_reason
            del self._requests[seq.seq_id]
            if comp.request.finished:
                request_finished = True
                self._by_request_id.pop(seq.request_id, None)
        return StepUpdate(seq.request_id, delta, [token], seq.is_finished, comp.request, out.index, new_logprobs,
                          request_finished)

    def _logprob_dict(self, token: int, logprobs: TokenLogprobs) -> dict[int, Logprob]:
        chosen, rank, top = logprobs
        d = {tid: Logprob(lp, r + 1, self.tokenizer.decode([tid], skip_special_tokens=False))
             for r, (tid, lp) in enumerate(top)}
        if token not in d:
            d[token] = Logprob(chosen, rank, self.tokenizer.decode([token], skip_special_tokens=False))
        return d

    @staticmethod
    def _find_stop(text: str, old_len: int, stops: list[str]) -> tuple[int | None, str | None]:
        """Earliest end-of-text cut for a stop string that appears in the newly added text, and that string."""
        best, which = None, None
        for s in stops:
            i = text.find(s, max(0, old_len - len(s) + 1))
            if i != -1 and (best is None or i < best):
                best, which = i, s
        return best, which


def _needs_host_tokens(seq: Sequence) -> bool:
    """Whether sampling ``seq``'s next token reads its generated tokens on the host."""
    return seq.params.has_penalties or bool(seq.params.logits_processors)


def _child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Completion ``index``'s params: its own seed (seed + index) and its own copy of stateful processors."""
    if params.n == 1 and not any(hasattr(p, "clone") for p in params.logits_processors):
        return params
    procs = [p.clone() if hasattr(p, "clone") else p for p in params.logits_processors]
    seed = None if params.seed is None else params.seed + index
    return dataclasses.replace(params, seed=seed, logits_processors=procs)
