"""Engine outputs as OpenAI response bodies and stream chunks (completions and chat), plus server-sent events."""

from __future__ import annotations

import json

from engine.core.engine.outputs import Logprob

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
to_json = _ENCODER.encode  # compact JSON text (one encoder: json.dumps would build one per call with these options)


def sse(obj) -> str:
    """One server-sent event carrying ``obj`` as JSON (or the literal ``[DONE]``)."""
    return f"data: {obj if isinstance(obj, str) else to_json(obj)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def _top(entry: dict[int, Logprob], k: int) -> list[Logprob]:
    return sorted((lp for lp in entry.values() if lp.rank <= k), key=lambda lp: lp.rank)[:k]


def completion_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], k: int, offset: int = 0) -> dict:
    """The legacy completions ``logprobs`` object for these tokens (``offset``: text length before them)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tok, entry in zip(token_ids, entries, strict=True):
        chosen = entry[tok]
        text = chosen.decoded_token or ""
        out["tokens"].append(text)
        out["token_logprobs"].append(chosen.logprob)
        out["top_logprobs"].append({lp.decoded_token: lp.logprob for lp in _top(entry, k)} or None)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def chat_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], k: int) -> dict:
    """The chat ``logprobs`` object ({"content": [...]}) for these tokens."""
    def item(lp: Logprob) -> dict:
        text = lp.decoded_token or ""
        return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode("utf-8"))}

    content = []
    for tok, entry in zip(token_ids, entries, strict=True):
        d = item(entry[tok])
        d["top_logprobs"] = [item(lp) for lp in _top(entry, k)]
        content.append(d)
    return {"content": content}
