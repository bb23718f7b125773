"""A model's own sampling defaults: generation_config.json, the built-in model's, and where they apply."""

from __future__ import annotations

import json

import pytest

from engine.core.engine.llm import LLM
from engine.core.engine.sampling_params import SamplingParams
from engine.core.loader import ModelLoadError, default_model_path, load_checkpoint
from engine.core.loader.generation_config import BUILTIN_MODEL_DEFAULTS, generation_defaults
from tests.core.loader.builders import save_hf_tokenizer

transformers = pytest.importorskip("transformers")


def _tiny_hf(model_dir, generation: dict | None):
    cfg = transformers.LlamaConfig(vocab_size=420, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(model_dir))
    save_hf_tokenizer(model_dir)
    path = model_dir / "generation_config.json"
    if generation is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2, **generation}))
    return model_dir


@pytest.mark.parametrize("generation, expected", [
    (None, {}),
    ({}, {}),
    ({"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05},
     {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05}),
    ({"do_sample": False, "temperature": 0.7}, {"temperature": 0.0}),  # HF's generate() would run greedy
    ({"min_p": 0.1, "max_new_tokens": 99}, {"min_p": 0.1}),  # only the sampling fields
])
def test_hf_generation_config_gives_the_defaults(tmp_path, generation, expected):
    _tiny_hf(tmp_path, generation)
    assert load_checkpoint(tmp_path).generation_defaults == expected
    assert generation_defaults(str(tmp_path), True, None) == expected


@pytest.mark.parametrize("generation, needle", [
    ({"temperature": "warm"}, "temperature must be a number"),
    ({"top_k": True}, "top_k must be a number"),
    ({"top_p": 2.0}, "top_p must be in (0, 1]"),
    ({"temperature": -1}, "temperature must be >= 0"),
])
def test_bad_generation_config_is_a_clear_load_error(tmp_path, generation, needle):
    _tiny_hf(tmp_path, generation)
    with pytest.raises(ModelLoadError) as e:
        load_checkpoint(tmp_path)
    assert needle in str(e.value) and "generation_config.json" in str(e.value)


@pytest.mark.usefixtures("default_model")
def test_builtin_model_defaults_and_other_gguf_files(tmp_path):
    builtin = default_model_path()
    assert generation_defaults(builtin, False, builtin) == BUILTIN_MODEL_DEFAULTS
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    assert generation_defaults(str(other), False, builtin) == {}
    assert generation_defaults(builtin, False, None) == {}


def test_calls_without_sampling_params_use_the_models_defaults(tmp_path):
    """generate() without SamplingParams runs the model's defaults: here do_sample false, so greedy, which then
    equals an explicit greedy call token for token; SamplingParams() itself keeps its own defaults."""
    _tiny_hf(tmp_path, {"do_sample": False, "top_k": 5})
    llm = LLM(str(tmp_path), platform="cpu", num_kv_blocks=64)
    d = llm.get_default_sampling_params()
    assert (d.temperature, d.top_k, d.top_p) == (0.0, 5, SamplingParams().top_p)
    assert d is not llm.get_default_sampling_params()  # a copy: editing it changes nothing else
    assert SamplingParams().temperature == 0.2
    prompt = [1, 17, 99, 250, 3]
    got = llm.generate(prompt)[0].outputs[0].token_ids
    want = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=d.max_tokens))[0].outputs[0].token_ids
    assert got == want and len(got) > 0


@pytest.mark.usefixtures("default_model")
def test_builtin_model_runs_with_repetition_penalty():
    llm = LLM(None, platform="cpu", num_kv_blocks=64)
    assert llm.get_default_sampling_params().repetition_penalty == BUILTIN_MODEL_DEFAULTS["repetition_penalty"]
    assert SamplingParams().repetition_penalty == 1.0
