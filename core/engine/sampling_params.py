"""SamplingParams: how one request is decoded. Invalid values raise ValueError saying what is allowed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MAX_LOGPROBS = 20  # the most top log-probabilities a request may ask for per token
MAX_N = 16  # the most completions one request may ask for


# What a torch.Generator takes as a seed: a signed or unsigned 64-bit integer.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1

@dataclass
class SamplingParams:
    """temperature 0 means greedy (the default is 0.2 with top_p 0.9; see below). top_k 0 (or -1) and top_p 1 and
    min_p 0 disable those filters.
    ``seed`` makes a request's sampling reproducible regardless of what it is batched with (completion i of
    ``n`` uses seed + i).
    ``stop`` strings end generation when they appear in the text (they are not included in the output);
    ``stop_token_ids`` likewise for tokens; EOS ends generation unless ``ignore_eos``.
    ``n``: completions of the prompt (each a CompletionOutput of the request's RequestOutput).
    ``presence_penalty`` / ``frequency_penalty`` (in [-2, 2], OpenAI's meaning) subtract from the logit of each
    token already generated once / once per occurrence; ``repetition_penalty`` (> 0, 1 = off) divides positive
    logits and multiplies negative ones of tokens in the prompt or the output (the CTRL/HF/vLLM rule).
    ``logprobs``: None for none, else how many top log-probabilities to return per token (0 .. MAX_LOGPROBS;
    the sampled token's is always included).
    ``logits_processors``: callables ``(generated_token_ids, logits_row) -> logits_row`` applied before sampling
    (after penalties); a processor with a ``clone()`` method gets its own copy per completion (stateful ones,
    e.g. a grammar matcher)."""

    n: int = 1
    # Defaults: the default model's card (SmolLM2-Instruct: temperature 0.2, top_p 0.9; temperature 1 rambles).
    # A call without SamplingParams (LLM.generate(prompts), `engine generate` without sampling options) uses
    # LLM.get_default_sampling_params(): these overlaid with the model's own defaults, which for the built-in model
    # add repetition_penalty 1.1 (it loops without). The OpenAI server keeps the API's (temperature 1, top_p 1) and
    # fills fields a request leaves out from the model's own defaults, as vLLM does.
    temperature: float = 0.2
    top_p: float = 0.9
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    logits_processors: list[Callable] = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        self.logits_processors = list(self.logits_processors)
        if self.top_k == -1:
            self.top_k = 0
        checks = [
            (_is_int(self.n) and 1 <= self.n <= MAX_N, f"n must be an int in [1, {MAX_N}], got {self.n!r}"),
            (self.temperature >= 0, f"temperature must be >= 0 (0 = greedy), got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (_is_int(self.top_k) and self.top_k >= 0, f"top_k must be an int >= 0 (0 = off), got {self.top_k}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (_is_int(self.max_tokens) and self.max_tokens >= 1,
             f"max_tokens must be an int >= 1, got {self.max_tokens}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must be non-empty strings"),
            (self.seed is None or (_is_int(self.seed) and SEED_MIN <= self.seed
                                   and (not _is_int(self.n) or self.seed + self.n - 1 <= SEED_MAX)),
             f"seed must be None or an int in [{SEED_MIN}, {SEED_MAX}] (with n > 1, seed + n - 1 too: completion i "
             f"uses seed + i), got {self.seed!r}"),
            (-2 <= self.presence_penalty <= 2, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2 <= self.frequency_penalty <= 2,
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (0 < self.repetition_penalty <= 100,
             f"repetition_penalty must be in (0, 100] (1 = off), got {self.repetition_penalty}"),
            (self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
             f"logprobs must be None or an int in [0, {MAX_LOGPROBS}], got {self.logprobs!r}"),
            (all(callable(p) for p in self.logits_processors), "logits_processors must be callables"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"invalid SamplingParams: {msg}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
