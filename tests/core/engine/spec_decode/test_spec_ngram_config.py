"""The n-gram proposer, the speculative config and its batch-size table, and BlockManager.trim."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.engine.block_manager import BlockManager
from engine.core.engine.scheduler import Scheduler
from engine.core.engine.sequence import Sequence
from engine.core.engine.spec_decode.config import SpeculativeConfig
from engine.core.engine.spec_decode.ngram import NgramProposer
from engine.core.engine.spec_decode.tuning import fill_table, pick_k
from engine.platforms.cpu.platform import CpuPlatform


def test_ngram_takes_the_longest_then_most_recent_match():
    prop = NgramProposer(1, 3)
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 8, 1, 6, 7, 9, 2, 6, 7]
    assert prop.propose(tokens, 2) == [9, 2]  # "6 7" last seen at 5..6 (2-gram; no 3-gram recurs)
    assert prop.propose(tokens + [9], 3) == [2, 6, 7]  # "6 7 9" recurs at 5..7
    assert prop.propose([1, 2, 3, 4], 3) == []
    assert prop.propose([4, 4], 3) == [4]  # the continuation ends at the sequence's end
    assert prop.propose(tokens, 0) == []
    assert NgramProposer(3, 3).propose([1, 2, 9, 1, 2], 2) == []  # 2-gram matches are below lookup_min



@pytest.mark.parametrize("lookup", [(1, 3), (3, 4), (2, 2)])
def test_ngram_index_answers_as_the_scan(lookup):
    """propose_for (the index kept on the sequence, extended as tokens come) proposes what propose (a scan of all
    tokens) does, after every growth of 1..8 tokens, on random text of a small vocabulary (many repeats)."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    prop = NgramProposer(*lookup)
    for vocab in (3, 8, 50):
        seq = Sequence(torch.randint(0, vocab, (int(torch.randint(0, 30, (), generator=gen)),), generator=gen)
                       .tolist(), SamplingParams())
        for _ in range(60):
            k = int(torch.randint(0, 9, (), generator=gen))
            assert prop.propose_for(seq, k) == prop.propose(seq.token_ids, k)
            grow = int(torch.randint(1, 9, (), generator=gen))
            seq.output_token_ids.extend(torch.randint(0, vocab, (grow,), generator=gen).tolist())
    prop.propose_for(seq, 1)
    assert seq.spec_ngram.ends == len(seq) - 1  # every n-gram but those ending with the last token


def test_ngram_index_is_remade_for_other_sizes():
    """A sequence asked by a proposer of other n-gram sizes gets an index of those sizes."""
    seq = Sequence([1, 2, 3, 9, 1, 2, 3, 9, 5, 1, 2, 3], SamplingParams())
    assert NgramProposer(4, 4).propose_for(seq, 2) == []  # no 4-gram recurs at the end
    assert NgramProposer(1, 3).propose_for(seq, 2) == NgramProposer(1, 3).propose(seq.token_ids, 2) == [9, 5]


def test_ngram_index_ignores_the_last_token_until_another_follows():
    """Under async scheduling a sequence's last token may be a placeholder replaced later: the index never holds
    an n-gram that ends with the last token, so the replacement is seen."""
    prop = NgramProposer(1, 2)
    seq = Sequence([4, 5, 6, 4], SamplingParams())
    seq.output_token_ids.append(-1)  # placeholder
    assert prop.propose_for(seq, 2) == []
    seq.output_token_ids[-1] = 5
    assert prop.propose_for(seq, 2) == prop.propose(seq.token_ids, 2) == [6, 4]


def test_batch_size_table():
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens_per_batch_size":
                                       {"8": 2, 1: 4, 32: 0}})
    assert [cfg.num_tokens_for(b) for b in (1, 7, 8, 31, 32, 100)] == [4, 4, 2, 2, 0, 0]
    assert cfg.max_num_speculative_tokens == 4
    assert SpeculativeConfig(num_speculative_tokens=3).num_tokens_for(50) == 3
    assert SpeculativeConfig(num_speculative_tokens_per_batch_size={4: 2}).num_tokens_for(1) == 2


@pytest.mark.parametrize("bad, msg", [({"method": "eagle"}, "method"), ({"num_speculative_tokens": -1}, ">= 0"),
                                      ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_max"),
                                      ({"num_speculative_tokens_per_batch_size": {0: 1}}, "key"),
                                      ({"lookahead": 3}, "unknown keys")])
def test_bad_config_is_a_clear_error(bad, msg):
    with pytest.raises(ValueError, match=msg):
        SpeculativeConfig.from_dict(bad)


def test_trim_frees_reserved_blocks_and_keeps_cached_ones():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = Sequence(list(range(9)), SamplingParams())
    assert bm.allocate(seq)  # 3 blocks for 9 tokens
    seq.num_computed_tokens = 9
    bm.mark_computed(seq)  # two full blocks registered
    assert bm.append_slots(seq, 6)  # reserve up to position 14: 4 blocks
    assert len(seq.block_table) == 4
    bm.trim(seq, len(seq))
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    with pytest.raises(ValueError, match="prefix cache"):
        bm.trim(seq, 4)
    bm.free(seq)
    assert bm.num_free_blocks == 8


def test_table_is_filled_from_measurements():
    # A machine where speculation pays at small batches only: k=2 best at B=1, k=1 at B=4, nothing at B=16,
    # and k=4 at B=1 fast on one workload but too slow on the other (below the floor).
    rates = {1: {0: 100, 1: 130, 2: 150, 4: 200}, 4: {0: 300, 1: 320, 2: 310, 4: 250}, 16: {0: 900, 1: 850, 2: 700,
                                                                                            4: 600}}

    def measure(b, workload, ks):
        slow_k4 = workload == "chat" and b == 1
        return {k: rates[b][k] * (0.4 if slow_k4 and k == 4 else 1.0) for k in ks}

    table, raw = fill_table(measure, [1, 4, 16], [1, 2, 4], ["repetitive", "chat"], floor=0.97)
    assert table == {1: 2, 4: 1, 16: 0}
    assert raw[16][0]["chat"] == 900
    assert pick_k({0: [1.0], 3: [0.96, 2.0]}) == 0  # one workload below the floor disqualifies k


def test_lookahead_uses_only_free_blocks_and_budget_and_never_preempts():
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_batched_tokens=10)
    a, b = (Sequence(list(range(n)), SamplingParams(max_tokens=100)) for n in (7, 3))
    sched.add(a)
    sched.add(b)
    sched.update(sched.schedule(), {a.seq_id: 7, b.seq_id: 7})  # a: 8 tokens in 2 blocks; b: 4 in 1 block
    sched.max_num_batched_tokens = 6
    sched.num_lookahead_slots = 4
    out = sched.schedule()
    assert not out.preempted and [n for _, n in out.scheduled] == [1, 1]
    # Budget 6 - 2 decode tokens = 4 lookahead slots in all; a takes them (1 free block + none left in its own).
    assert out.lookahead == {a.seq_id: 4}
    assert len(a.block_table) == 3 and bm.num_free_blocks == 0
    sched.update(out, {a.seq_id: 1, b.seq_id: 2})
    bm.trim(a, len(a))
    assert len(a.block_table) == 3 and bm.num_free_blocks == 0  # a now holds 9 tokens: 3 blocks needed
    sched.num_lookahead_slots = 0
    assert sched.schedule().lookahead == {}


@pytest.mark.usefixtures("default_model")
def test_a_config_without_k_takes_the_platforms_measured_table():
    llm = LLM(kv_cache_bytes=8 << 20, platform="cpu", speculative_config={"method": "ngram"})
    table = llm.engine.speculator.config.num_speculative_tokens_per_batch_size
    assert table == CpuPlatform.speculative_tables["ngram"] and table
    assert llm.engine.speculator.config.num_tokens_for(1) == table[1]
    llm = LLM(kv_cache_bytes=8 << 20, platform="cpu", activation_quant="q8", speculative_config={"method": "ngram"})
    q8 = llm.engine.speculator.config.num_speculative_tokens_per_batch_size
    assert q8 == CpuPlatform.speculative_tables["ngram+q8"] and q8 != table
    for given, k in (({"method": "ngram", "num_speculative_tokens": 3}, 3),
                     ({"method": "ngram", "num_speculative_tokens_per_batch_size": {1: 2}}, 2)):
        llm = LLM(kv_cache_bytes=8 << 20, platform="cpu", speculative_config=given)
        config = llm.engine.speculator.config
        assert config.num_tokens_for(1) == config.num_tokens_for(8) == k  # what the user gave, not the table
