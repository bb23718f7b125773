"""Sequence (core/engine/sequence.py): token slices taken without building the whole token list."""

from __future__ import annotations

import random

import pytest

from engine.core.engine.sampling_params import SamplingParams
from engine.core.engine.sequence import Sequence


@pytest.mark.parametrize("prompt_len,output_len", [(1, 0), (5, 0), (5, 3), (17, 40)])
def test_tokens_between_is_the_slice_of_token_ids(prompt_len, output_len):
    rng = random.Random()
    seq = Sequence([rng.randrange(50_000) for _ in range(prompt_len)], SamplingParams())
    seq.output_token_ids.extend(rng.randrange(50_000) for _ in range(output_len))
    n = len(seq)
    for start in range(n + 2):
        for end in range(start, n + 3):
            assert seq.tokens_between(start, end) == seq.token_ids[start:end], (start, end)
