"""Scheduler: chunked prefill, decode priority, FCFS, preemption by recomputation, finishing, accounting.

The model is simulated by a KV cache of token ids: each step writes the scheduled tokens into their slots,
and a sequence's next token is a hash of what its attention would read back from the cache. So a wrong
slot, a wrongly shared prefix block or a lost token changes the generated tokens, which are compared
against an independent straight-line generation.
"""

from __future__ import annotations

import random

import pytest

from engine.core.engine.block_manager import BlockManager
from engine.core.engine.sampling_params import SamplingParams
from engine.core.engine.scheduler import Scheduler, SchedulerOutput
from engine.core.engine.sequence import Sequence, SequenceStatus

VOCAB = 50
EOS = 0


def next_token(context: list[int]) -> int:
    return hash(tuple(context)) % VOCAB


class FakeRunner:
    """Writes scheduled tokens into a token-id "KV cache" and samples from what the cache holds."""

    def __init__(self, bm: BlockManager):
        self.bm = bm
        self.kv = [None] * (bm.num_blocks * bm.block_size)

    def step(self, out: SchedulerOutput) -> dict[int, int]:
        bm, bs = self.bm, self.bm.block_size
        for seq, n in out.scheduled:
            assert n >= 1 and seq.status is SequenceStatus.RUNNING
            for p in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
                assert bm.ref_count(seq.block_table[p // bs]) == 1, "writing into a shared block"
                self.kv[bm.slot(seq, p)] = seq.token_ids[p]
        sampled = {}
        for seq, n in out.scheduled:
            end = seq.num_computed_tokens + n
            if end == len(seq):
                sampled[seq.seq_id] = next_token([self.kv[bm.slot(seq, p)] for p in range(end)])
        return sampled


def reference(prompt: list[int], params: SamplingParams, max_len: int, eos: set[int]) -> tuple[list[int], str]:
    tokens, out = list(prompt), []
    while True:
        t = next_token(tokens)
        tokens.append(t)
        out.append(t)
        if (t in eos and not params.ignore_eos) or t in params.stop_token_ids:
            return out, "stop"
        if len(out) >= params.max_tokens or len(tokens) >= max_len:
            return out, "length"


def run(sched: Scheduler, seqs: list[Sequence], check=None, runner=None) -> list[SchedulerOutput]:
    runner = runner or FakeRunner(sched.block_manager)
    for s in seqs:
        sched.add(s)
    outs = []
    while sched.has_unfinished():
        before = list(sched.running)
        out = sched.schedule()
        assert out.scheduled, "no progress"
        assert out.num_batched_tokens <= sched.max_num_batched_tokens
        assert len(out.scheduled) <= sched.max_num_seqs
        if check:
            check(out, before)
        sched.update(out, runner.step(out))
        outs.append(out)
        assert len(outs) < 10_000
    return outs


def _prompt(n: int) -> list[int]:
    return [random.randrange(1, VOCAB) for _ in range(n)]


def test_chunked_prefill_splits_a_long_prompt_within_the_budget():
    budget = random.randint(8, 32)
    plen = 3 * budget + random.randint(1, budget - 1)
    sched = Scheduler(BlockManager(64, 4), max_num_batched_tokens=budget, eos_token_ids=set())
    seq = Sequence(_prompt(plen), SamplingParams(max_tokens=3))
    outs = run(sched, [seq])
    grants = [o.scheduled[0][1] for o in outs]
    assert grants == [budget, budget, budget, plen - 3 * budget, 1, 1]
    assert seq.output_token_ids == reference(seq.prompt_token_ids, seq.params, 10**9, set())[0]


def test_decodes_go_first_then_prefill_chunks_then_fcfs():
    budget = 16
    sched = Scheduler(BlockManager(256, 4), max_num_batched_tokens=budget, eos_token_ids=set())
    a = Sequence(_prompt(5), SamplingParams(max_tokens=20, ignore_eos=True))
    sched.add(a)
    sched.update(out := sched.schedule(), FakeRunner(sched.block_manager).step(out))
    assert not a.in_prefill
    long_b = Sequence(_prompt(40), SamplingParams(max_tokens=2))
    c = Sequence(_prompt(3), SamplingParams(max_tokens=2))
    sched.add(long_b)
    sched.add(c)
    out = sched.schedule()
    assert [(s.seq_id, n) for s, n in out.scheduled] == [(a.seq_id, 1), (long_b.seq_id, budget - 1)]
    assert list(sched.waiting) == [c]


def test_max_num_seqs_limits_the_batch():
    sched = Scheduler(BlockManager(256, 4), max_num_seqs=3, eos_token_ids=set())
    seqs = [Sequence(_prompt(4), SamplingParams(max_tokens=4, ignore_eos=True)) for _ in range(7)]
    outs = run(sched, seqs)
    assert max(len(o.scheduled) for o in outs) == 3
    assert all(len(s.output_token_ids) == 4 for s in seqs)


def test_waiting_head_blocked_by_memory_is_not_overtaken():
    bs = 4
    sched = Scheduler(BlockManager(6, bs), eos_token_ids=set())
    big = Sequence(_prompt(4 * bs), SamplingParams(max_tokens=3, ignore_eos=True))
    sched.add(big)
    sched.update(out := sched.schedule(), FakeRunner(sched.block_manager).step(out))
    head = Sequence(_prompt(3 * bs), SamplingParams(max_tokens=1))  # needs 3 blocks, only 1 free
    small = Sequence(_prompt(2), SamplingParams(max_tokens=1))  # would fit
    sched.add(head)
    sched.add(small)
    out = sched.schedule()
    assert [s for s, _ in out.scheduled] == [big] and list(sched.waiting) == [head, small]


def test_preemption_recomputes_and_matches_unpreempted_run():
    bs = 4
    prompts = [_prompt(random.randint(3, 10)) for _ in range(4)]
    params = SamplingParams(max_tokens=random.randint(12, 20), ignore_eos=True)

    def go(num_blocks):
        sched = Scheduler(BlockManager(num_blocks, bs), eos_token_ids={EOS})
        seqs = [Sequence(p, params) for p in prompts]
        preempted_order = []

        def check(out, running_before):
            if out.preempted:  # newest first, and they wait at the front, the oldest first
                where = [running_before.index(s) for s in out.preempted]
                assert where == sorted(where, reverse=True)
                assert list(sched.waiting)[:len(where)] == out.preempted[::-1]
                preempted_order.extend(out.preempted)

        run(sched, seqs, check)
        bm = sched.block_manager
        assert bm.num_free_blocks == num_blocks and bm.usage == 0.0
        return seqs, preempted_order

    roomy, none = go(64)
    tight, preempted = go(9)  # 4 sequences of up to 30 tokens need up to 32 blocks
    assert not none and preempted
    assert any(s.num_preemptions for s in tight)
    for a, b in zip(roomy, tight, strict=True):
        assert a.output_token_ids == b.output_token_ids
        assert len(b.output_token_ids) == params.max_tokens and b.finish_reason == "length"


def test_preempted_sequence_keeps_outputs_and_recomputes_them():
    bs = 2
    sched = Scheduler(BlockManager(4, bs), eos_token_ids=set())
    runner = FakeRunner(sched.block_manager)
    old, new = (Sequence(_prompt(2), SamplingParams(max_tokens=6, ignore_eos=True)) for _ in range(2))
    sched.add(old)
    sched.add(new)
    while True:
        out = sched.schedule()
        if out.preempted:
            break
        sched.update(out, runner.step(out))
    assert out.preempted == [new] and new.status is SequenceStatus.WAITING
    assert new.num_computed_tokens == 0 and new.block_table == [] and new.output_token_ids
    generated = list(new.output_token_ids)
    while new.status is not SequenceStatus.RUNNING:
        sched.update(out, runner.step(out))
        out = sched.schedule()
    granted = dict((s.seq_id, n) for s, n in out.scheduled)[new.seq_id]
    assert new.output_token_ids == generated
    assert new.num_computed_tokens + granted == len(new)  # prompt and outputs so far, recomputed in one chunk


@pytest.mark.parametrize("case", ["eos", "ignore_eos", "stop_id", "max_tokens", "max_model_len"])
def test_finishing(case):
    prompt = _prompt(6)
    toks = reference(prompt, SamplingParams(max_tokens=60, ignore_eos=True), 10**9, set())[0]
    params, max_model_len, eos = SamplingParams(max_tokens=60), None, set()
    if case in ("eos", "ignore_eos"):
        eos = {toks[random.randrange(5, 15)]}
        params = SamplingParams(max_tokens=60, ignore_eos=case == "ignore_eos")
    elif case == "stop_id":
        params = SamplingParams(max_tokens=60, stop_token_ids=[toks[random.randrange(5, 15)]])
    elif case == "max_tokens":
        params = SamplingParams(max_tokens=random.randint(1, 15))
    else:
        max_model_len = len(prompt) + random.randint(1, 15)
    sched = Scheduler(BlockManager(64, 4), max_model_len=max_model_len, eos_token_ids=eos)
    seq = Sequence(prompt, params)
    run(sched, [seq])
    expected = reference(prompt, params, max_model_len or 10**9, eos)
    assert (seq.output_token_ids, seq.finish_reason) == expected and seq.is_finished
    if case == "max_model_len":
        assert len(seq) == max_model_len
    if case == "eos":
        assert seq.finish_reason == "stop" and seq.output_token_ids[-1] in eos
    if case == "ignore_eos":
        assert len(seq.output_token_ids) == 60 and eos & set(seq.output_token_ids)
    assert sched.block_manager.num_free_blocks == 64


def test_add_rejects_prompts_that_cannot_fit():
    sched = Scheduler(BlockManager(4, 4), max_model_len=100)
    with pytest.raises(ValueError, match="exceeds the model's context of 100"):
        sched.add(Sequence(_prompt(101), SamplingParams()))
    with pytest.raises(ValueError, match="KV-cache blocks"):
        sched.add(Sequence(_prompt(17), SamplingParams()))
    with pytest.raises(ValueError, match="empty"):
        sched.add(Sequence([], SamplingParams()))
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Scheduler(BlockManager(4, 4), max_num_batched_tokens=0)
    full = Sequence(_prompt(16), SamplingParams(max_tokens=5))  # exactly the cache: one token, then "length"
    run(sched, [full])
    assert len(full.output_token_ids) == 1 and full.finish_reason == "length"


def test_abort_frees_blocks_even_mid_step():
    sched = Scheduler(BlockManager(32, 4), eos_token_ids=set())
    runner = FakeRunner(sched.block_manager)
    a, b, c = (Sequence(_prompt(9), SamplingParams(max_tokens=50, ignore_eos=True)) for _ in range(3))
    for s in (a, b, c):
        sched.add(s)
    out = sched.schedule()
    sampled = runner.step(out)
    assert sched.abort(b.request_id) is b  # aborted while its step "runs"
    sched.update(out, sampled)
    assert b.finish_reason == "abort" and b.output_token_ids == [] and b.block_table == []
    assert sched.abort("no such request") is None
    sched.abort(a.request_id)
    sched.abort(c.request_id)
    assert not sched.has_unfinished() and sched.block_manager.num_free_blocks == 32


def test_update_rejects_inconsistent_sampling():
    sched = Scheduler(BlockManager(32, 4), max_num_batched_tokens=4, eos_token_ids=set())
    seq = Sequence(_prompt(10), SamplingParams())
    sched.add(seq)
    out = sched.schedule()
    with pytest.raises(RuntimeError, match="must not get a sampled token"):
        sched.update(out, {seq.seq_id: 1})
    seq2 = Sequence(_prompt(3), SamplingParams())
    sched.add(seq2)
    sched.finish(seq, "abort")
    out = sched.schedule()
    with pytest.raises(RuntimeError, match="needs a sampled token"):
        sched.update(out, {})


def test_prefix_cache_hits_through_the_scheduler():
    bs = 4
    sched = Scheduler(BlockManager(64, bs), eos_token_ids=set())
    system = _prompt(5 * bs)
    runner = FakeRunner(sched.block_manager)  # one cache across both runs
    first = Sequence(system + _prompt(3), SamplingParams(max_tokens=2))
    run(sched, [first], runner=runner)
    later = [Sequence(system + _prompt(random.randint(1, 6)), SamplingParams(max_tokens=4)) for _ in range(3)]
    run(sched, later, runner=runner)
    for s in later:
        assert 5 * bs <= s.num_cached_tokens < len(s)  # the system prompt, plus any partial hit past it
        assert (s.output_token_ids, s.finish_reason) == reference(s.prompt_token_ids, s.params, 10**9, set())


def test_random_workloads_match_reference_and_leak_nothing():
    for _ in range(6):
        bs = random.choice([1, 2, 4, 8])
        num_blocks = random.randint(6, 40)
        cap = num_blocks * bs
        max_model_len = random.choice([None, random.randint(8, 64)])
        limit = min(cap, max_model_len or cap)
        sched = Scheduler(BlockManager(num_blocks, bs, enable_prefix_caching=random.random() < 0.8),
                          max_num_seqs=random.randint(1, 8), max_num_batched_tokens=random.randint(1, 40),
                          max_model_len=max_model_len, eos_token_ids={EOS})
        stems = [_prompt(random.randint(1, 12)) for _ in range(3)]
        seqs = []
        for _ in range(random.randint(5, 14)):
            prompt = (random.choice(stems) + _prompt(random.randint(0, 10)))[:limit]
            params = SamplingParams(max_tokens=random.randint(1, 30), ignore_eos=random.random() < 0.5,
                                    stop_token_ids=random.sample(range(VOCAB), random.randint(0, 2)))
            seqs.append(Sequence(prompt, params))
        run(sched, seqs)
        for s in seqs:
            assert (s.output_token_ids, s.finish_reason) == reference(s.prompt_token_ids, s.params, limit, {EOS})
        assert sched.block_manager.num_free_blocks == num_blocks and not sched.running and not sched.waiting
