"""The OpenAI API's request bodies (the fields this server reads; unknown fields are ignored, as OpenAI's
clients send some this server has no use for), and the mapping of their sampling fields to SamplingParams."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.core.engine.sampling_params import MAX_LOGPROBS, MAX_N, SEED_MAX, SEED_MIN, SamplingParams

MAX_PROMPTS = 256  # prompts in one completion request (each is an engine request, with n completions)
# Stop strings are searched in every new piece of text of a request: bounded (OpenAI itself takes 4).
MAX_STOPS, MAX_STOP_CHARS = 64, 1024


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    name: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    model: str
    n: int = Field(default=1, ge=1, le=MAX_N)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1)
    min_p: float = Field(default=0.0, ge=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_STOPS)
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)  # what a torch.Generator takes
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    repetition_penalty: float = Field(default=1.0, gt=0, le=100)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else v
        if stops is not None and not all(stops):
            raise ValueError("stop strings must be non-empty")
        if stops is not None and (len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops)):
            raise ValueError(f"at most {MAX_STOPS} stop strings of at most {MAX_STOP_CHARS} characters each")
        return v

    def sampling_params(self, max_tokens: int, logprobs: int | None, processors: list,
                        model_defaults: dict | None = None) -> SamplingParams:
        """The request as SamplingParams. ``model_defaults`` (the model's own sampling defaults, LLM's
        ``generation_defaults``) fill the fields the request leaves out, as vLLM applies generation_config.json;
        the rest keep the API's defaults."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        fields = dict(
            n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            seed=self.seed, max_tokens=max_tokens, stop=stop, stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos, skip_special_tokens=self.skip_special_tokens,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, logprobs=logprobs, logits_processors=processors)
        fields.update({k: v for k, v in (model_defaults or {}).items() if k not in self.model_fields_set})
        return SamplingParams(**fields)


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v):
        if v:
            raise ValueError("echo is not supported; prepend the prompt yourself")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], (str, list)) and len(v) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request, got {len(v)}; send several requests")
        if isinstance(v, list) and (not v or any(isinstance(p, (str, list)) and not p for p in v)):
            raise ValueError("prompt must not be empty")
        if isinstance(v, str) and not v:
            raise ValueError("prompt must not be empty")
        return v

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


MAX_TOOLS = 128  # tools in one request (OpenAI's own limit)
# chat_template_kwargs (vLLM's name): extra variables for the chat template, such as Qwen3's enable_thinking
MAX_TEMPLATE_KWARGS, MAX_TEMPLATE_KWARGS_BYTES = 16, 4096
_TEMPLATE_KWARG = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_TEMPLATE_RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "raise_exception", "strftime_now",
                                "bos_token", "eos_token", "unk_token", "pad_token"})
FUNCTION_NAME = r"^[A-Za-z0-9_.-]{1,64}$"


class FunctionDefinition(BaseModel):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: str = Field(pattern=FUNCTION_NAME)


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionName


class FunctionCall(BaseModel):
    name: str
    arguments: str


class MessageToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, v, info):
        if v is None and info.data.get("role") != "assistant":
            raise ValueError(f"a {info.data.get('role')} message needs content (a string or text parts), not null")
        return v

    def template_message(self) -> dict:
        """The message as chat templates take it (Hugging Face's convention: a tool call's arguments as an
        object where they parse as one)."""
        msg = {"role": self.role, "content": self.text()}
        if self.name is not None:
            msg["name"] = self.name
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": c.type, "function": {
                "name": c.function.name, "arguments": _json_or_text(c.function.arguments)}} for c in self.tool_calls]
        return msg

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"only text content parts are supported, got {part.get('type')!r}")
            parts.append(part["text"])
        return "".join(parts)


def _json_or_text(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, max_length=MAX_TEMPLATE_KWARGS)

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v):
        if not v:
            return v
        for key in v:
            if not _TEMPLATE_KWARG.fullmatch(key) or key in _TEMPLATE_RESERVED:
                raise ValueError(f"chat_template_kwargs: {key[:64]!r} is not a variable a request may set (a name "
                                 f"of letters, digits and '_', none of {sorted(_TEMPLATE_RESERVED)})")
        if len(json.dumps(v)) > MAX_TEMPLATE_KWARGS_BYTES:
            raise ValueError(f"chat_template_kwargs is over {MAX_TEMPLATE_KWARGS_BYTES} bytes as JSON")
        return v

    @model_validator(mode="after")
    def _tool_choice(self):
        choice = self.tool_choice
        if choice in ("required", "auto") or isinstance(choice, NamedToolChoice):
            if not self.tools:
                raise ValueError("tool_choice needs tools: send the functions the model may call in 'tools'")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in {t.function.name for t in self.tools}:
            raise ValueError(f"tool_choice names the function {choice.function.name!r}, which is not in 'tools'")
        if self.tools and len({t.function.name for t in self.tools}) != len(self.tools):
            raise ValueError("tools must have distinct function names")
        return self

    @field_validator("messages", mode="before")
    @classmethod
    def _non_empty(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("messages must hold at least one message")
        return v
