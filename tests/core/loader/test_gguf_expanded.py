"""GGUF tensor types the engine does not keep quantized (Q2_K and Q3_K here) are expanded to floats at load, and the
load says so once, with the memory it costs."""

from __future__ import annotations

import logging

import gguf
import numpy as np
import pytest
import torch

from engine.core.loader import load_checkpoint
from engine.core.models.weights import QuantizedWeight
from tests.core.loader.builders import byte_level_gguf_tokenizer, random_blocks, write_gguf

transformers = pytest.importorskip("transformers")
Q = gguf.GGMLQuantizationType
SIDE = 256  # a K-quant block is 256 elements: rows of 256


def _kquants(name: str, a: np.ndarray):
    table = {"q_proj": Q.Q4_0, "gate_proj": Q.Q2_K, "up_proj": Q.Q3_K, "down_proj": Q.Q3_K}
    return next((q for key, q in table.items() if key in name), Q.F32)


@pytest.fixture(scope="module")
def kquant_gguf(tmp_path_factory):
    transformers.logging.set_verbosity_error()
    tok = byte_level_gguf_tokenizer("gpt-2")
    cfg = transformers.LlamaConfig(vocab_size=len(tok["tokens"]), hidden_size=SIDE, intermediate_size=SIDE,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=128, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg)
    path = tmp_path_factory.mktemp("kquant") / "m.gguf"
    return write_gguf(path, "llama", model.state_dict(), cfg, tokenizer=tok, qtype=_kquants)


def _engine_records(caplog):
    return [r for r in caplog.records if r.name == "engine"]


@pytest.mark.parametrize("dtype, float_size", [(torch.float32, "1.5 MiB"), (torch.bfloat16, "768.0 KiB")])
def test_kquants_are_expanded_and_the_load_says_so_with_the_memory(kquant_gguf, caplog, dtype, float_size):
    with caplog.at_level(logging.INFO, logger="engine"):
        ck = load_checkpoint(kquant_gguf, dtype=dtype)
    (rec,) = [r for r in _engine_records(caplog) if "expanded" in r.getMessage()]
    assert rec.levelno == logging.WARNING
    # 2 Q2_K tensors of 256x256 (84 bytes per 256) and 4 Q3_K (110 bytes per 256): 155648 bytes = 152.0 KiB;
    # 6 x 65536 floats
    dtype_name = str(dtype).removeprefix("torch.")
    assert rec.getMessage() == (
        f"engine: GGUF Q2_K (2 tensors), Q3_K (4 tensors) weights are expanded to {dtype_name} at load (the engine "
        f"keeps only Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K matrices quantized): {float_size} in memory instead of "
        "152.0 KiB in the file")
    w = ck.weights
    assert isinstance(w["model.layers.0.self_attn.q_proj.weight"], QuantizedWeight)
    up = w["model.layers.1.mlp.up_proj.weight"]
    assert not isinstance(up, QuantizedWeight) and up.dtype == dtype and up.shape == (SIDE, SIDE)
    expect = gguf.quants.dequantize(random_blocks((SIDE, SIDE), Q.Q3_K), Q.Q3_K)
    torch.testing.assert_close(up, torch.from_numpy(np.asarray(expect, dtype=np.float32)).to(dtype), rtol=0, atol=0)


def test_dequantize_true_says_it_at_info_level_only(kquant_gguf, caplog):
    with caplog.at_level(logging.WARNING, logger="engine"):
        load_checkpoint(kquant_gguf, dequantize=True)
    assert not _engine_records(caplog)
    with caplog.at_level(logging.INFO, logger="engine"):
        load_checkpoint(kquant_gguf, dequantize=True)
    (rec,) = [r for r in _engine_records(caplog) if "expanded" in r.getMessage()]
    assert rec.levelno == logging.INFO
    assert rec.getMessage().startswith("engine: GGUF Q4_0 (2 tensors), Q2_K (2 tensors), Q3_K (4 tensors) weights are "
                                       "expanded to float32 at load (dequantize=True): ")


def test_kept_types_load_without_a_word(tmp_path, caplog):
    tok = byte_level_gguf_tokenizer("gpt-2")
    cfg = transformers.LlamaConfig(vocab_size=len(tok["tokens"]), hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=128)
    kept = {"q_proj": Q.Q4_0, "k_proj": Q.Q4_1, "embed_tokens": Q.Q8_0, "up_proj": Q.F16}
    path = write_gguf(tmp_path / "m.gguf", "llama", transformers.LlamaForCausalLM(cfg).state_dict(), cfg,
                      tokenizer=tok, qtype=lambda name, a: next((q for k, q in kept.items() if k in name), Q.F32))
    with caplog.at_level(logging.INFO, logger="engine"):
        load_checkpoint(path)
    assert not [r for r in _engine_records(caplog) if "expanded" in r.getMessage()]
