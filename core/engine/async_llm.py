"""AsyncLLM: one background thread steps the engine; any number of coroutines add requests and stream them.

Every change to the engine (adding, aborting, stepping) happens on the engine thread, so the engine core stays
single-threaded; coroutines talk to it through a command queue, and it hands each step's updates back to the
event loop that asked, in one ``call_soon_threadsafe`` per loop per step. A stream that is closed before its
request finished (the consumer broke out, was cancelled, or its client disconnected) aborts the request, which
frees its KV blocks before the next step.

While an AsyncLLM runs, do not call the wrapped LLM's ``generate``/``stream`` from other threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator

from .llm import LLM
from .outputs import StepUpdate
from .sampling_params import SamplingParams

log = logging.getLogger(__name__)

# After a step that produced some request's first token, with few requests running, the engine thread pauses this
# long before the next step: on a host whose cores the step's threads fill (2 cores, 2 threads), the event loop and
# the client would otherwise wait for a core to carry that token out, adding ~2-4 ms to time-to-first-token. It
# happens only on steps that start a request's output (with 1 ms against steps of 10+ ms); with many running (steps
# long, TTFT dominated by queueing) it is skipped.
_FIRST_TOKEN_YIELD_S = 0.001
_YIELD_MAX_RUNNING = 8


class QueueFullError(RuntimeError):
    """The engine already holds ``max_queue`` requests waiting for a slot; retry later."""


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (shut down, or a device fault); no request can run."""


class RequestFailedError(RuntimeError):
    """The engine step computing this request raised; the request ended, the engine serves the others."""


class AsyncLLM:
    """Serve an LLM to coroutines.

    ``stream = await engine.add_request(prompt, params)`` validates and queues the request (raising ValueError or
    TypeError for a bad one, QueueFullError when ``max_queue`` requests already wait) and returns an async
    iterator of StepUpdates, one per completion per step, ending after the request's last completion finished.
    ``generate(...)`` does both in one async iterator; ``abort(request_id)`` stops a request from anywhere.
    """

    def __init__(self, llm: LLM, max_queue: int = 1024):
        if not isinstance(max_queue, int) or max_queue < 1:
            raise ValueError(f"AsyncLLM: max_queue must be an int >= 1, got {max_queue!r}")
        self.llm, self.engine, self.max_queue = llm, llm.engine, max_queue
        self._commands: deque = deque()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._num_pending_adds = 0
        self.num_failed_requests = 0  # ended by a failed step (_fail_step)
        self._stopped = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    # ---- the coroutine side ----------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        """Requests' sequences waiting for a slot, plus requests not yet handed to the engine."""
        return len(self.engine.scheduler.waiting) + self._num_pending_adds

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of the KV-cache blocks in use (0..1)."""
        return self.engine.scheduler.block_manager.usage

    @property
    def error(self) -> BaseException | None:
        """What stopped the engine loop (None while it runs, or after a plain shutdown)."""
        return self._error

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    async def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                          request_id: str | None = None) -> AsyncIterator[StepUpdate]:
        if not self.is_running:
            raise EngineDeadError(f"the engine loop is not running{': ' + repr(self._error) if self._error else ''}")
        if self.num_waiting >= self.max_queue:
            raise QueueFullError(f"{self.num_waiting} requests are already waiting (max_queue {self.max_queue})")
        params = params or self.llm.get_default_sampling_params()
        if isinstance(prompt, str):
            text, ids = prompt, self.llm.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            text, ids = None, list(prompt)
        else:
            raise TypeError(f"a prompt is a string or a list of token ids, not {type(prompt).__name__}")
        request_id = request_id or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        admitted = loop.create_future()
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (loop, queue)
        self._num_pending_adds += 1
        self._submit(("add", request_id, ids, params, text, loop, admitted))
        try:
            await admitted
        except BaseException:
            self._streams.pop(request_id, None)
            if not admitted.done() or admitted.cancelled():
                self._submit(("abort", request_id))  # cancelled while being admitted
            raise
        return self._iterate(request_id, queue)

    async def generate(self, prompt: str | list[int], params: SamplingParams | None = None,
                       request_id: str | None = None) -> AsyncIterator[StepUpdate]:
        """add_request and iterate its updates in one go."""
        stream = await self.add_request(prompt, params, request_id)
        async for update in stream:
            yield update

    def abort(self, request_id: str) -> None:
        """Stop the request before the next step (its KV blocks are freed then); its stream ends."""
        self._submit(("abort", request_id))

    def abort_all(self) -> None:
        """Abort every request in flight (callable from any thread, a signal handler's included): each stream ends
        with its output so far, finish_reason "abort"."""
        for request_id in list(self._streams):
            self._submit(("abort", request_id))

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop after the step in progress; unfinished requests are aborted."""
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout)

    def _iterate(self, request_id: str, queue: asyncio.Queue) -> AsyncIterator[StepUpdate]:
        def end(finished: bool) -> None:
            self._streams.pop(request_id, None)
            if not finished:
                self._submit(("abort", request_id))

        return stream_updates(queue, end)

    def _submit(self, command: tuple) -> None:
        self._commands.append(command)
        self._wake.set()

    # ---- the engine thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopped:
                self._wake.clear()
                self._drain()
                if self.engine.has_unfinished():
                    try:
                        updates = self.engine.step()
                    except Exception as exc:
                        if is_device_fault(exc):
                            raise
                        self._fail_step(exc)
                        continue
                    self._deliver(updates)
                    if len(self.engine.scheduler.running) <= _YIELD_MAX_RUNNING and _has_first_token(updates):
                        time.sleep(_FIRST_TOKEN_YIELD_S)
                else:
                    self._wake.wait(timeout=1.0)
        except BaseException as exc:  # a bug in a step: every request learns of it, none hangs
            log.exception("engine loop failed; failing all requests")
            self._error = exc
            self._stopped = True
            self._fail_all(EngineDeadError(f"the engine loop failed: {exc!r}"))
            raise
        self._drain()
        self._fail_all(EngineDeadError("the engine was shut down"))

    def _drain(self) -> None:
        while self._commands:
            cmd = self._commands.popleft()
            if cmd[0] == "abort":
                out = self.engine.abort(cmd[1])
                if out is not None:  # a stream still listening ends with the aborted output
                    self._deliver([StepUpdate(cmd[1], "", [], True, out, 0, None, True)])
                continue
            _, request_id, ids, params, text, loop, admitted = cmd
            self._num_pending_adds -= 1
            try:
                if self._stopped:
                    raise EngineDeadError("the engine was shut down")
                self.engine.add_request(ids, params, prompt=text, request_id=request_id)
            except Exception as exc:  # bad input: the caller gets the exception, the engine goes on
                loop.call_soon_threadsafe(_settle, admitted, exc)
                continue
            loop.call_soon_threadsafe(_settle, admitted, None)

    def _deliver(self, updates: list[StepUpdate]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for u in updates:
            target = self._streams.get(u.request_id)
            if target is not None:
                by_loop.setdefault(target[0], []).append((target[1], u))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that event loop was closed; its requests are dropped with it
                for _, u in items:
                    self.engine.abort(u.request_id)

    def _fail_step(self, exc: Exception) -> None:
        """A step raised something other than a device fault (a request's logits processor, a bug one batch
        reaches): the requests it held end with an error, their blocks are freed, and the engine serves the rest."""
        ids = self.engine.abort_failed_step()
        log.error("an engine step failed; ending the %d request(s) it held (%s), serving the rest: %r", len(ids),
                  ", ".join(ids[:8]), exc, exc_info=exc)
        self.num_failed_requests += len(ids)
        err = RequestFailedError(f"the engine step computing this request failed: {type(exc).__name__}: {exc}")
        for request_id in ids:
            self._tell(request_id, err)

    def _fail_all(self, exc: BaseException) -> None:
        for request_id in list(self._streams):
            self.engine.abort(request_id)
            self._tell(request_id, exc)

    def _tell(self, request_id: str, exc: BaseException) -> None:
        """Hand ``exc`` to the request's stream, which raises it to its consumer."""
        target = self._streams.get(request_id)
        if target is None:
            return
        try:
            target[0].call_soon_threadsafe(target[1].put_nowait, exc)
        except RuntimeError:
            pass  # the loop is closed: nobody is left to tell


async def stream_updates(queue: asyncio.Queue, end) -> AsyncIterator[StepUpdate]:
    """A request's updates from ``queue`` until its last one (an exception put there is raised to the consumer);
    ``end(finished)`` runs however the iteration stops (finished False: the consumer left early).

    Updates of one completion that are already waiting when the consumer comes for the next are merged into one
    (``StepUpdate.then``): a consumer slower than the engine (a server writing thousands of chunks a second) then
    writes fewer, larger chunks instead of falling further behind."""
    finished = False
    held = None
    try:
        while True:
            if held is None:
                item = await queue.get()
            else:
                item, held = held, None
            if isinstance(item, BaseException):
                finished = True
                raise item
            while not item.request_finished and not queue.empty():
                nxt = queue.get_nowait()
                if isinstance(nxt, BaseException) or nxt.index != item.index:
                    held = nxt
                    break
                item = item.then(nxt)
            yield item
            if item.request_finished:
                finished = True
                return
    finally:
        end(finished)


def is_device_fault(exc: BaseException) -> bool:
    """Does ``exc`` say the device (and so the engine) is broken, not one batch's input? CUDA/HIP errors and
    device-side asserts leave the context unusable, and so does a lost tensor-parallel rank or a collective that
    broke off (the ranks are out of step); everything else ends only the failed step's requests."""
    text = f"{type(exc).__name__}: {exc}"
    return type(exc).__name__ in ("AcceleratorError", "TensorParallelError") or any(
        mark in text for mark in ("CUDA error", "HIP error", "device-side assert", "illegal memory access",
                                  "NCCL error", "Connection closed by peer", "gloo/transport",
                                  "shared-memory collective"))


def _settle(fut: asyncio.Future, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


def _has_first_token(updates: list[StepUpdate]) -> bool:
    return any(u.new_token_ids and len(u.output.outputs[u.index].token_ids) == len(u.new_token_ids) for u in updates)


def _put_all(items: list) -> None:
    for queue, update in items:
        queue.put_nowait(update)
