"""Turning a validated OpenAI request into engine requests, and their updates into responses or stream chunks."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid

from fastapi.responses import JSONResponse

from engine.core.engine.async_llm import AsyncLLM, EngineDeadError
from engine.core.engine.outputs import RequestOutput, StepUpdate

from . import tool_choice
from .chat_output import ChoiceOutput, OutputParsing
from .formatting import FINISH_REASONS, chat_logprobs, completion_logprobs, sse, to_json, usage
from .grammar import GrammarCompiler, GrammarError
from .logit_bias import LogitBias
from .metrics import ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest


class OpenAIError(Exception):
    """An error answered as ``{"error": {...}}`` with ``status``."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class Handler:
    def __init__(self, async_llm: AsyncLLM, model_name: str, metrics: ServerMetrics, reasoning_parser=None,
                 tool_parser=None):
        self.async_llm, self.model_name, self.metrics = async_llm, model_name, metrics
        self.reasoning_parser, self.tool_parser = reasoning_parser, tool_parser  # factories (parsers/), or None
        self.llm = async_llm.llm
        self._grammar: GrammarCompiler | None = None
        self._grammar_lock = threading.Lock()

    async def completion(self, req: CompletionRequest) -> Job:
        # Tokenizing is the caller's CPU work: off the event loop, so /health and the streams stay responsive.
        prompts = await asyncio.to_thread(
            lambda: [self.llm.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in req.prompts()])
        return await self._start("text_completion", "cmpl", req, prompts, req.max_tokens, req.logprobs, "prompt")

    async def chat(self, req: ChatCompletionRequest) -> Job:
        if req.top_logprobs is not None and not req.logprobs:
            raise OpenAIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        k = (req.top_logprobs or 0) if req.logprobs else None
        try:
            parsing = tool_choice.output_parsing(req, self.reasoning_parser, self.tool_parser)
        except tool_choice.ToolChoiceError as exc:
            raise OpenAIError(400, str(exc), param="tool_choice") from exc
        try:
            text, ids = await asyncio.to_thread(self._chat_ids, req)
        except ValueError as exc:
            raise OpenAIError(400, str(exc), param="messages") from exc
        parsing.prompt = text[-PROMPT_TAIL:]
        max_tokens = req.max_completion_tokens or req.max_tokens
        return await self._start("chat.completion", "chatcmpl", req, [ids], max_tokens, k, "messages", parsing)

    def _chat_ids(self, req: ChatCompletionRequest) -> tuple[str, list[int]]:
        """The rendered prompt and its tokens."""
        messages = [m.template_message() for m in req.messages]
        normalize_id = getattr(self.tool_parser, "template_call_id", None)
        if normalize_id is not None:  # e.g. Mistral's templates refuse ids that are not 9 letters and digits
            messages = [with_call_ids(m, normalize_id) for m in messages]
        tools = tool_choice.template_tools(req)
        text = self.llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                      **(req.chat_template_kwargs or {}),
                                                      **({"tools": tools} if tools else {}))
        return text, self.llm.tokenizer.encode(text, add_special_tokens=False)

    async def _start(self, kind, prefix, req, prompts: list[list[int]], max_tokens, k, prompt_param,
                     parsing: OutputParsing | None = None) -> Job:
        ctx = self.llm.max_model_len
        for ids in prompts:
            if len(ids) >= ctx:
                raise OpenAIError(400, f"the prompt has {len(ids)} tokens but the model's context is {ctx} "
                                       "(prompt plus at least one generated token)", param=prompt_param,
                                  code="context_length_exceeded")
            if max_tokens is not None and len(ids) + max_tokens > ctx:
                raise OpenAIError(400, f"max_tokens {max_tokens} plus the prompt's {len(ids)} tokens exceed the "
                                       f"model's context of {ctx}; ask for at most {ctx - len(ids)}",
                                  param="max_tokens", code="context_length_exceeded")
        forced = tool_choice.forced_schema(req) if parsing is not None and parsing.forced else None
        grammar = await asyncio.to_thread(self._grammar_processor, req.response_format, forced)  # compiling: CPU
        if grammar is not None and req.ignore_eos:
            raise OpenAIError(400, "ignore_eos cannot be combined with response_format or a required/named "
                                   "tool_choice: the grammar ends the output with the end-of-sequence token",
                              param="ignore_eos")
        bias = None
        if req.logit_bias:
            try:
                bias = LogitBias(req.logit_bias, self.llm.config.vocab_size)
            except ValueError as exc:
                raise OpenAIError(400, str(exc), param="logit_bias") from exc
        params = []
        for ids in prompts:
            try:
                procs = ([bias] if bias is not None else []) + ([grammar.clone()] if grammar is not None else [])
                sp = req.sampling_params(max_tokens or ctx - len(ids), k, procs, self.llm.generation_defaults)
                if parsing is not None and parsing.tools is not None and parsing.tools.needs_special_tokens:
                    sp = dataclasses.replace(sp, skip_special_tokens=False)  # the calls' markers are special tokens
                params.append(sp)
            except ValueError as exc:
                raise OpenAIError(400, str(exc).removeprefix("invalid SamplingParams: ")) from exc
        job = Job(self, kind, f"{prefix}-{uuid.uuid4().hex}", req.n, k,
                  bool(req.stream_options and req.stream_options.include_usage), [len(p) for p in prompts],
                  parsing if parsing is not None and parsing.active else None)
        for i, (ids, sp) in enumerate(zip(prompts, params, strict=True)):
            try:
                job.streams.append(await self.async_llm.add_request(ids, sp, f"{job.id}-{i}"))
            except (ValueError, TypeError) as exc:
                job.abort()
                raise OpenAIError(400, str(exc), param=prompt_param) from exc
            except BaseException:
                job.abort()
                raise
        return job

    def _grammar_processor(self, fmt, forced_schema: dict | None = None):
        if forced_schema is not None:
            return self._compile(forced_schema, "tools")
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_schema" and (fmt.json_schema is None or fmt.json_schema.schema_ is None):
            raise OpenAIError(400, "response_format json_schema needs json_schema.schema", param="response_format")
        return self._compile(fmt.json_schema.schema_ if fmt.type == "json_schema" else None,
                             "response_format.json_schema.schema")

    def _compile(self, schema, param: str):
        with self._grammar_lock:
            if self._grammar is None:
                self._grammar = GrammarCompiler(self.llm.tokenizer, self.llm.config.vocab_size)
        try:
            return self._grammar.processor(schema)
        except GrammarError as exc:
            raise OpenAIError(400, str(exc), param=param) from exc


class Job:
    """One HTTP request's engine requests (one per prompt, each with n completions)."""

    def __init__(self, handler: Handler, kind: str, id: str, n: int, k: int | None, include_usage: bool,
                 prompt_lens: list[int], parsing: OutputParsing | None = None):
        self.h, self.kind, self.id, self.n, self.k = handler, kind, id, n, k
        self.parsing = parsing  # reasoning / tool calls read out of a chat choice's text (chat_output.py)
        self._outputs: dict[int, ChoiceOutput] = {}  # per streamed choice
        self.include_usage, self.prompt_lens = include_usage, prompt_lens
        self.created = int(time.time())
        self.streams: list = []
        self.arrival = time.perf_counter()
        self._first = False
        self._last: dict[int, float] = {}
        self._tokens = 0
        self._offsets: dict[int, int] = {}
        self._finished = 0
        self._counted: set[int] = set()
        self.end_reason = "abort"  # what abort() counts unfinished requests as ("error" once a step failed)

    def abort(self) -> None:
        """End the job's unfinished engine requests, counting each in the metrics as ``self.end_reason`` ("abort":
        the client left or the server stops; "error": its step failed)."""
        for i in range(len(self.streams) + 1):
            self.h.async_llm.abort(f"{self.id}-{i}")  # a no-op for finished (or never started) requests
        for i in range(len(self.streams)):
            if i not in self._counted:
                self._counted.add(i)
                self.h.metrics.on_finished(self.end_reason, self.prompt_lens[i], 0)

    # ---- bookkeeping -------------------------------------------------------------------------------------
    def _track(self, i: int, u: StepUpdate) -> None:
        now, m, idx = time.perf_counter(), self.h.metrics, i * self.n + u.index
        if u.new_token_ids:
            if not self._first:
                self._first = True
                m.ttft.observe(now - self.arrival)
            elif idx in self._last:
                m.itl.observe(now - self._last[idx])
            self._last[idx] = now
            self._tokens += len(u.new_token_ids)
            m.on_tokens(len(u.new_token_ids))
        if u.request_finished:
            self._finished += 1
            if self._finished == len(self.streams):
                m.e2e.observe(now - self.arrival)
            if i not in self._counted:
                self._counted.add(i)
                m.on_finished(u.output.outputs[0].finish_reason, len(u.output.prompt_token_ids),
                              u.output.num_cached_tokens)

    def _usage(self, outputs: list[RequestOutput] | None = None) -> dict:
        cached = sum(o.num_cached_tokens for o in outputs) if outputs else 0
        return usage(sum(self.prompt_lens), self._tokens, cached)

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.h.model_name}

    # ---- whole responses ---------------------------------------------------------------------------------
    async def collect(self) -> dict:
        try:
            finals = []
            for i, stream in enumerate(self.streams):
                final = None
                async for u in stream:
                    self._track(i, u)
                    final = u.output
                finals.append(final)
        except Exception:
            self.end_reason = "error"
            raise
        finally:
            self.abort()
        choices = []
        for i, out in enumerate(finals):
            for c in out.outputs:
                choice = {"index": i * self.n + c.index, "finish_reason": FINISH_REASONS[c.finish_reason]}
                lp = None
                if self.k is not None:
                    lp = (chat_logprobs(c.token_ids, c.logprobs, self.k) if self.kind == "chat.completion"
                          else completion_logprobs(c.token_ids, c.logprobs, self.k))
                if self.kind == "chat.completion" and self.parsing is not None:
                    choice["message"] = self.parsing.choice().message(c.text)
                    if choice["message"].get("tool_calls") and choice["finish_reason"] == "stop":
                        choice["finish_reason"] = "tool_calls"
                elif self.kind == "chat.completion":
                    choice["message"] = {"role": "assistant", "content": c.text}
                else:
                    choice["text"] = c.text
                choice["logprobs"] = lp
                choices.append(choice)
        return {**self._head(self.kind), "choices": choices, "usage": self._usage(finals)}

    # ---- streams -----------------------------------------------------------------------------------------
    async def _updates(self):
        """``(i, update)`` from every engine stream in arrival order; ``(i, exc)`` if the engine failed.

        One stream (the usual case) is iterated in place: each update reaches the response in the same task that
        the engine thread's hand-off wakes, with no task or queue in between."""
        if len(self.streams) == 1:
            stream = self.streams[0]
            try:
                async for u in stream:
                    yield 0, u
            except Exception as exc:  # the engine failed: the client gets an error event
                yield 0, exc
            finally:
                await stream.aclose()  # now, not when collected: a stream left early aborts its request
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i, stream):
            try:
                async for u in stream:
                    queue.put_nowait((i, u))
            except Exception as exc:
                queue.put_nowait((i, exc))
            finally:
                queue.put_nowait((i, None))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(self.streams)]
        try:
            remaining = len(tasks)
            while remaining:
                i, u = await queue.get()
                if u is None:
                    remaining -= 1
                else:
                    yield i, u
        finally:
            for t in tasks:
                t.cancel()

    async def events(self):
        """Server-sent events: chunks as tokens arrive, then a usage chunk if asked, then [DONE]."""
        chat = self.kind == "chat.completion"
        obj = "chat.completion.chunk" if chat else "text_completion"
        # Every chunk starts with the same fields: encode them once (the key order of the dict form is kept).
        head = sse(self._head(obj))[:-3] + ',"choices":['
        updates = self._updates()
        try:
            if chat:
                for idx in range(len(self.streams) * self.n):
                    yield sse({**self._head(obj), "choices": [
                        {"index": idx, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}]})
            async for i, u in updates:
                if isinstance(u, Exception):  # 500: this request's step failed; 503: the engine is gone
                    code = 503 if isinstance(u, EngineDeadError) else 500
                    self.end_reason = "error"
                    yield sse(OpenAIError(code, str(u), "server_error").body())
                    break
                self._track(i, u)
                chunk = self._chunk(i, u, chat)
                if chunk is not None:
                    yield f"{head}{to_json(chunk)}]}}\n\n"
            if self.include_usage:
                yield sse({**self._head(obj), "choices": [], "usage": self._usage()})
            yield sse("[DONE]")
        finally:
            await updates.aclose()
            self.abort()

    def _chunk(self, i: int, u: StepUpdate, chat: bool) -> dict | None:
        idx = i * self.n + u.index
        reason = FINISH_REASONS[u.output.outputs[u.index].finish_reason] if u.finished else None
        if chat and self.parsing is not None:
            return self._parsed_chunk(idx, u, reason)
        if not u.delta_text and reason is None and not u.new_logprobs:
            return None
        lp = None
        if self.k is not None and u.new_logprobs:
            off = self._offsets.get(idx, 0)
            lp = (chat_logprobs(u.new_token_ids, u.new_logprobs, self.k) if chat
                  else completion_logprobs(u.new_token_ids, u.new_logprobs, self.k, off))
        self._offsets[idx] = self._offsets.get(idx, 0) + len(u.delta_text)
        if chat:
            return {"index": idx, "delta": {"content": u.delta_text} if u.delta_text else {}, "logprobs": lp,
                    "finish_reason": reason}
        return {"index": idx, "text": u.delta_text, "logprobs": lp, "finish_reason": reason}

    def _parsed_chunk(self, idx: int, u: StepUpdate, reason: str | None) -> dict | None:
        """A chat chunk whose delta the request's parsers made (reasoning_content, content, tool_calls)."""
        out = self._outputs.get(idx)
        if out is None:
            out = self._outputs[idx] = self.parsing.choice()
        delta = out.feed(u.delta_text) if u.delta_text else {}
        if reason is not None:
            delta = merge_deltas(delta, out.finish())
            if out.calls and reason == "stop":
                reason = "tool_calls"
        lp = chat_logprobs(u.new_token_ids, u.new_logprobs, self.k) if self.k is not None and u.new_logprobs else None
        if not delta and reason is None and lp is None:
            return None
        return {"index": idx, "delta": delta, "logprobs": lp, "finish_reason": reason}


def merge_deltas(a: dict, b: dict) -> dict:
    """One delta holding both: text fields joined, tool-call lists joined."""
    merged = dict(a)
    for key, value in b.items():
        merged[key] = merged[key] + value if key in merged else value
    return merged


PROMPT_TAIL = 256  # how much of the rendered prompt's end a reasoning parser sees


def with_call_ids(message: dict, normalize_id) -> dict:
    """``message`` with its tool-call ids (a tool result's ``tool_call_id`` too) passed through ``normalize_id``."""
    out = dict(message)
    if "tool_call_id" in out:
        out["tool_call_id"] = normalize_id(out["tool_call_id"])
    if out.get("tool_calls"):
        out["tool_calls"] = [{**c, "id": normalize_id(c["id"])} for c in out["tool_calls"]]
    return out
