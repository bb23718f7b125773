"""Data parallelism: N engine processes behind one server, each on its own slice of the machine.

``DataParallelLLM`` has AsyncLLM's coroutine side (add_request / generate / abort / abort_all / shutdown,
is_running, num_running, num_waiting, kv_cache_usage, and ``llm`` with the tokenizer, config and sampling defaults)
so the OpenAI server runs on either. Each engine process (``multiprocessing`` spawn) loads the model itself with
the environment and cores its platform gives it (``Platform.data_parallel_slice``: a share of the cores, and one
device where the platform has devices), steps its own engine, and streams its requests' updates back through a
pipe. A request goes to the process with the fewest requests in flight. A process that dies is reported (is_running
turns False, ``error`` says which and why) and its requests end with EngineDeadError, none hangs.

Between a request's first and final update, a StepUpdate's ``output`` is the request's first snapshot (the prompt);
the deltas carry the progress and the final update carries the whole output (sending the whole output each step
would cost O(length) per token).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from .async_llm import (
    EngineDeadError,
    QueueFullError,
    RequestFailedError,
    _put_all,
    _settle,
    is_device_fault,
    stream_updates,
)
from .outputs import StepUpdate

log = logging.getLogger("engine")
READY_TIMEOUT_S = 900.0  # loading a large model in every process at once


@dataclass
class FrontLLM:
    """What the server reads of the model in the process that holds no weights."""

    tokenizer: object
    config: object
    max_model_len: int
    generation_defaults: dict
    checkpoint_source: str

    def get_default_sampling_params(self):
        from .sampling_params import SamplingParams

        return SamplingParams(**self.generation_defaults)


# ---- the engine process ------------------------------------------------------------------------------------------
def engine_process(conn, rank: int, env: dict, cores: list[int], llm_kwargs: dict) -> None:
    """Load the model on this process's slice and serve the parent's commands until told to stop."""
    os.environ.update(env)
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    try:
        import torch

        torch.set_num_threads(max(1, len(cores)))
        from .llm import LLM

        llm = LLM(**llm_kwargs)
        _serve_grammars(llm)
    except Exception as exc:  # the parent reports it: which process, and why
        conn.send(("error", f"engine process {rank} failed to load the model: {type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", FrontLLM(llm.tokenizer, llm.config, llm.max_model_len, dict(llm.generation_defaults),
                                 str(llm.checkpoint_source))))
    _EngineLoop(conn, llm.engine).run()


def _serve_grammars(llm) -> None:
    try:
        from engine.core.serving.grammar import GrammarCompiler
    except ImportError:  # no serving extra: requests carry no grammar
        return
    try:
        GrammarCompiler(llm.tokenizer, llm.config.vocab_size).serve_unpickled()
    except ImportError:
        return


class _EngineLoop:
    def __init__(self, conn, engine):
        self.conn, self.engine = conn, engine
        self.snapshot_sent: set[str] = set()

    def run(self) -> None:
        while True:
            busy = self.engine.has_unfinished()
            while self.conn.poll(0 if busy else 0.5):
                if not self._command(self.conn.recv()):
                    return
                busy = self.engine.has_unfinished()
            if not busy:
                continue
            try:
                updates = self.engine.step()
            except Exception as exc:
                if is_device_fault(exc):
                    self.conn.send(("dead", f"{type(exc).__name__}: {exc}"))
                    raise
                ids = self.engine.abort_failed_step()
                log.error("an engine step failed; ending its %d request(s): %r", len(ids), exc, exc_info=exc)
                self.conn.send(("failed", ids, f"the engine step computing this request failed: "
                                               f"{type(exc).__name__}: {exc}"))
                continue
            self.conn.send(("updates", [self._light(u) for u in updates], self._stats()))

    def _command(self, msg) -> bool:
        kind = msg[0]
        if kind == "stop":
            return False
        if kind == "abort":
            out = self.engine.abort(msg[1])
            if out is not None:
                self.conn.send(("updates", [self._light(StepUpdate(msg[1], "", [], True, out, 0, None, True))],
                                self._stats()))
            return True
        _, request_id, ids, params = msg
        try:
            self.engine.add_request(ids, params, request_id=request_id)
        except Exception as exc:
            self.conn.send(("added", request_id, exc))
            return True
        self.conn.send(("added", request_id, None))
        return True

    def _light(self, u: StepUpdate) -> tuple:
        first = u.request_id not in self.snapshot_sent
        if u.request_finished:
            self.snapshot_sent.discard(u.request_id)
        elif first:
            self.snapshot_sent.add(u.request_id)
        return (u.request_id, u.delta_text, u.new_token_ids, u.finished, u.index, u.new_logprobs,
                u.request_finished, u.output if (first or u.finished) else None)

    def _stats(self) -> tuple[int, int, float]:
        s = self.engine.scheduler
        return len(s.running), len(s.waiting), s.block_manager.usage


# ---- the server process ------------------------------------------------------------------------------------------
@dataclass
class _Worker:
    rank: int
    process: object
    conn: object
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: set = field(default_factory=set)
    requests: int = 0  # requests sent to it so far
    stats: tuple = (0, 0, 0.0)
    dead: str | None = None

    def send(self, msg) -> None:
        with self.send_lock:
            self.conn.send(msg)


class DataParallelLLM:
    def __init__(self, llm_kwargs: dict, size: int, platform, max_queue: int = 1024):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"data_parallel_size must be an int >= 1, got {size!r}")
        self.max_queue, self._stopped, self._error = max_queue, False, None
        self._streams: dict[str, tuple] = {}  # request id -> (loop, queue, worker, snapshot holder, admitted)
        self._num_pending_adds = 0
        self.num_failed_requests = 0
        ctx = multiprocessing.get_context("spawn")
        slices = [platform.data_parallel_slice(rank, size) for rank in range(size)]
        self.workers: list[_Worker] = []
        for rank, (env, cores) in enumerate(slices):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=engine_process, args=(child, rank, env, cores, llm_kwargs),
                               name=f"engine-dp{rank}", daemon=True)
            proc.start()
            child.close()
            self.workers.append(_Worker(rank, proc, parent))
        try:
            fronts = [self._wait_ready(w) for w in self.workers]
        except BaseException:
            self.shutdown(timeout=5)
            raise
        self.llm = fronts[0]
        for w in self.workers:
            threading.Thread(target=self._read, args=(w,), name=f"engine-dp{w.rank}-reader", daemon=True).start()

    def _wait_ready(self, w: _Worker) -> FrontLLM:
        if not w.conn.poll(READY_TIMEOUT_S):
            raise RuntimeError(f"engine process {w.rank} did not load the model within {READY_TIMEOUT_S:.0f} s")
        try:
            kind, payload = w.conn.recv()
        except EOFError as exc:
            w.process.join(10)
            raise RuntimeError(f"engine process {w.rank} exited while loading the model (exit code "
                               f"{w.process.exitcode}); run without --data-parallel-size to see why") from exc
        if kind != "ready":
            raise RuntimeError(payload)
        return payload

    # ---- state ---------------------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return sum(w.stats[0] for w in self.workers)

    @property
    def num_waiting(self) -> int:
        return sum(w.stats[1] for w in self.workers) + self._num_pending_adds

    @property
    def kv_cache_usage(self) -> float:
        return sum(w.stats[2] for w in self.workers) / len(self.workers)

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def is_running(self) -> bool:
        return not self._stopped and all(w.dead is None and w.process.is_alive() for w in self.workers)

    # ---- the coroutine side --------------------------------------------------------------------------------
    async def add_request(self, prompt: str | list[int], params=None, request_id: str | None = None):
        if not self.is_running:
            raise EngineDeadError(f"an engine process is not running{': ' + str(self._error) if self._error else ''}")
        if self.num_waiting >= self.max_queue:
            raise QueueFullError(f"{self.num_waiting} requests are already waiting (max_queue {self.max_queue})")
        params = params or self.llm.get_default_sampling_params()
        if isinstance(prompt, str):
            ids = self.llm.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        else:
            raise TypeError(f"a prompt is a string or a list of token ids, not {type(prompt).__name__}")
        request_id = request_id or uuid.uuid4().hex
        worker = min(self.workers, key=lambda w: len(w.in_flight))
        loop = asyncio.get_running_loop()
        admitted, queue = loop.create_future(), asyncio.Queue()
        self._streams[request_id] = (loop, queue, worker, [None], admitted)
        worker.in_flight.add(request_id)
        worker.requests += 1
        self._num_pending_adds += 1
        try:
            worker.send(("add", request_id, ids, params))  # pickles params: a TypeError if something cannot travel
        except BaseException:
            self._forget(request_id)
            self._num_pending_adds -= 1
            raise
        try:
            await admitted
        except BaseException:
            if not admitted.done() or admitted.cancelled():
                self.abort(request_id)
            self._forget(request_id)
            raise
        return self._iterate(request_id, queue)

    async def generate(self, prompt, params=None, request_id: str | None = None) -> AsyncIterator[StepUpdate]:
        stream = await self.add_request(prompt, params, request_id)
        async for update in stream:
            yield update

    def abort(self, request_id: str) -> None:
        target = self._streams.get(request_id)
        if target is not None and target[2].dead is None:
            try:
                target[2].send(("abort", request_id))
            except (OSError, ValueError):  # its process is gone: the reader fails the request
                pass

    def abort_all(self) -> None:
        for request_id in list(self._streams):
            self.abort(request_id)

    def shutdown(self, timeout: float = 30.0) -> None:
        self._stopped = True
        for w in self.workers:
            try:
                w.send(("stop",))
            except (OSError, ValueError):
                pass
        for w in self.workers:
            w.process.join(timeout)
            if w.process.is_alive():
                w.process.terminate()
        self._fail(list(self._streams), EngineDeadError("the engine was shut down"))

    def _iterate(self, request_id: str, queue: asyncio.Queue) -> AsyncIterator[StepUpdate]:
        def end(finished: bool) -> None:
            if not finished:
                self.abort(request_id)
            self._forget(request_id)

        return stream_updates(queue, end)

    def _forget(self, request_id: str) -> None:
        target = self._streams.pop(request_id, None)
        if target is not None:
            target[2].in_flight.discard(request_id)

    # ---- the reader threads --------------------------------------------------------------------------------
    def _read(self, w: _Worker) -> None:
        try:
            while True:
                msg = w.conn.recv()
                if msg[0] == "updates":
                    w.stats = msg[2]
                    self._deliver(msg[1])
                elif msg[0] == "added":
                    self._admitted(msg[1], msg[2])
                elif msg[0] == "failed":
                    self.num_failed_requests += len(msg[1])
                    self._fail(msg[1], RequestFailedError(msg[2]))
                elif msg[0] == "dead":
                    w.dead = msg[1]
        except (EOFError, OSError):
            pass
        if not self._stopped:  # the process died under the server: say so, end its requests
            w.dead = w.dead or f"exit code {w.process.exitcode}"
            self._error = EngineDeadError(f"engine process {w.rank} died ({w.dead})")
            log.error("%s; failing its %d request(s)", self._error, len(w.in_flight))
            self._fail([r for r, t in list(self._streams.items()) if t[2] is w], self._error)

    def _admitted(self, request_id: str, exc) -> None:
        target = self._streams.get(request_id)
        self._num_pending_adds -= 1
        if target is None:
            return
        target[0].call_soon_threadsafe(_settle, target[4], exc)

    def _deliver(self, items: list[tuple]) -> None:
        by_loop: dict = {}
        for rid, delta, new_ids, finished, index, logprobs, request_finished, output in items:
            target = self._streams.get(rid)
            if target is None:
                continue
            if output is not None:
                target[3][0] = output
            u = StepUpdate(rid, delta, new_ids, finished, target[3][0], index, logprobs, request_finished)
            by_loop.setdefault(target[0], []).append((target[1], u))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # that event loop was closed
                pass

    def _fail(self, request_ids, exc: BaseException) -> None:
        for rid in request_ids:
            target = self._streams.get(rid)
            if target is None:
                continue
            try:
                target[0].call_soon_threadsafe(_settle, target[4], exc)  # (a no-op once admitted)
                target[0].call_soon_threadsafe(target[1].put_nowait, exc)
            except RuntimeError:
                pass
