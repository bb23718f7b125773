"""Sampler: penalties, logits processors and top-k log-probabilities against plain-torch references."""

from __future__ import annotations

import pytest
import torch

from engine.core.engine.sampler import Sampler, _process
from engine.core.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from engine.core.engine.sequence import Sequence


def _seq(prompt, output, **params):
    s = Sequence(prompt, SamplingParams(temperature=0, **params))
    s.output_token_ids = list(output)
    return s


@pytest.mark.parametrize("vocab", [7, 50, 1000])
def test_penalties_match_the_reference_rule(gen, vocab):
    logits = torch.randn(3, vocab, generator=gen) * 3
    prompt = torch.randint(0, vocab, (5,), generator=gen).tolist()
    output = torch.randint(0, vocab, (9,), generator=gen).tolist()
    seqs = [_seq(prompt, output, repetition_penalty=1.7), _seq(prompt, output, presence_penalty=0.6,
            frequency_penalty=-0.4), _seq(prompt, output)]
    got = _process(logits, seqs)
    ref = logits.clone()
    for t in set(prompt) | set(output):  # repetition: prompt and output tokens
        v = ref[0, t]
        ref[0, t] = v / 1.7 if v > 0 else v * 1.7
    counts = torch.bincount(torch.tensor(output), minlength=vocab).float()
    ref[1] -= -0.4 * counts + 0.6 * (counts > 0).float()
    torch.testing.assert_close(got, ref)
    assert torch.equal(logits, logits.clone())  # the input is not modified


def test_greedy_follows_the_penalised_logits():
    logits = torch.tensor([[5.0, 4.9, 0.0]])
    assert Sampler().sample(logits, [_seq([1], [])]).item() == 0
    assert Sampler().sample(logits, [_seq([1], [0], presence_penalty=1.0)]).item() == 1


def test_logits_processors_see_the_generated_tokens(gen):
    seen = []

    def only_two(ids, row):
        seen.append(list(ids))
        out = torch.full_like(row, float("-inf"))
        out[2] = row[2]
        return out

    s = _seq([1, 2], [4, 5], logits_processors=[only_two])
    s.params.temperature = 1.0
    assert Sampler(gen).sample(torch.randn(1, 9, generator=gen), [s]).item() == 2
    assert seen == [[4, 5]]


@pytest.mark.parametrize("k", [0, 1, 5, MAX_LOGPROBS])
def test_logprobs_are_the_raw_top_k(gen, k):
    vocab = 300
    logits = torch.randn(4, vocab, generator=gen) * 2
    seqs = [_seq([1], [], logprobs=k), _seq([1], []), _seq([1], [3], logprobs=k, repetition_penalty=2.0),
            _seq([1], [], logprobs=2)]
    for s in seqs[2:]:
        s.params.temperature = 0.8
    tokens, lps = Sampler(gen).sample_with_logprobs(logits, seqs)
    assert lps[1] is None
    ref = logits.log_softmax(-1)
    for i in (0, 2, 3):
        chosen, rank, top = lps[i]
        kk = seqs[i].params.logprobs
        assert chosen == pytest.approx(ref[i, tokens[i]].item(), abs=1e-5)
        assert rank == int((ref[i] > ref[i, tokens[i]]).sum()) + 1
        want = ref[i].topk(kk)
        assert [t for t, _ in top] == want.indices.tolist()
        assert [v for _, v in top] == pytest.approx(want.values.tolist(), abs=1e-5)
    assert lps[0][1] == 1  # greedy row: the sampled token is the most likely one


@pytest.mark.parametrize("bad", [dict(n=0), dict(n=17), dict(logprobs=MAX_LOGPROBS + 1), dict(logprobs=-1),
                                 dict(presence_penalty=2.5), dict(frequency_penalty=-3), dict(repetition_penalty=0),
                                 dict(logits_processors=[3]), dict(n=True)])
def test_invalid_params_are_refused(bad):
    with pytest.raises(ValueError, match="invalid SamplingParams"):
        SamplingParams(**bad)
