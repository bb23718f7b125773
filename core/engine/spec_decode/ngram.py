"""N-gram prompt lookup (vLLM's "ngram" method): find the sequence's last n tokens earlier in its own tokens
(prompt and output) and propose the tokens that followed them. Costs no model call; works when the output
repeats the input (summaries, edits, code, extraction)."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    """``propose(token_ids, k) -> up to k tokens`` (empty when no n-gram of ``lookup_min``..``lookup_max``
    tokens recurs). The longest recurring suffix wins; among its occurrences the most recent one."""

    def __init__(self, lookup_min: int, lookup_max: int):
        if not 1 <= lookup_min <= lookup_max:
            raise ValueError(f"NgramProposer: need 1 <= lookup_min <= lookup_max, got {lookup_min}, {lookup_max}")
        self.lookup_min, self.lookup_max = lookup_min, lookup_max

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        length = len(token_ids)
        if k <= 0 or length <= self.lookup_min:
            return []
        arr = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.lookup_max, length - 1), self.lookup_min - 1, -1):
            # Windows starting at 0 .. length - n - 1: every earlier occurrence, not the suffix itself.
            windows = sliding_window_view(arr[:-1], n)
            hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return arr[start:start + k].tolist()
        return []
