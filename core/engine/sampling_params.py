"""SamplingParams: how one request is decoded. Invalid values raise ValueError saying what is allowed."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """temperature 0 means greedy. top_k 0 (or -1) and top_p 1 and min_p 0 disable those filters.
    ``seed`` makes a request's sampling reproducible regardless of what it is batched with.
    ``stop`` strings end generation when they appear in the text (they are not included in the output);
    ``stop_token_ids`` likewise for tokens; EOS ends generation unless ``ignore_eos``."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.top_k == -1:
            self.top_k = 0
        checks = [
            (self.temperature >= 0, f"temperature must be >= 0 (0 = greedy), got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (isinstance(self.top_k, int) and self.top_k >= 0, f"top_k must be an int >= 0 (0 = off), got {self.top_k}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (isinstance(self.max_tokens, int) and self.max_tokens >= 1,
             f"max_tokens must be an int >= 1, got {self.max_tokens}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must be non-empty strings"),
            (self.seed is None or isinstance(self.seed, int), f"seed must be an int or None, got {self.seed!r}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"invalid SamplingParams: {msg}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
