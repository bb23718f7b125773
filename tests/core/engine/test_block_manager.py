"""BlockManager: allocation, prefix-cache hits with shared ref-counted blocks, LRU eviction, accounting."""

from __future__ import annotations

import random

import pytest

from engine.core.engine.block_manager import BlockManager
from engine.core.engine.sampling_params import SamplingParams
from engine.core.engine.sequence import Sequence


def _seq(tokens: list[int]) -> Sequence:
    return Sequence(tokens, SamplingParams())


def _rand_tokens(n: int, vocab: int = 1000) -> list[int]:
    return [random.randrange(vocab) for _ in range(n)]


def _compute(bm: BlockManager, seq: Sequence, upto: int | None = None) -> None:
    """What the runner and scheduler do after a step: the tokens are computed, full blocks get registered."""
    seq.num_computed_tokens = len(seq) if upto is None else upto
    bm.mark_computed(seq)


def test_rejects_bad_sizes():
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(8, 0)
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(-1, 16)


def test_prefix_hit_shares_blocks_with_ref_counts():
    bs = random.choice([2, 4, 8])
    bm = BlockManager(64, bs)
    a = _seq(_rand_tokens(3 * bs + 1))
    assert bm.allocate(a) and a.num_computed_tokens == 0 and len(a.block_table) == 4
    _compute(bm, a)
    assert bm.num_cached_blocks == 3

    # b shares a's first two blocks, then diverges.
    b = _seq(a.token_ids[:2 * bs] + [t + 1 for t in a.token_ids[2 * bs:3 * bs]])
    assert bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] not in a.block_table
    assert b.num_computed_tokens == b.num_cached_tokens == 2 * bs
    assert [bm.ref_count(x) for x in a.block_table] == [2, 2, 1, 1]

    # A different first token means no hit at all, even if later blocks match.
    c = _seq([a.token_ids[0] + 1] + a.token_ids[1:])
    assert bm.allocate(c) and c.num_cached_tokens == 0 and not set(c.block_table) & set(a.block_table)

    for s in (a, b, c):
        bm.free(s)
    assert bm.num_free_blocks == 64 and bm.usage == 0.0


def test_hits_are_chained_on_the_whole_prefix():
    """A block matches only if every block before it matches too, even when each block alone is cached."""
    bs = 4
    bm = BlockManager(32, bs)
    x0, x1, y0, y1 = (_rand_tokens(bs) for _ in range(4))
    for tokens in (x0 + x1, y0 + y1):
        s = _seq(tokens + [1])
        bm.allocate(s)
        _compute(bm, s)
    mixed = _seq(y0 + x1 + [1])
    assert bm.allocate(mixed) and mixed.num_cached_tokens == bs


@pytest.mark.parametrize("extra", [0, 1])
def test_full_hit_leaves_last_token_to_compute(extra):
    bs = 4
    bm = BlockManager(16, bs)
    a = _seq(_rand_tokens(3 * bs))
    bm.allocate(a)
    _compute(bm, a)
    # Same tokens (3 full blocks) or one more: at least one token must remain to compute, in a private block.
    b = _seq(a.token_ids + _rand_tokens(extra))
    assert bm.allocate(b)
    expected_hits = (len(b) - 1) // bs
    assert b.num_computed_tokens == expected_hits * bs < len(b)
    assert b.block_table[:expected_hits] == a.block_table[:expected_hits]
    assert all(bm.ref_count(x) == 1 for x in b.block_table[expected_hits:])


def test_partial_hit_takes_over_a_finished_sequences_block():
    """A prompt shorter than a block, repeated after its request finished: all but its last token hit."""
    bs = 16
    bm = BlockManager(8, bs)
    prompt = _rand_tokens(15)
    a = _seq(prompt)
    assert bm.allocate(a) and a.num_cached_tokens == 0
    _compute(bm, a)
    a.output_token_ids.append(7)  # the first generated token fills the block, which gets registered
    _compute(bm, a)
    block = a.block_table[0]
    assert bm.num_cached_blocks == 1
    bm.free(a)
    b = _seq(prompt)
    assert bm.allocate(b)
    assert b.block_table == [block] and b.num_computed_tokens == b.num_cached_tokens == 14
    assert bm.num_cached_blocks == 0 and bm.ref_count(block) == 1  # taken out of the cache: b overwrites it
    # A prompt sharing only some leading tokens with the (re-registered) block gets just those.
    b.output_token_ids.append(9)
    _compute(bm, b)
    bm.free(b)
    c = _seq(prompt[:5] + [t + 1000 for t in prompt[5:]])
    assert bm.allocate(c) and c.block_table == [block] and c.num_cached_tokens == 5
    bm.free(c)
    assert bm.num_free_blocks == 8


def test_partial_hit_never_takes_a_referenced_block_and_follows_whole_hits():
    bs = 4
    bm = BlockManager(16, bs)
    tokens = _rand_tokens(3 * bs)
    a = _seq(tokens)
    bm.allocate(a)
    _compute(bm, a)
    b = _seq(tokens[:2 * bs + 2] + [5000])  # 2 whole hits, then 2 tokens matching a's referenced third block
    assert bm.allocate(b) and b.num_cached_tokens == 2 * bs and b.block_table[2] != a.block_table[2]
    third = a.block_table[2]
    bm.free(b)
    bm.free(a)
    c = _seq(tokens[:2 * bs + 2] + [5000])
    assert bm.allocate(c) and c.num_cached_tokens == 2 * bs + 2 and c.block_table[2] == third
    assert [bm.ref_count(x) for x in c.block_table] == [1, 1, 1]
    bm.free(c)
    assert bm.num_free_blocks == 16


def test_allocate_fails_without_side_effects_and_chunks():
    bs = 4
    bm = BlockManager(3, bs)
    s = _seq(_rand_tokens(3 * bs + 1))  # needs 4 blocks
    assert not bm.allocate(s)
    assert s.block_table == [] and bm.num_free_blocks == 3
    assert bm.allocate(s, max_new_tokens=bs + 1)  # a first chunk needs only 2
    assert len(s.block_table) == 2 and bm.num_free_blocks == 1
    with pytest.raises(ValueError, match="already holds blocks"):
        bm.allocate(s)


def test_append_slots_grows_at_block_boundaries():
    bs = random.choice([2, 4, 16])
    nblocks = 5
    bm = BlockManager(nblocks, bs)
    s = _seq(_rand_tokens(1))
    assert bm.allocate(s) and len(s.block_table) == 1
    for pos in range(1, nblocks * bs):  # decode one token at a time up to the cache's capacity
        s.num_computed_tokens = pos
        assert bm.can_append(s, 1)
        assert bm.append_slots(s, 1)
        assert len(s.block_table) == pos // bs + 1
    s.num_computed_tokens = nblocks * bs
    assert not bm.can_append(s, 1) and not bm.append_slots(s, 1)
    assert len(s.block_table) == nblocks and bm.num_free_blocks == 0 and bm.usage == 1.0


def test_slots_are_distinct_across_sequences():
    bs = 4
    bm = BlockManager(32, bs)
    seqs = [_seq(_rand_tokens(random.randint(1, 30))) for _ in range(4)]
    all_slots = []
    for s in seqs:
        assert bm.allocate(s)
        slots = bm.slots(s, 0, len(s))
        assert slots == [s.block_table[p // bs] * bs + p % bs for p in range(len(s))]
        assert slots == [bm.slot(s, p) for p in range(len(s))]
        all_slots += slots
    assert len(set(all_slots)) == len(all_slots)


def test_lru_eviction_evicts_tail_and_oldest_first():
    bs = 2
    bm = BlockManager(6, bs)
    x = _seq(_rand_tokens(2 * bs))
    bm.allocate(x)
    _compute(bm, x)
    bm.free(x)
    assert bm.num_cached_blocks == 2 and bm.num_free_blocks == 6 and bm.usage == 0.0

    # 5 blocks for z: the 4 never-used blocks, then one eviction; x's tail block goes, its first block stays.
    z = _seq([t + 1000 for t in _rand_tokens(5 * bs)])  # no overlap with x
    assert bm.allocate(z)
    assert bm.num_cached_blocks == 1 and bm.num_free_blocks == 1
    bm.free(z)  # never computed, so its blocks return as plain free blocks
    probe = _seq(x.token_ids + [0])
    assert bm.allocate(probe) and probe.num_cached_tokens == bs
    bm.free(probe)
    assert bm.num_free_blocks == 6


def test_recently_used_cache_outlives_older():
    bs = 2
    bm = BlockManager(4, bs)
    old, new = _seq(_rand_tokens(bs + 1)), _seq(_rand_tokens(bs + 1))
    for s in (old, new):  # each: 1 full block registered + 1 partial block
        bm.allocate(s)
        _compute(bm, s)
        bm.free(s)
    # Touch `old` again: a hit moves its block out of, and on free back to the end of, the LRU order.
    again = _seq(old.token_ids)
    assert bm.allocate(again) and again.num_cached_tokens == bs
    bm.free(again)
    filler = _seq([t + 1000 for t in _rand_tokens(3 * bs)])  # needs 3 of the 4 blocks: 2 free + 1 eviction
    assert bm.allocate(filler)
    bm.free(filler)  # never computed, so its blocks return as plain free blocks
    hit_old, hit_new = _seq(old.token_ids), _seq(new.token_ids)
    assert bm.allocate(hit_old) and hit_old.num_cached_tokens == bs
    bm.free(hit_old)
    assert bm.allocate(hit_new) and hit_new.num_cached_tokens == 0


def test_evictable_hits_count_against_free_blocks():
    bs = 2
    bm = BlockManager(3, bs)
    a = _seq(_rand_tokens(2 * bs))
    bm.allocate(a)
    _compute(bm, a)
    bm.free(a)
    b = _seq(a.token_ids + _rand_tokens(bs))  # 2 hits (revived from the evictable pool) + 1 new block
    assert bm.allocate(b) and b.num_cached_tokens == 2 * bs
    assert bm.num_free_blocks == 0 and bm.usage == 1.0
    c = _seq(a.token_ids + [1])
    assert not bm.allocate(c)  # hits are shared, but its private last block has no room


def test_prefix_caching_disabled():
    bm = BlockManager(16, 4, enable_prefix_caching=False)
    a = _seq(_rand_tokens(12))
    bm.allocate(a)
    _compute(bm, a)
    b = _seq(a.token_ids + [5])
    assert bm.allocate(b) and b.num_cached_tokens == 0 and bm.num_cached_blocks == 0


def test_concurrent_identical_prompts_register_once_and_do_not_leak():
    bs = 4
    bm = BlockManager(16, bs)
    tokens = _rand_tokens(3 * bs)
    a, b = _seq(tokens), _seq(tokens)
    assert bm.allocate(a) and bm.allocate(b)  # neither computed yet: no hits
    assert b.num_cached_tokens == 0 and not set(a.block_table) & set(b.block_table)
    _compute(bm, a)
    _compute(bm, b)
    assert bm.num_cached_blocks == 3
    a_blocks = a.block_table
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 16
    c = _seq(tokens + [1])
    assert bm.allocate(c) and c.block_table[:3] == a_blocks


def test_random_workload_serves_only_correct_kv():
    """Simulate a KV cache holding token ids: every cache hit (whole-block or partial) must hold exactly the
    sequence's own tokens, under sharing, chunked computation, frees and evictions; at the end nothing leaks."""
    bs = random.choice([1, 2, 4])
    nblocks = random.randint(8, 24)
    bm = BlockManager(nblocks, bs)
    kv = [None] * (nblocks * bs)
    stems = [_rand_tokens(random.randint(1, 3 * bs), vocab=4) for _ in range(3)]
    live: list[Sequence] = []
    hits = partial_hits = 0
    for _ in range(400):
        if live and random.random() < 0.4:
            s = live.pop(random.randrange(len(live)))
            bm.free(s)
            continue
        s = _seq(random.choice(stems) + _rand_tokens(random.randint(0, 2 * bs), vocab=4))
        if not bm.allocate(s, max_new_tokens=random.randint(1, 2 * bs)):
            continue
        hits += s.num_cached_tokens > 0
        partial_hits += s.num_cached_tokens % bs != 0
        assert [kv[bm.slot(s, p)] for p in range(s.num_computed_tokens)] == s.token_ids[:s.num_computed_tokens]
        while s.num_computed_tokens < len(s):  # compute in chunks, growing the table as needed
            n = min(random.randint(1, 2 * bs), len(s) - s.num_computed_tokens)
            if not bm.append_slots(s, n):
                break
            for p in range(s.num_computed_tokens, s.num_computed_tokens + n):
                assert bm.ref_count(s.block_table[p // bs]) == 1, "writing into a shared block"
                kv[bm.slot(s, p)] = s.token_ids[p]
            _compute(bm, s, s.num_computed_tokens + n)
        live.append(s)
        refs = [x for t in live for x in t.block_table]
        assert all(bm.ref_count(b) == refs.count(b) for b in range(nblocks))
        assert bm.num_free_blocks == nblocks - len(set(refs))
    assert hits > 0 and (partial_hits > 0 or bs == 1)
    for s in live:
        bm.free(s)
    assert bm.num_free_blocks == nblocks and bm.usage == 0.0


@pytest.mark.usefixtures("default_model")
def test_partial_hits_through_the_engine_keep_greedy_output():
    """A prompt shorter than a block, asked again: the real model reuses all but its last token's K/V (taken over
    from the finished request's block) and generates the same tokens as without any cache; so does a prompt
    sharing only some leading tokens with it."""
    from engine.core.engine.llm import LLM

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)  # fills (and registers) the block
    prompts = ["The quick brown fox jumps over", "The quick brown fox sat under"]
    fresh = LLM(kv_cache_bytes=16 << 20, enable_prefix_caching=False).generate(prompts, params)
    llm = LLM(kv_cache_bytes=16 << 20)
    n = len(fresh[0].prompt_token_ids)
    assert 2 <= n < llm.block_manager.block_size
    first = llm.generate(prompts[0], params)[0]
    again = llm.generate(prompts[0], params)[0]
    other = llm.generate(prompts[1], params)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == n - 1
    assert 1 <= other.num_cached_tokens < len(other.prompt_token_ids) - 1
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == fresh[0].outputs[0].token_ids
    assert other.outputs[0].token_ids == fresh[1].outputs[0].token_ids
