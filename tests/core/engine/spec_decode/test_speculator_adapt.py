"""speculator._adapt: the next draft's length and the back-off of a sequence whose drafts do not pay."""

from __future__ import annotations

from engine.core.engine.sampling_params import SamplingParams
from engine.core.engine.sequence import Sequence
from engine.core.engine.spec_decode.speculator import ACCEPTANCE_GATE, MAX_BACKOFF, _adapt


def _seq() -> Sequence:
    return Sequence([1, 2, 3], SamplingParams(max_tokens=8))


def test_length_follows_acceptance():
    s = _seq()
    _adapt(s, 4, 4)
    assert s.spec_limit == 8 and s.spec_backoff == 0 and s.spec_acceptance == 1.0
    _adapt(s, 4, 1)
    assert s.spec_limit == 2 and s.spec_backoff == 0 and s.spec_acceptance == (1.0 + 0.25) / 2


def test_outright_rejections_back_off_exponentially_at_any_batch_size():
    for batch_size in (1, 4):
        s = _seq()
        for m in range(1, 7):
            _adapt(s, 3, 0, batch_size)
            assert s.spec_misses == m and s.spec_backoff == min(2 ** m, MAX_BACKOFF)


def test_alone_a_poor_but_nonzero_acceptance_keeps_drafting():
    s = _seq()
    for _ in range(5):
        _adapt(s, 6, 1, batch_size=1)
        assert s.spec_backoff == 0 and s.spec_misses == 0
    assert s.spec_acceptance < ACCEPTANCE_GATE


def test_beside_other_sequences_a_poor_acceptance_backs_off():
    """1 of 6 accepted, four times: alone it would keep drafting; in a batch it backs off, longer each time."""
    s = _seq()
    backoffs = []
    for _ in range(4):
        _adapt(s, 6, 1, batch_size=4)
        backoffs.append(s.spec_backoff)
    assert backoffs == [2, 4, 8, 16]


def test_a_good_running_acceptance_in_a_batch_resets_the_back_off():
    s = _seq()
    _adapt(s, 4, 0, batch_size=4)
    assert s.spec_misses == 1
    _adapt(s, 4, 4, batch_size=4)  # running mean (0 + 1) / 2 = 0.5: at the gate, no miss
    assert s.spec_misses == 0 and s.spec_acceptance == 0.5
    _adapt(s, 4, 1, batch_size=4)  # (0.5 + 0.25) / 2 < 0.5: a miss although one was accepted
    assert s.spec_misses == 1 and s.spec_backoff == 2
