"""Draft-model proposer: a second (smaller or cheaper) model with the target's vocabulary proposes k tokens by
decoding k steps on its own paged KV cache.

The draft cache has the target cache's geometry in blocks and shares each sequence's ``block_table``: a block
id addresses the same positions in both caches, so the target's BlockManager allocates, frees and trims for both.
``seq.num_draft_computed_tokens`` counts the positions whose draft K/V are valid; each proposal first catches the
draft up on the tokens it has not seen (the whole prompt the first time, then the last accepted tokens), so the
draft needs no work of its own during prefill, after preemption or after a prefix-cache hit.
"""

from __future__ import annotations

import torch

from engine.core.models.decoder import DecoderModel

from ..model_runner import ModelRunner
from ..sampler import Sampler, sampling_probs
from ..sequence import Sequence


class _View:
    """What the ModelRunner reads of a sequence, as the draft model sees it (its own computed count and the
    draft tokens appended so far)."""

    __slots__ = ("seq_id", "num_computed_tokens", "token_ids", "block_table")

    def __init__(self, seq: Sequence):
        self.seq_id, self.num_computed_tokens = seq.seq_id, seq.num_draft_computed_tokens
        self.token_ids, self.block_table = seq.token_ids, seq.block_table

    def __len__(self) -> int:
        return len(self.token_ids)

    def tokens_between(self, start: int, end: int) -> list[int]:
        return self.token_ids[start:end]


class DraftModelProposer:
    """``propose([(seq, k), ...]) -> ({seq_id: k draft tokens}, q [sum k, vocab])``: q holds, row by row in the
    order given, the distribution each draft token was drawn from (zeros for greedy requests, which take the
    draft's argmax). Slots for positions up to len(seq) + k - 2 must already be reserved in ``seq.block_table``."""

    def __init__(self, model: DecoderModel, num_blocks: int, block_size: int, sampler: Sampler):
        self.model, self.sampler = model, sampler
        self.runner = ModelRunner(model, num_blocks, block_size)  # eager: no decode graphs for the draft

    @torch.inference_mode()
    def propose(self, items: list[tuple[Sequence, int]]) -> tuple[dict[int, list[int]], torch.Tensor]:
        items = [(s, k) for s, k in items if k > 0]
        vocab = self.model.cfg.vocab_size
        total = sum(k for _, k in items)
        q = torch.zeros((total, vocab), dtype=torch.float32, device=self.model.device)
        drafts: dict[int, list[int]] = {s.seq_id: [] for s, _ in items}
        offsets, o = [], 0
        for _, k in items:
            offsets.append(o)
            o += k
        views = [_View(s) for s, _ in items]
        active = list(range(len(items)))
        step = 0
        while active:
            sched = [(views[i], len(views[i]) - views[i].num_computed_tokens) for i in active]
            logits, _ = self.runner.run(sched)
            seqs = [items[i][0] for i in active]
            rows = [offsets[i] + step for i in active]
            tokens = self._draw(logits, seqs, q, rows).tolist()
            for i, t in zip(active, tokens, strict=True):
                v = views[i]
                v.num_computed_tokens = len(v)
                v.token_ids = v.token_ids + [t]
                drafts[v.seq_id].append(t)
            step += 1
            active = [i for i in active if items[i][1] > step]
        for s, k in items:
            s.num_draft_computed_tokens = len(s) + k - 1  # the last draft token was never fed back
        return drafts, q

    def _draw(self, logits: torch.Tensor, seqs: list[Sequence], q: torch.Tensor, rows: list[int]) -> torch.Tensor:
        tokens = logits.argmax(dim=-1)
        rand = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if rand:
            idx = torch.tensor(rand, device=logits.device)
            rseqs = [seqs[i] for i in rand]
            p = sampling_probs(logits[idx].float(), [s.params for s in rseqs])
            p = p / p.sum(dim=-1, keepdim=True)
            tokens[idx] = (p / self.sampler._exponentials(p, rseqs)).argmax(dim=-1)
            q[torch.tensor([rows[i] for i in rand], device=q.device)] = p
        return tokens
