"""Tiny GGUF files written from random HF models: names, q/k un-permutation, tensor types, config, tokenizers."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.core.loader import load_checkpoint
from engine.core.models.weights import QuantizedWeight
from tests import needs
from tests.core.loader.builders import (
    CHATML,
    VARIED_TEXTS,
    byte_level_gguf_tokenizer,
    train_sentencepiece_bpe,
    write_gguf,
)

transformers = pytest.importorskip("transformers")
Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module", autouse=True)
def _quiet():
    transformers.logging.set_verbosity_error()


def tiny_model(arch: str, vocab: int, **overrides):
    """A random HF model of ``arch`` (every parameter, norms included, drawn fresh)."""
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[arch]
    kw = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False)
    kw.update(overrides)
    model = cls[1](cls[0](**kw))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


def _hf_gguf_state(path) -> dict[str, torch.Tensor]:
    m = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    return m.state_dict()


def test_llama_f32_weights_come_back_exactly_unpermuted(tmp_path):
    tok = byte_level_gguf_tokenizer("gpt-2")
    model = tiny_model("llama", len(tok["tokens"]))
    sd = model.state_dict()
    path = write_gguf(tmp_path / "m.gguf", "llama", sd, model.config, tokenizer=tok)
    ck = load_checkpoint(path)
    assert set(ck.weights) == set(sd)
    for name, w in ck.weights.items():
        torch.testing.assert_close(w, sd[name], rtol=0, atol=0, msg=name)
    c, hc = ck.config, model.config
    assert (c.arch, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == (
        "llama", hc.vocab_size, hc.hidden_size, hc.intermediate_size, hc.num_hidden_layers)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.max_position) == (4, 2, 16, 512)
    assert c.rms_norm_eps == pytest.approx(1e-5) and c.rope_theta == hc.rope_parameters["rope_theta"]
    assert not c.tie_word_embeddings and not c.attention_bias and not c.qk_norm
    assert c.bos_token_id == tok["bos"] and tok["eos"] in c.eos_token_ids


def _qtypes(name: str, a: np.ndarray):
    table = {"q_proj": Q.Q4_0, "k_proj": Q.Q4_1, "v_proj": Q.Q8_0, "o_proj": Q.F16, "gate_proj": Q.BF16,
             "up_proj": Q.Q5_0, "down_proj": Q.F32, "embed_tokens": Q.Q8_0, "lm_head": Q.Q4_1}
    return next((q for key, q in table.items() if key in name), Q.F32)


def test_llama_tensor_types_quantized_and_dequantized(tmp_path):
    tok = byte_level_gguf_tokenizer("gpt-2")
    model = tiny_model("llama", len(tok["tokens"]))
    sd = model.state_dict()
    path = write_gguf(tmp_path / "m.gguf", "llama", sd, model.config, tokenizer=tok, qtype=_qtypes)

    ck = load_checkpoint(path, dtype=torch.bfloat16)
    for name, w in ck.weights.items():
        q = _qtypes(name, None) if sd[name].dim() == 2 else Q.F32
        src = sd[name].numpy()
        if q in (Q.Q4_0, Q.Q4_1, Q.Q8_0):
            assert isinstance(w, QuantizedWeight) and (w.qtype, w.rows, w.cols) == (int(q), *src.shape), name
            # quantization is row-wise, so un-permuted raw rows are the blocks of the original matrix
            assert torch.equal(w.raw, torch.from_numpy(gguf.quants.quantize(src, q))), name
            continue
        expect = {Q.F32: src, Q.F16: src.astype(np.float16).astype(np.float32),
                  Q.BF16: gguf.quants.dequantize(gguf.quants.quantize(src, Q.BF16), Q.BF16),
                  Q.Q5_0: gguf.quants.dequantize(gguf.quants.quantize(src, Q.Q5_0), Q.Q5_0)}[q]
        assert w.dtype == torch.bfloat16, name
        torch.testing.assert_close(w, torch.from_numpy(np.asarray(expect)).to(torch.bfloat16), rtol=0, atol=0)

    deq = load_checkpoint(path, dequantize=True)
    ref = _hf_gguf_state(path)
    assert set(deq.weights) == set(ref)
    for name, w in deq.weights.items():
        assert w.dtype == torch.float32
        torch.testing.assert_close(w, ref[name], rtol=0, atol=0, msg=name)


def test_qwen2_has_biases_and_no_permutation(tmp_path):
    tok = byte_level_gguf_tokenizer("qwen2")
    model = tiny_model("qwen2", len(tok["tokens"]), tie_word_embeddings=True)
    sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    path = write_gguf(tmp_path / "q.gguf", "qwen2", sd, model.config, tokenizer=tok, qtype=lambda n, a: Q.Q8_0)
    ck = load_checkpoint(path, dequantize=True)
    c = ck.config
    assert c.arch == "qwen2" and c.attention_bias and c.tie_word_embeddings and "lm_head.weight" not in ck.weights
    ref = _hf_gguf_state(path)
    for name, w in ck.weights.items():
        torch.testing.assert_close(w, ref[name], rtol=0, atol=0, msg=name)
    torch.testing.assert_close(ck.weights["model.layers.1.self_attn.k_proj.bias"],
                               sd["model.layers.1.self_attn.k_proj.bias"], rtol=0, atol=0)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="q.gguf")
    for text in VARIED_TEXTS:  # transformers splits 'qwen2' files with the same regex llama.cpp uses
        assert ck.tokenizer.encode(text) == hf_tok.encode(text), text
        assert ck.tokenizer.decode(ck.tokenizer.encode(text), skip_special_tokens=False) == text


def test_qwen3_qk_norm_head_dim_and_rope_scaling(tmp_path):
    tok = byte_level_gguf_tokenizer("qwen2")
    model = tiny_model("qwen3", len(tok["tokens"]), head_dim=32)
    sd = model.state_dict()
    path = write_gguf(tmp_path / "q3.gguf", "qwen3", sd, model.config, tokenizer=tok,
                      rope_scaling={"rope_type": "linear", "factor": 4.0})
    ck = load_checkpoint(path)
    c = ck.config
    assert (c.arch, c.head_dim, c.qk_norm, c.attention_bias) == ("qwen3", 32, True, False)
    assert c.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    for name, w in ck.weights.items():
        torch.testing.assert_close(w, sd[name], rtol=0, atol=0, msg=name)
    assert tuple(ck.weights["model.layers.0.self_attn.q_proj.weight"].shape) == (4 * 32, 64)


def test_sentencepiece_vocabulary_matches_transformers(tmp_path):
    tokens, scores = train_sentencepiece_bpe()
    tok = {"model": "llama", "tokens": tokens, "scores": scores, "bos": 1, "eos": 2, "add_bos": True,
           "types": [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259), "chat_template": CHATML}
    model = tiny_model("llama", len(tokens), num_hidden_layers=1)
    path = write_gguf(tmp_path / "spm.gguf", "llama", model.state_dict(), model.config, tokenizer=tok)
    ours = load_checkpoint(path).tokenizer
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="spm.gguf")
    texts = [t for t in VARIED_TEXTS if "<|" not in t] + ["<s>hello</s> world", "ünïcödé ✓ 🙂"]
    if hf_tok.encode("a")[0] != 1:  # transformers 5.17 (the GPU machine's) ignores the file's add_bos; 5.24 obeys
        needs.unavailable(f"transformers {transformers.__version__} ignores the GGUF's add_bos_token: upgrade it")
    for text in texts:
        ids = ours.encode(text)
        assert ids == hf_tok.encode(text), text
        assert ids[0] == 1  # BOS added, as the file asks
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf_tok.decode(ids, skip_special_tokens=skip)
    assert ours.decode(ours.encode("ünïcödé ✓ 🙂")) == "ünïcödé ✓ 🙂"  # through byte fallback


def test_q4_0_and_q8_0_linears_run_int4_and_int8_linear_where_the_platform_has_them(tmp_path):
    """A GGUF with Q4_0 attention and Q8_0 MLP matrices on a platform with int4_linear and int8_linear kernels (the cpu
    platform plus the Triton kernels under the interpreter): every projection runs as INT4 / INT8 groups of 32 and
    the logits match transformers' on the same file (which dequantizes it)."""
    from engine import LLM
    from engine.core.models.weights import Int4Weight, Int8Weight
    from engine.platforms.triton_kernels.int4_linear import int4_linear_triton
    from engine.platforms.triton_kernels.int8_linear import int8_linear_triton
    from tests.core.loader.test_hf_int4 import CpuWithTritonInt4

    tok = byte_level_gguf_tokenizer("gpt-2")
    model = tiny_model("llama", len(tok["tokens"]))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.3)  # logits of a size where 1e-4 is a tight check
    path = write_gguf(tmp_path / "m.gguf", "llama", model.state_dict(), model.config, tokenizer=tok,
                      qtype=lambda n, a: Q.F32 if "embed" in n else Q.Q8_0 if ".mlp." in n else Q.Q4_0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", dtype=torch.float32)
    gen = torch.Generator().manual_seed(int.from_bytes(np.random.bytes(4), "little"))
    ids = torch.randint(0, len(tok["tokens"]), (23,), generator=gen).tolist()
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].float()
    llm = LLM(str(path), dtype="float32", num_kv_blocks=16, block_size=16, platform=CpuWithTritonInt4(),
              activation_quant="none")
    layer = llm.model.layers[0]
    assert isinstance(layer.mlp.down.w, Int8Weight) and isinstance(layer.attn.qkv_proj.w, Int4Weight)
    assert isinstance(llm.model.lm_head_site.w, Int4Weight)
    torch.testing.assert_close(llm.prompt_logits(ids).cpu(), want, atol=1e-4, rtol=1e-4)
    for site, fn in ((layer.mlp.down.site, int8_linear_triton), (layer.attn.qkv_proj.site, int4_linear_triton)):
        chosen = site.chosen()
        assert chosen and all(f is fn for f in chosen.values()), chosen
