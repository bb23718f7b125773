"""OpenAI's ``logit_bias``: a fixed value added to the logits of chosen token ids before sampling."""

from __future__ import annotations

import torch

MAX_LOGIT_BIAS_TOKENS = 1024  # bounded work per request (OpenAI accepts up to 300 entries)


class LogitBias:
    """``(generated_ids, logits_row) -> logits_row`` plus ``bias[token_id]`` for each biased token (stateless, so
    one instance serves every completion).

    ``bias`` maps token ids (ints, or their decimal strings as JSON sends them) to values in [-100, 100]; ids
    outside ``[0, vocab_size)`` or values out of range raise ValueError naming the entry."""

    def __init__(self, bias: dict, vocab_size: int):
        if len(bias) > MAX_LOGIT_BIAS_TOKENS:
            raise ValueError(f"logit_bias has {len(bias)} entries; at most {MAX_LOGIT_BIAS_TOKENS} are accepted")
        ids, vals = [], []
        for key, value in bias.items():
            try:
                tid = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"logit_bias keys are token ids, got {key!r}") from None
            if not 0 <= tid < vocab_size:
                raise ValueError(f"logit_bias token id {tid} is outside the vocabulary [0, {vocab_size})")
            if tid in ids:
                raise ValueError(f"logit_bias names token id {tid} twice")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
                raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {value!r} for token {tid}")
            ids.append(tid)
            vals.append(float(value))
        self._ids, self._vals = torch.tensor(ids, dtype=torch.int64), torch.tensor(vals, dtype=torch.float32)

    def __call__(self, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        """Adds in place and returns ``logits``: the sampler hands each processor a row of its own copy, and a
        per-token copy of a whole vocabulary-wide row would cost more than the few entries changed."""
        if self._ids.device != logits.device or self._vals.dtype != logits.dtype:
            self._ids, self._vals = self._ids.to(logits.device), self._vals.to(logits.device, logits.dtype)
        return logits.index_put_((self._ids,), self._vals, accumulate=True)
