"""The rejection sampler keeps the target distribution: statistical tests on small random p/q (fresh each run)."""

from __future__ import annotations

import math

import torch

from engine import SamplingParams
from engine.core.engine.sampler import Sampler
from engine.core.engine.sequence import Sequence
from engine.core.engine.spec_decode.rejection import greedy_emit, rejection_sample
from engine.core.engine.spec_decode.speculator import Speculator

V = 8
N = 20000


def _critical(df: int, z: float = 3.9) -> float:
    """Chi-square critical value (Wilson-Hilferty), z = 3.9: a false alarm about once in 20,000 runs."""
    a = 2.0 / (9 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def _chi2(tokens: torch.Tensor, p: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=len(p)).double()
    expected = p.double() * len(tokens)
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was emitted"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def _random_dist(gen_scale: float = 2.0) -> torch.Tensor:
    return torch.softmax(torch.randn(V) * gen_scale, dim=0)


def _run(p_rows: list[torch.Tensor], q_rows: list[torch.Tensor] | None, drafts: list[list[int]], params):
    seqs = [Sequence([1], params) for _ in drafts]
    logits = torch.cat([torch.stack(p_rows).log()] * len(drafts))
    q = None if q_rows is None else torch.cat([torch.stack(q_rows)] * len(drafts))
    return rejection_sample(logits, seqs, drafts, q, Sampler())


def test_draft_model_rejection_keeps_the_target_distribution():
    p1, p2, p3 = (_random_dist() for _ in range(3))
    # q1 half p1: at least half the first drafts are accepted, so the second-token check always has its ~10,000
    # samples (two independent random q1 overlapped p1 as little as 2%: 409 samples, under the 500 it needs).
    q1, q2 = 0.5 * (p1 + _random_dist()), _random_dist()
    d1 = torch.multinomial(q1, N, replacement=True).tolist()
    d2 = torch.multinomial(q2, N, replacement=True).tolist()
    drafts = [[a, b] for a, b in zip(d1, d2, strict=True)]
    out = _run([p1, p2, p3], [q1, q2], drafts, SamplingParams(temperature=1.0, top_p=1.0))
    assert all(1 <= len(o) <= 3 for o in out)
    first = torch.tensor([o[0] for o in out])
    assert _chi2(first, p1) < _critical(V - 1)
    second = torch.tensor([o[1] for o in out if len(o) >= 2])  # after an accepted first draft: ~ p2
    assert len(second) > 500
    assert _chi2(second, p2) < _critical(V - 1)
    bonus = torch.tensor([o[2] for o in out if len(o) == 3])  # both accepted: the bonus token ~ p3
    if len(bonus) > 500:
        assert _chi2(bonus, p3) < _critical(V - 1)
    # The test can fail: the draft distribution itself is far from p1 and is rejected by the same check.
    if 0.5 * (q1 - p1).abs().sum() > 0.2:
        assert _chi2(torch.tensor(d1), p1) > _critical(V - 1)


def test_point_mass_drafts_and_sampling_filters():
    """n-gram drafts (q a point mass) under top-k and temperature: tokens follow the filtered target."""
    p1, p2 = _random_dist(), _random_dist()
    params = SamplingParams(temperature=0.7, top_k=5, top_p=1.0)
    draft = int(torch.randint(V, ()))
    out = _run([p1, p2], None, [[draft]] * N, params)
    x = p1.log() / 0.7
    x[x.argsort(descending=True)[5:]] = -math.inf
    target = torch.softmax(x, dim=0)
    first = torch.tensor([o[0] for o in out])
    assert _chi2(first, target) < _critical(V - 1)
    accepted = sum(len(o) == 2 for o in out) / N
    assert abs(accepted - float(target[draft])) < 4 * math.sqrt(0.25 / N) + 1e-9


def test_greedy_accepts_while_the_draft_is_the_argmax():
    logits = torch.randn(4, V)
    best = logits.argmax(dim=-1).tolist()
    wrong = (best[1] + 1) % V
    seqs = [Sequence([1], SamplingParams(temperature=0)) for _ in range(2)]
    out = rejection_sample(torch.cat([logits[:3], logits[:1]]), seqs, [[best[0], wrong], []], None, Sampler())
    assert out == [[best[0], best[1]], [best[0]]]
    out = rejection_sample(logits[:3], seqs[:1], [[best[0], best[1]]], None, Sampler())
    assert out == [[best[0], best[1], best[2]]]


def test_seeded_requests_repeat():
    p1, p2 = _random_dist(), _random_dist()
    logits = torch.stack([p1, p2]).log()
    runs = []
    for _ in range(2):
        seqs = [Sequence([1], SamplingParams(temperature=1.0, seed=1234)) for _ in range(50)]
        runs.append(rejection_sample(torch.cat([logits] * 50), seqs, [[3]] * 50, None, Sampler()))
    assert runs[0] == runs[1]


def test_greedy_emit_keeps_drafts_up_to_the_first_mismatch():
    """Against a brute-force walk, on random drafts of every length 0..6 that match a random prefix."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    for _ in range(200):
        k = int(torch.randint(0, 7, (), generator=gen))
        targets = torch.randint(0, 5, (k + 1,), generator=gen).tolist()
        match = int(torch.randint(0, k + 1, (), generator=gen))
        draft = targets[:match] + torch.randint(0, 5, (k - match,), generator=gen).tolist()
        want = []
        for j in range(k + 1):
            want.append(targets[j])
            if j == k or draft[j] != targets[j]:
                break
        assert greedy_emit(draft, targets) == want


def test_verify_of_greedy_rows_equals_rejection_sampling_per_sequence():
    """Speculator._verify's all-greedy path (one argmax over every row) emits what rejection_sample gives each
    sequence on its own rows, sequences without drafts their row's argmax."""
    drafts_by_seq = [[], [1, 2, 3], [4], [], [5, 6]]
    seqs = [Sequence([1, 2], SamplingParams(temperature=0)) for _ in drafts_by_seq]
    rows = sum(len(d) + 1 for d in drafts_by_seq)
    logits = torch.randn(rows, V)
    best = logits.argmax(dim=-1).tolist()
    drafts_by_seq[1][0] = best[1]  # one accepted draft at least
    drafts = {s.seq_id: d for s, d in zip(seqs, drafts_by_seq, strict=True) if d}
    emitted, logprobs = Speculator._verify(None, logits, seqs, drafts, None, Sampler())
    r = 0
    for s, d in zip(seqs, drafts_by_seq, strict=True):
        want = rejection_sample(logits[r:r + len(d) + 1], [s], [d], None, Sampler())[0] if d else [best[r]]
        assert emitted[s.seq_id] == want and logprobs[s.seq_id] is None
        r += len(d) + 1
    assert emitted[seqs[1].seq_id][0] == best[1]
