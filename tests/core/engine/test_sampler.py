"""Sampler: greedy, filters (top-k, top-p, min-p), the sampled distribution, and seeded reproducibility."""

from __future__ import annotations

import math
import random

import pytest
import torch

from engine.core.engine.sampler import Sampler, take_rows
from engine.core.engine.sampling_params import SamplingParams
from engine.core.engine.sequence import Sequence

DRAWS = 40_000


NEUTRAL = {"temperature": 1.0, "top_p": 1.0}  # the plain softmax, whatever SamplingParams' defaults are


def _seqs(n: int, **params) -> list[Sequence]:
    p = SamplingParams(**{**NEUTRAL, **params})
    return [Sequence([1], p) for _ in range(n)]


def _chi2_bound(df: int, z: float = 4.75) -> float:
    """Upper chi-square quantile at about 1e-6 (Wilson-Hilferty), so a correct sampler fails ~never."""
    a = 2 / (9 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def _assert_matches(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    """Sampled frequencies follow ``probs``; tokens with probability 0 never appear."""
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    support = probs > 0
    assert counts[~support].sum() == 0, "sampled a filtered-out token"
    expected = probs[support].double() * tokens.numel()
    stat = ((counts[support] - expected) ** 2 / expected).sum().item()
    df = int(support.sum()) - 1
    if df > 0:
        assert stat < _chi2_bound(df), f"chi-square {stat:.1f} with {df} dof"


def _draw(logits_row: torch.Tensor, **params) -> torch.Tensor:
    return Sampler().sample(logits_row.expand(DRAWS, -1).contiguous(), _seqs(DRAWS, **params))


def test_greedy_rows_take_the_argmax_in_a_mixed_batch():
    logits = torch.randn(64, 100)
    seqs = [Sequence([1], SamplingParams(temperature=[0.0, 0.8][i % 2])) for i in range(64)]
    out = Sampler().sample(logits, seqs)
    assert out.dtype == torch.int64 and out.shape == (64,)
    greedy = torch.tensor([s.params.greedy for s in seqs])
    assert torch.equal(out[greedy], logits.argmax(-1)[greedy])
    assert not torch.equal(out[~greedy], logits.argmax(-1)[~greedy])  # sampled rows are not all the argmax


@pytest.mark.parametrize("params", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}])
def test_degenerate_filters_are_greedy(params):
    logits = torch.randn(512, 200) * 3
    out = Sampler().sample(logits, _seqs(512, temperature=1.5, **params))
    assert torch.equal(out, logits.argmax(-1))


def test_temperature_matches_softmax():
    logits = torch.randn(8) * 2
    t = random.uniform(0.5, 2.0)
    _assert_matches(_draw(logits, temperature=t), torch.softmax(logits / t, -1))


def test_top_k_samples_the_renormalised_top_k():
    logits = torch.randn(12)
    k = random.randint(2, 6)
    probs = torch.softmax(logits, -1)
    keep = torch.zeros(12, dtype=torch.bool)
    keep[logits.topk(k).indices] = True
    expected = torch.where(keep, probs, 0.0)
    _assert_matches(_draw(logits, top_k=k), expected / expected.sum())


def test_top_p_samples_the_smallest_nucleus():
    logits = torch.randn(12) * 1.5
    p = random.uniform(0.3, 0.9)
    probs = torch.softmax(logits, -1)
    order = probs.argsort(descending=True)
    cum, keep = 0.0, torch.zeros(12, dtype=torch.bool)
    for i in order.tolist():  # smallest set of most likely tokens whose mass reaches p
        keep[i] = True
        cum += probs[i].item()
        if cum >= p:
            break
    expected = torch.where(keep, probs, 0.0)
    _assert_matches(_draw(logits, top_p=p), expected / expected.sum())


def test_min_p_excludes_unlikely_tokens():
    logits = torch.randn(12) * 2
    min_p = random.uniform(0.05, 0.5)
    probs = torch.softmax(logits, -1)
    expected = torch.where(probs >= min_p * probs.max(), probs, 0.0)
    assert (expected == 0).any()
    _assert_matches(_draw(logits, min_p=min_p), expected / expected.sum())


def test_top_k_then_top_p_combined():
    logits = torch.randn(12)
    k, p = 5, random.uniform(0.4, 0.8)
    top = logits.topk(k)
    renorm = torch.softmax(top.values, -1)  # top-p acts on the renormalised top-k
    n_keep = int((renorm.cumsum(-1) - renorm < p).sum())
    expected = torch.zeros(12)
    expected[top.indices[:n_keep]] = renorm[:n_keep]
    _assert_matches(_draw(logits, top_k=k, top_p=p), expected / expected.sum())


def test_per_row_params_in_one_batch():
    """Rows with different settings in one batch each follow their own distribution."""
    logits = torch.randn(10)
    settings = [{"temperature": 0.7}, {"top_k": 3}, {"min_p": 0.2}, {"temperature": 0.0}]
    seqs = [Sequence([1], SamplingParams(**{**NEUTRAL, **settings[i % 4]})) for i in range(4 * 10_000)]
    out = Sampler().sample(logits.expand(len(seqs), -1).contiguous(), seqs)
    probs = torch.softmax(logits, -1)
    _assert_matches(out[0::4], torch.softmax(logits / 0.7, -1))
    topk = torch.zeros(10, dtype=torch.bool)
    topk[logits.topk(3).indices] = True
    _assert_matches(out[1::4], torch.where(topk, probs, 0.0) / probs[topk].sum())
    mp = torch.where(probs >= 0.2 * probs.max(), probs, 0.0)
    _assert_matches(out[2::4], mp / mp.sum())
    assert (out[3::4] == logits.argmax()).all()


def test_seeded_requests_ignore_batch_composition():
    vocab, steps = 50, 12
    step_logits = [torch.randn(vocab) for _ in range(steps)]
    seed = random.randrange(2**31)

    def tokens(batch_of):  # the seeded request's tokens when batched with `batch_of(step)` other rows
        me = Sequence([1], SamplingParams(seed=seed, top_p=0.9))
        got = []
        for i, row in enumerate(step_logits):
            others = batch_of(i)
            seqs = others[: i % (len(others) + 1)] + [me] + others[i % (len(others) + 1):]
            logits = torch.randn(len(seqs), vocab)
            logits[seqs.index(me)] = row
            got.append(Sampler().sample(logits, seqs)[seqs.index(me)].item())
        return got

    alone = tokens(lambda i: [])
    crowded = tokens(lambda i: [Sequence([1], SamplingParams(seed=random.randrange(99), temperature=0.5))
                                for _ in range(i % 3)] + _seqs(5, temperature=1.2))
    assert alone == crowded
    other_seed = Sequence([1], SamplingParams(seed=seed + 1, top_p=0.9))
    assert [Sampler().sample(r[None], [other_seed]).item() for r in step_logits] != alone


def test_rejects_mismatched_batch():
    with pytest.raises(ValueError, match="logits must be"):
        Sampler().sample(torch.randn(3, 10), _seqs(2))


def _hard_rows(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Random logits whose rows hold a tie of four maxima, NaNs, all -inf, and +inf; and the columns used."""
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    x = torch.randn(6, 3000, generator=gen).to(dtype)
    cols = torch.randint(0, 3000, (6, 4), generator=gen)
    x[0, cols[0]] = x[0].max() + 1  # a tie of four maxima
    x[1, cols[1, :2]] = float("nan")
    x[2] = float("-inf")
    x[3, cols[3]] = float("inf")
    return x, cols


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_picks_torchs_argmax_with_ties_nan_and_inf(dtype):
    """Greedy rows take the first maximum (host fp32 rows through numpy): ties, NaN and all -inf rows as torch."""
    x, cols = _hard_rows(dtype)
    with torch.inference_mode():
        got = Sampler().sample(x, _seqs(6, temperature=0.0))
    assert got.dtype == torch.int64 and torch.equal(got, x.argmax(dim=-1))
    assert got[0] == cols[0].min() and got[1] == cols[1, :2].min()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_greedy_host_path_agrees_with_the_general_one(dtype):
    """sample_with_logprobs' short path (every row greedy with nothing to apply, fp32 on the host) returns what
    the general path returns; a row asking for logprobs, or a penalty, takes the general path and gets them."""
    x, _ = _hard_rows(dtype)
    seqs = _seqs(6, temperature=0.0)
    sampler = Sampler()
    with torch.inference_mode():
        tokens, lps = sampler.sample_with_logprobs(x, seqs)
        general = sampler.sample_on_device(x, seqs).to_host().result()
    assert (tokens, lps) == general and tokens == x.argmax(dim=-1).tolist() and lps == [None] * 6
    assert all(isinstance(t, int) for t in tokens)
    seqs[4] = Sequence([1], SamplingParams(temperature=0.0, logprobs=2))
    seqs[5] = Sequence([1, 7], SamplingParams(temperature=0.0, repetition_penalty=1.5))
    with torch.inference_mode():
        tokens, lps = sampler.sample_with_logprobs(x, seqs)
    assert tokens[:5] == x.argmax(dim=-1).tolist()[:5]
    assert lps[4] is not None and len(lps[4][2]) == 2 and lps[5] is None


def test_plain_greedy_host_path_reads_a_reused_tensor_anew():
    """The decode graphs hand the sampler the same logits tensor every step, rewritten in place: the short path
    keeps a numpy view of it, so each call must see the new values; another tensor, and a bf16 one (no numpy
    view: the general path), still get their own argmax."""
    sampler, seqs = Sampler(), _seqs(3, temperature=0.0)
    buf = torch.empty(3, 1000)
    with torch.inference_mode():
        for _ in range(4):
            buf.copy_(torch.randn(3, 1000))
            assert sampler.sample_with_logprobs(buf, seqs)[0] == buf.argmax(dim=-1).tolist()
        other = torch.randn(3, 1000)
        assert sampler.sample_with_logprobs(other, seqs)[0] == other.argmax(dim=-1).tolist()
        half = torch.randn(3, 1000).bfloat16()
        assert sampler.sample_with_logprobs(half, seqs)[0] == half.argmax(dim=-1).tolist()
        buf.copy_(torch.randn(3, 1000))
        assert sampler.sample_with_logprobs(buf, seqs)[0] == buf.argmax(dim=-1).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_take_rows_equals_indexing(dtype):
    """take_rows (numpy on host fp32 logits, index_select otherwise) returns x[rows]: any order, repeats, a copy."""
    x = torch.randn(12, 1000).to(dtype)
    for rows in ([0], [3, 1, 2], [5, 5, 11, 0], list(range(12))):
        got = take_rows(x, rows)
        assert got.dtype == dtype and torch.equal(got, x[torch.tensor(rows)])
    got = take_rows(x, [2])
    got.zero_()
    assert x[2].abs().sum() > 0
