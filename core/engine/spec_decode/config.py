"""SpeculativeConfig: how (and how much) the engine speculates, in vLLM's shape.

``LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
"prompt_lookup_max": 4})`` or ``{"method": "draft_model", "model": PATH_OR_NONE, "num_speculative_tokens": 3}``.
``num_speculative_tokens_per_batch_size`` ({batch size: k}) picks k from the number of running sequences: the
entry with the largest batch size <= the running count applies (below the smallest key, the smallest key's
entry), so ``{1: 4, 8: 2, 32: 0}`` drafts 4 tokens for 1-7 sequences, 2 for 8-31 and none from 32 on. Without a
table, every batch size drafts ``num_speculative_tokens``. ``benchmarks/bench_spec_decode.py`` measures a table
on the machine (see tuning.py).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

METHODS = ("ngram", "draft_model")
_KEYS = {"method", "num_speculative_tokens", "num_speculative_tokens_per_batch_size", "prompt_lookup_min",
         "prompt_lookup_max", "model", "dequantize", "dtype"}


@dataclass
class SpeculativeConfig:
    """``model``/``dequantize``/``dtype`` load the draft model (method "draft_model"): a GGUF file or HF
    directory whose vocabulary matches the target's (None: the built-in default model); ``dequantize`` expands
    GGUF weights to ``dtype`` (default: the target's dtype)."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    num_speculative_tokens_per_batch_size: dict[int, int] = field(default_factory=dict)
    prompt_lookup_min: int = 3
    prompt_lookup_max: int = 4
    model: str | None = None
    dequantize: bool = False
    dtype: str | None = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"speculative_config: method must be one of {METHODS}, got {self.method!r}")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 0)
        _check_int("prompt_lookup_min", self.prompt_lookup_min, 1)
        _check_int("prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min)
        table = {}
        for b, k in dict(self.num_speculative_tokens_per_batch_size).items():
            b, k = _as_int("num_speculative_tokens_per_batch_size key", b, 1), _as_int(
                f"num_speculative_tokens_per_batch_size[{b}]", k, 0)
            table[b] = k
        self.num_speculative_tokens_per_batch_size = dict(sorted(table.items()))
        self._keys = list(self.num_speculative_tokens_per_batch_size)

    @classmethod
    def from_dict(cls, d: dict | SpeculativeConfig) -> SpeculativeConfig:
        if isinstance(d, SpeculativeConfig):
            return d
        if not isinstance(d, dict):
            raise TypeError(f"speculative_config must be a dict, got {type(d).__name__}")
        unknown = set(d) - _KEYS
        if unknown:
            raise ValueError(f"speculative_config: unknown keys {sorted(unknown)}; known: {sorted(_KEYS)}")
        return cls(**d)

    @property
    def max_num_speculative_tokens(self) -> int:
        table = self.num_speculative_tokens_per_batch_size
        return max(table.values()) if table else self.num_speculative_tokens

    def num_tokens_for(self, batch_size: int) -> int:
        """Draft tokens per sequence for a step with ``batch_size`` running sequences."""
        if not self._keys:
            return self.num_speculative_tokens
        i = max(bisect.bisect_right(self._keys, batch_size) - 1, 0)
        return self.num_speculative_tokens_per_batch_size[self._keys[i]]


def _as_int(name: str, value, lo: int) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():  # JSON object keys are strings
        value = int(value)
    _check_int(name, value, lo)
    return value


def _check_int(name: str, value, lo: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"speculative_config: {name} must be an int >= {lo}, got {value!r}")
