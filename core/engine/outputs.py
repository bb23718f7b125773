"""What the engine returns for a request."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (EOS, stop string or stop token), "length", "abort"
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class StepUpdate:
    """One request's progress in one engine step: the new text and token (if any), and whether it finished."""

    request_id: str
    delta_text: str
    new_token_ids: list[int]
    finished: bool
    output: RequestOutput
