"""What the engine returns for a request, in vLLM's shape: a RequestOutput holds one CompletionOutput per
``SamplingParams.n``, so code written against vLLM (``out.outputs[0].text``) runs unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Logprob:
    """The log-probability of one token under the model (raw logits, before penalties and temperature), its
    rank among all tokens (1 = most likely) and its text."""

    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One of a request's ``n`` completions.

    ``logprobs`` (only when ``SamplingParams.logprobs`` is set): one dict per generated token mapping token id to
    Logprob for the top ``logprobs`` tokens plus the sampled one; ``cumulative_logprob`` sums the sampled tokens'
    log-probabilities (None without logprobs)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None  # "stop" (EOS, stop string or stop token), "length", "abort"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it, if any

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (the most any completion got)

    @property
    def finished(self) -> bool:
        """True once every completion has finished."""
        return all(o.finished for o in self.outputs)


@dataclass
class StepUpdate:
    """One completion's progress in one engine step: its new text and tokens, and whether it finished.
    ``output`` is the whole request (all completions so far); ``output.finished`` says whether all are done."""

    request_id: str
    delta_text: str
    new_token_ids: list[int]
    finished: bool
    output: RequestOutput
    index: int = 0  # which completion (0 .. n-1)
    new_logprobs: list[dict[int, Logprob]] | None = None  # for new_token_ids, when logprobs were asked for
    request_finished: bool = False  # this update finished the request's last unfinished completion

    def then(self, later: StepUpdate) -> StepUpdate:
        """This update and ``later`` (the same completion's next) as one: a consumer that fell behind the engine
        sends one chunk for both instead of two."""
        if later.request_id != self.request_id or later.index != self.index:
            raise ValueError("only updates of one completion can be merged")
        logprobs = None if self.new_logprobs is None and later.new_logprobs is None else [
            *(self.new_logprobs or ()), *(later.new_logprobs or ())]
        return StepUpdate(self.request_id, self.delta_text + later.delta_text,
                          self.new_token_ids + later.new_token_ids, later.finished, later.output, self.index,
                          logprobs, later.request_finished)
