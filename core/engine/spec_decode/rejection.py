"""Rejection sampling of draft tokens against the target model (Leviathan et al. 2023; Chen et al. 2023).

A sequence with k draft tokens d_1..d_k has k + 1 rows of target logits: row j is the target's next-token
distribution p_j after the sequence plus d_1..d_{j-1}. Walking j = 1..k, d_j is accepted with probability
min(1, p_j(d_j) / q_j(d_j)) (q_j: the draft's distribution; a point mass on d_j for n-gram drafts, where this is
p_j(d_j)); at the first rejection the token is drawn from norm(max(0, p_j - q_j)) and the walk stops; if all k
are accepted a bonus token is drawn from p_{k+1}. Every emitted token is then distributed exactly as p: the
output of the sequence is a sample from the target model. Greedy requests accept while d_j equals the target's
argmax and emit the argmax at the first mismatch, so their tokens equal non-speculative greedy decoding.

p_j is the sampler's own distribution (``sampling_probs``: temperature, top-k, top-p, min-p), renormalised.
"""

from __future__ import annotations

import torch

from ..sampler import Sampler, _seq_generator, argmax_rows, sampling_probs
from ..sequence import Sequence


def rejection_sample(logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]],
                     draft_probs: torch.Tensor | None, sampler: Sampler) -> list[list[int]]:
    """``logits`` [sum(len(d) + 1), V]: each sequence's rows in order. ``draft_probs`` [sum(len(d)), V]: q for
    each draft token in the same order (rows of greedy sequences are ignored), or None for point-mass drafts.
    Returns each sequence's emitted tokens: its accepted drafts, then one target token (1 .. k + 1 tokens).
    One device-to-host read."""
    num_rows = sum(len(d) + 1 for d in drafts)
    if logits.dim() != 2 or logits.shape[0] != num_rows or len(seqs) != len(drafts):
        raise ValueError(f"rejection_sample: logits {tuple(logits.shape)} do not hold {num_rows} rows for "
                         f"{len(seqs)} sequences with {len(drafts)} drafts")
    device = logits.device
    greedy_tok = argmax_rows(logits)
    row_seq, draft_row, draft_tok, q_row = [], [], [], []
    num_q = 0
    for s, d in zip(seqs, drafts, strict=True):
        row_seq.extend([s] * (len(d) + 1))
        draft_row.extend([True] * len(d) + [False])
        draft_tok.extend(d + [0])
        q_row.extend([*range(num_q, num_q + len(d)), 0])  # the bonus row's 0 is masked out below
        num_q += len(d)
    rand = [i for i, s in enumerate(row_seq) if not s.params.greedy]
    accept = torch.zeros(num_rows, dtype=torch.int64, device=device)
    alt = torch.zeros(num_rows, dtype=torch.int64, device=device)
    if rand:
        idx = torch.tensor(rand, device=device)
        rseqs = [row_seq[i] for i in rand]
        p = sampling_probs(logits[idx].float(), [s.params for s in rseqs])
        p = p / p.sum(dim=-1, keepdim=True)
        is_draft = torch.tensor([draft_row[i] for i in rand], device=device)
        tok = torch.tensor([draft_tok[i] for i in rand], device=device).unsqueeze(1)
        p_d = p.gather(1, tok).squeeze(1)
        if draft_probs is None or draft_probs.shape[0] == 0:
            q = torch.zeros_like(p).scatter_(1, tok, 1.0)
        else:
            rows = torch.tensor([q_row[i] for i in rand], device=device)
            q = draft_probs[rows].float()
        q = q * is_draft.unsqueeze(1)  # bonus rows: no draft, the residual is p itself
        q_d = q.gather(1, tok).squeeze(1)
        u = _uniforms(rseqs, device, sampler.generator)
        ok = (u * q_d < p_d) & is_draft
        resid = (p - q).clamp_min_(0.0)
        empty = resid.sum(dim=-1, keepdim=True) <= 0  # p == q up to rounding: rejection had ~0 probability
        resid = torch.where(empty, p, resid)
        drawn = (resid / sampler._exponentials(resid, rseqs)).argmax(dim=-1)
        accept[idx] = ok.long()
        alt[idx] = drawn
    out = torch.stack([greedy_tok, accept, alt]).tolist()
    g, acc, alt_tok = out
    result, r = [], 0
    for s, d in zip(seqs, drafts, strict=True):
        if s.params.greedy:
            result.append(greedy_emit(d, g[r:r + len(d) + 1]))
        else:
            j = next((j for j in range(len(d)) if not acc[r + j]), len(d))
            result.append([*d[:j], alt_tok[r + j]])
        r += len(d) + 1
    return result


def greedy_emit(draft: list[int], targets: list[int]) -> list[int]:
    """Greedy verification of ``draft`` (k tokens) against ``targets``, the target model's argmax at each of its
    k + 1 rows: the drafts up to the first that differs from its row's argmax, then that argmax (after k matching
    drafts, the last row's: the bonus token)."""
    j = next((j for j, t in enumerate(draft) if t != targets[j]), len(draft))
    return [*draft[:j], targets[j]]


def _uniforms(seqs: list[Sequence], device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """U[0, 1) per row; a seeded request's rows come from its own generator (as the Sampler's draws do)."""
    u = torch.empty(len(seqs), device=device)
    seeded = [i for i, s in enumerate(seqs) if s.params.seed is not None]
    if len(seeded) < len(seqs):
        u.uniform_(generator=generator)
    for i in seeded:
        u[i:i + 1].uniform_(generator=_seq_generator(seqs[i], device))
    return u
