"""The grammar processor on the built-in model: a completion that goes past the grammar's end (ignore_eos in the
Python API) keeps getting only stop tokens instead of failing its step (a 10,000-request fuzz run found the 500)."""

from __future__ import annotations

import json

import pytest

from engine.core.engine.llm import LLM
from engine.core.engine.sampling_params import SamplingParams
from tests import needs

grammar = needs.module("engine.core.serving.grammar", "pip install -e '.[serve]'")


@pytest.mark.usefixtures("default_model")
def test_past_the_grammars_end_only_stop_tokens_follow():
    llm = LLM(kv_cache_bytes=16 << 20)
    compiler = grammar.GrammarCompiler(llm.tokenizer, llm.config.vocab_size)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True,
                            logits_processors=[compiler.processor(schema)])
    out = llm.generate(["An object:"], params)[0].outputs[0]
    stops = set(llm.tokenizer.eos_token_ids)
    end = next(i for i, t in enumerate(out.token_ids) if t in stops)
    assert isinstance(json.loads(llm.tokenizer.decode(out.token_ids[:end]))["a"], int)
    assert end < 59 and set(out.token_ids[end:]) <= stops and out.finish_reason == "length"
