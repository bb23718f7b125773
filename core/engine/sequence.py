"""A request's state as it moves through the scheduler, block manager and model runner."""

from __future__ import annotations

import enum
import itertools

from .sampling_params import SamplingParams

_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # not yet (or no longer, after preemption) holding KV blocks
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Token ids (prompt + generated), KV-cache bookkeeping and the finish state of one request.

    ``num_computed_tokens`` counts the leading tokens whose K/V are in the cache (prefix-cache hits
    included); the model runner computes tokens [num_computed_tokens, num_computed_tokens + n) for
    the n the scheduler grants. ``block_table`` lists this sequence's KV block ids in order.
    """

    def __init__(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None):
        self.seq_id = next(_ids)
        self.request_id = request_id if request_id is not None else str(self.seq_id)
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at the last allocation
        self.block_table: list[int] = []
        self.finish_reason: str | None = None  # "stop" | "length" | "abort"
        self.num_preemptions = 0
        # Prefix-cache bookkeeping owned by the BlockManager: chained hashes of the full token blocks
        # (a pure function of the tokens, so they survive preemption), and how many leading blocks of
        # block_table are already hit or registered in the cache.
        self.block_hashes: list[bytes] = []
        self.num_hashed_blocks = 0
        self.generator = None  # the per-request torch.Generator of a seeded request, made by the Sampler
        # Speculative decoding with a draft model: leading tokens whose K/V are in the draft model's own cache
        # (which shares this block_table). Reset whenever the blocks are freed or allocated anew.
        self.num_draft_computed_tokens = 0
        # Speculative decoding backs off a sequence whose drafts keep being rejected: decode steps left without
        # drafting, and the number of consecutive fully rejected drafts.
        self.spec_backoff = 0
        self.spec_misses = 0
        self.spec_limit = 0  # most drafts to propose next (0: the table's k); see speculator._adapt
        self.spec_acceptance: float | None = None  # running share of its drafts accepted (None: never drafted)
        self.spec_ngram = None  # the n-gram proposer's index of these tokens (spec_decode/ngram.py)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def tokens_between(self, start: int, end: int) -> list[int]:
        """``token_ids[start:end]`` (0 <= start <= end), without building ``token_ids``: a decode step reads one
        token of a sequence whose token list may be thousands long."""
        p = len(self.prompt_token_ids)
        if start >= p:
            return self.output_token_ids[start - p:end - p]
        if end <= p:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - p]

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        """True while the tokens still to compute include prompt tokens (or recomputed outputs)."""
        return self.num_computed_tokens < len(self) - 1

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, len={len(self)}, computed={self.num_computed_tokens}, "
                f"status={self.status.value}, blocks={len(self.block_table)})")
