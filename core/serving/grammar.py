"""Structured output: ``response_format`` json_object / json_schema as a token mask, through xgrammar.

Why xgrammar (measured on this repo's default model, SmolLM2-135M, vocabulary 49152, Intel Xeon 2 cores, see
BENCHMARKS.md): its JSON grammar is a real context-free grammar (any nesting depth) compiled in ~5 ms, and filling
a token bitmask costs ~3 us per token (median); outlines-core compiles JSON to a regular expression, which for a
free-form JSON object took 6.6 s to index and still rejected 4-deep nesting. The price is xgrammar's install
footprint (its wheel pulls torch, transformers and a kernel compiler on x86-64 Linux; BENCHMARKS.md lists them, all
already engine or test dependencies here), against outlines-core's dependency-free 2.3 MB wheel.

The mask is applied as a SamplingParams logits processor in plain torch (the bitmask is unpacked on the logits'
own device), so it works on whatever platform runs the model.
"""

from __future__ import annotations

import functools
import json
import logging
import threading

import torch

from .token_bytes import token_bytes

log = logging.getLogger(__name__)


class GrammarError(ValueError):
    """The response_format cannot be compiled (an invalid or unsupported JSON schema)."""


class GrammarCompiler:
    """Compiles response formats for one model's vocabulary; compiled grammars are cached by their JSON text."""

    def __init__(self, tokenizer, vocab_size: int):
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo(token_bytes(tokenizer), vocab_type=xgr.VocabType.RAW, vocab_size=vocab_size,
                                 stop_token_ids=sorted(tokenizer.eos_token_ids))
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._lock = threading.Lock()  # compile from any request handler thread, one at a time
        self._compile = functools.lru_cache(maxsize=128)(self._compile_uncached)

    def processor(self, schema: dict | bool | None) -> GrammarLogitsProcessor:
        """A fresh processor constraining output to JSON matching ``schema`` (None: any JSON object)."""
        text = json.dumps(schema, sort_keys=True) if schema is not None else None
        return self.processor_for(text)

    def processor_for(self, schema_text: str | None) -> GrammarLogitsProcessor:
        with self._lock:
            compiled = self._compile(schema_text)
        return GrammarLogitsProcessor(self._xgr, compiled, self.vocab_size, schema_text)

    def serve_unpickled(self) -> None:
        """Rebuild processors unpickled in this process with this compiler (an engine process of a data-parallel
        server receives requests' processors pickled: they travel as their schema and compile here)."""
        _PROCESS_COMPILER[0] = self

    def _compile_uncached(self, schema_text: str | None):
        try:
            if schema_text is None:  # json_object: any object; no free whitespace, so the output stays compact
                return self._compiler.compile_json_schema('{"type": "object"}', any_whitespace=False,
                                                          strict_mode=False)
            return self._compiler.compile_json_schema(schema_text, any_whitespace=False)
        except RuntimeError as exc:
            msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            raise GrammarError(f"invalid or unsupported JSON schema: {msg.split(': ', 1)[-1]}") from exc


_PROCESS_COMPILER: list[GrammarCompiler | None] = [None]


def _unpickle_processor(schema_text: str | None) -> GrammarLogitsProcessor:
    compiler = _PROCESS_COMPILER[0]
    if compiler is None:
        raise RuntimeError("a grammar processor was unpickled in a process without a GrammarCompiler; call "
                           "GrammarCompiler.serve_unpickled() there first")
    return compiler.processor_for(schema_text)


class GrammarLogitsProcessor:
    """``(generated_ids, logits_row) -> logits_row`` with every token the grammar forbids next set to -inf.

    Stateful (a matcher fed the generated tokens); ``clone()`` gives an independent one for another completion."""

    def __init__(self, xgr, compiled, vocab_size: int, schema_text: str | None = None):
        self._xgr, self._compiled, self.vocab_size = xgr, compiled, vocab_size
        self._schema_text = schema_text
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._num_accepted = 0
        self._stop_ids = list(compiled.tokenizer_info.stop_token_ids)

    def clone(self) -> GrammarLogitsProcessor:
        return GrammarLogitsProcessor(self._xgr, self._compiled, self.vocab_size, self._schema_text)

    def __reduce__(self):
        if self._num_accepted:
            raise TypeError("a grammar processor that has accepted tokens cannot be pickled (its matcher state "
                            "does not travel); pickle a fresh clone()")
        return _unpickle_processor, (self._schema_text,)

    def __call__(self, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        for token in generated[self._num_accepted:]:
            if not self._matcher.accept_token(int(token)):
                # Only reachable if a token outside the mask was sampled; end the completion cleanly rather
                # than failing the step (and with it every request batched alongside).
                log.error("grammar rejected token %d; ending this completion", token)
                return _only(logits, self._stop_ids)
        self._num_accepted = len(generated)
        if self._matcher.is_terminated():  # the grammar ended with a stop token the engine went past (ignore_eos)
            return _only(logits, self._stop_ids)
        self._matcher.fill_next_token_bitmask(self._bitmask)
        allowed = _unpack(self._bitmask[0].to(logits.device), logits.shape[-1])
        return logits.masked_fill(~allowed, float("-inf"))


def _unpack(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """int32 words, bit j of word i = token 32 i + j allowed, as a bool vector of ``width`` (extra ids: False)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().reshape(-1)
    if bits.numel() >= width:
        return bits[:width]
    return torch.cat([bits, bits.new_zeros(width - bits.numel())])


def _only(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    out = torch.full_like(logits, float("-inf"))
    idx = torch.tensor(ids, dtype=torch.int64, device=logits.device)
    return out.index_copy(0, idx, logits[idx])
