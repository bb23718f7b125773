"""Speculator: one speculative engine step around the target model's forward.

``plan`` (before scheduling) sets how many draft tokens each decoding sequence may verify, from the batch-size
table; the scheduler reserves that many slots ahead where blocks and token budget are left. ``propose`` drafts up
to that many tokens per decoding sequence (skipping, for a few steps, one whose last drafts were all rejected:
``_adapt``). The ModelRunner then verifies every sequence's drafts in ONE target
forward (each sequence's last token plus its k drafts, as a k + 1 token chunk over the paged KV cache), and
``commit`` rejection-samples (rejection.py), records the emitted tokens one at a time through the scheduler and
the engine (so stop conditions apply at the exact token), and rolls back the rejected tokens: each sequence's
``num_computed_tokens`` covers only accepted tokens (so no block holding a rejected token is hashed into the
prefix cache), the reserved blocks past its tokens are freed, and a draft model forgets the rejected positions.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import torch

from ..sampler import Sampler, argmax_rows, plain_greedy, take_rows
from ..scheduler import Scheduler
from ..sequence import Sequence
from .config import SpeculativeConfig
from .ngram import NgramProposer
from .rejection import greedy_emit, rejection_sample


def can_speculate(seq: Sequence) -> bool:
    """Requests whose sampling depends on more than the logits row (penalties, logits processors such as
    grammars) or that return logprobs decode one token a step."""
    p = seq.params
    return (getattr(p, "presence_penalty", 0.0) == 0.0 and getattr(p, "frequency_penalty", 0.0) == 0.0
            and getattr(p, "repetition_penalty", 1.0) == 1.0 and not getattr(p, "logits_processors", None)
            and getattr(p, "logprobs", None) is None)


MAX_BACKOFF = 16
# With other sequences in the step, a sequence keeps drafting only while this share of its drafts (a running mean,
# each verify weighing half) is accepted. Alone, a step's extra rows are nearly free (memory-bound); beside others
# each draft row costs about what a decoded token does (on 2 CPU cores the linear layers are compute-bound from
# ~4 rows: 6.9 ms at M = 4, 23.8 ms at M = 20), so a draft must be accepted about as often as not to pay. Measured
# (session 19): repetitive text accepts ~0.9 of n-gram drafts, free chat far less, and chat at batch 4 lost 16-30%.
ACCEPTANCE_GATE = 0.5


def _adapt(seq: Sequence, drafted: int, accepted: int, batch_size: int = 1) -> None:
    """After a verify of ``drafted`` drafts that accepted ``accepted``: the next draft is at most accepted + 1 long
    when some were rejected, twice as long when all were taken (the table's k caps it). A miss (drafts rejected
    outright; with ``batch_size`` > 1 also a running acceptance below ACCEPTANCE_GATE) after m consecutive misses
    skips drafting for min(2^m, MAX_BACKOFF) decode steps. Rejected drafts cost forward rows for nothing (free chat,
    where n-gram lookup finds stale matches), while copying keeps hitting: a verify that is no miss resets the
    back-off, a fully accepted one lets the length grow back."""
    seq.spec_limit = 2 * drafted if accepted == drafted else accepted + 1
    rate = accepted / drafted
    prev = seq.spec_acceptance
    seq.spec_acceptance = rate if prev is None else 0.5 * (prev + rate)
    if accepted and (batch_size <= 1 or seq.spec_acceptance >= ACCEPTANCE_GATE):
        seq.spec_misses = 0
    else:
        seq.spec_misses += 1
        seq.spec_backoff = min(2 ** seq.spec_misses, MAX_BACKOFF)


def _merge(updates: list):
    """One StepUpdate for a sequence's tokens of one step: the last one's state, all the text and tokens."""
    last = updates[-1]
    if len(updates) == 1:
        return last
    lps = [u.new_logprobs for u in updates]
    return dataclasses.replace(last, delta_text="".join(u.delta_text for u in updates),
                               new_token_ids=[t for u in updates for t in u.new_token_ids],
                               new_logprobs=None if all(x is None for x in lps) else [d for x in lps for d in x or []])


class SpecStats:
    """Counts per batch size (number of running sequences when the step was planned)."""

    def __init__(self):
        self.by_batch_size: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def record(self, batch_size: int, k: int, drafted: int, accepted: int, emitted: int) -> None:
        d = self.by_batch_size[batch_size]
        d["steps"] += 1
        d["k"] = k
        d["drafted"] += drafted
        d["accepted"] += accepted
        d["emitted"] += emitted

    def totals(self) -> dict[str, int]:
        t = defaultdict(int)
        for d in self.by_batch_size.values():
            for key in ("steps", "drafted", "accepted", "emitted"):
                t[key] += d[key]
        return dict(t)

    @property
    def acceptance_rate(self) -> float:
        t = self.totals()
        return t["accepted"] / t["drafted"] if t.get("drafted") else 0.0


class Speculator:
    """Owns the proposer (n-gram, or a DraftModelProposer passed in) and the per-step speculative logic."""

    def __init__(self, config: SpeculativeConfig, scheduler: Scheduler, draft_proposer=None):
        self.config, self.scheduler = config, scheduler
        if config.method == "ngram":
            self.proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        elif draft_proposer is None:
            raise ValueError("speculative method 'draft_model' needs a draft model proposer")
        else:
            self.proposer = draft_proposer
        self.stats = SpecStats()
        self._batch_size = 0
        self._k = 0

    def plan(self) -> None:
        """Choose k for the coming step from the number of running sequences."""
        self._batch_size = len(self.scheduler.running)
        self._k = self.config.num_tokens_for(max(self._batch_size, 1))
        self.scheduler.num_lookahead_slots = self._k

    def propose(self, scheduled: list[tuple[Sequence, int]], lookahead: dict[int, int]
                ) -> tuple[dict[int, list[int]], torch.Tensor | None]:
        """Draft tokens for the decoding sequences that have reserved slots; q for a draft model's drafts."""
        limit = self.scheduler.max_seq_len
        items = []
        for seq, _ in scheduled:
            ahead = lookahead.get(seq.seq_id, 0)
            if not ahead or not can_speculate(seq):
                continue
            if seq.spec_backoff > 0:
                seq.spec_backoff -= 1
                continue
            # Emitting k + 1 tokens past max_tokens (or the context) would be wasted work.
            k = min(ahead, seq.params.max_tokens - len(seq.output_token_ids) - 1, limit - len(seq) - 1,
                    seq.spec_limit or ahead)
            if k > 0:
                items.append((seq, int(k)))
        if not items:
            return {}, None
        if isinstance(self.proposer, NgramProposer):
            drafts = {s.seq_id: self.proposer.propose_for(s, k) for s, k in items}
            return {i: d for i, d in drafts.items() if d}, None
        drafts, q = self.proposer.propose(items)
        return drafts, q

    def commit(self, engine, scheduled: list[tuple[Sequence, int]], logits: torch.Tensor,
               sampled_seqs: list[Sequence], drafts: dict[int, list[int]], q: torch.Tensor | None):
        """Accept or reject the drafts, record the emitted tokens, roll back the rest. Returns the engine's
        StepUpdates (one per sequence, holding all its tokens of the step) and {seq_id: tokens emitted}."""
        emitted, logprobs = self._verify(logits, sampled_seqs, drafts, q, engine.sampler)
        per_seq: dict[int, list] = {}
        counts = {}
        sub = [(s, n) for s, n in scheduled]
        i = 0
        while sub:
            # Token i of every sequence that emitted more than i tokens: the scheduler sees an ordinary step
            # (token 0 completes the granted chunk; token i > 0 follows an accepted draft, one computed token).
            sampled = {s.seq_id: emitted[s.seq_id][i] for s, _ in sub if s.seq_id in emitted}
            engine.scheduler.update(sub, sampled)
            for s, _ in sub:
                if s.seq_id in sampled and s.seq_id in engine._requests:
                    lp = logprobs.get(s.seq_id) if i == 0 else None
                    per_seq.setdefault(s.seq_id, []).append(engine._advance(s, sampled[s.seq_id], lp))
                    counts[s.seq_id] = i + 1
            i += 1
            sub = [(s, 1) for s, _ in sub if s.seq_id in emitted and len(emitted[s.seq_id]) > i
                   and not s.is_finished]
        self._roll_back(scheduled)
        updates = [_merge(u) for u in per_seq.values()]
        for seq in sampled_seqs:
            if seq.seq_id in drafts:
                _adapt(seq, len(drafts[seq.seq_id]), len(emitted[seq.seq_id]) - 1, self._batch_size)
        drafted = sum(len(d) for d in drafts.values())
        accepted = sum(len(emitted[i]) - 1 for i in drafts)
        self.stats.record(self._batch_size, self._k, drafted, accepted, sum(len(e) for e in emitted.values()))
        return updates, counts

    def release(self, scheduled: list[tuple[Sequence, int]], lookahead: dict[int, int]) -> None:
        """After a step that verified no drafts: free the slots reserved for them."""
        if lookahead:
            self._roll_back(scheduled)
            self.stats.record(self._batch_size, self._k, 0, 0, len(lookahead))

    def _roll_back(self, scheduled: list[tuple[Sequence, int]]) -> None:
        bm = self.scheduler.block_manager
        for seq, _ in scheduled:
            if not seq.is_finished:
                bm.trim(seq, len(seq))
                seq.num_draft_computed_tokens = min(seq.num_draft_computed_tokens, seq.num_computed_tokens)

    def _verify(self, logits, seqs, drafts, q, sampler: Sampler):
        rows, r = [], 0
        spec_idx, spec_rows, plain_idx, plain_rows = [], [], [], []
        for i, s in enumerate(seqs):
            k = len(drafts.get(s.seq_id, ()))
            if k:
                spec_idx.append(i)
                spec_rows.extend(range(r, r + k + 1))
            else:
                plain_idx.append(i)
                plain_rows.append(r)
            rows.append(r)
            r += k + 1
        emitted, logprobs = {}, {}
        if all(map(plain_greedy, seqs)):
            # Every row's token is its argmax: one argmax over all rows, no copies of rows (take_rows says why
            # that matters on the CPU beside the saved time).
            g = argmax_rows(logits).tolist()
            for s, r in zip(seqs, rows, strict=True):
                d = drafts.get(s.seq_id)
                emitted[s.seq_id] = greedy_emit(d, g[r:r + len(d) + 1]) if d else [g[r]]
                logprobs[s.seq_id] = None
            return emitted, logprobs
        if plain_idx:
            pseqs = [seqs[i] for i in plain_idx]
            x = take_rows(logits, plain_rows)
            tokens, lps = sampler.sample_with_logprobs(x, pseqs)
            for s, t, lp in zip(pseqs, tokens, lps, strict=True):
                emitted[s.seq_id] = [int(t)]
                logprobs[s.seq_id] = lp
        if spec_idx:
            sseqs = [seqs[i] for i in spec_idx]
            x = take_rows(logits, spec_rows)
            out = rejection_sample(x, sseqs, [drafts[s.seq_id] for s in sseqs], q, sampler)
            for s, toks in zip(sseqs, out, strict=True):
                emitted[s.seq_id] = toks
        return emitted, logprobs
