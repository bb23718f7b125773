"""GGUF files with K-quant matrices (the mix a Q4_K_M file holds: Q4_K, with Q6_K for attn_v, ffn_down and the output
head, and Q5_K here and there) load kept in their super-blocks and run through the platform's kernels: prompt logits
match transformers' on the same file (which dequantizes with gguf-py), and greedy decoding runs on them."""

from __future__ import annotations

import gguf
import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.models.weights import QuantizedWeight
from tests.core.loader.builders import byte_level_gguf_tokenizer, write_gguf

transformers = pytest.importorskip("transformers")
Q = gguf.GGMLQuantizationType
MIX = {"v_proj": Q.Q6_K, "down_proj": Q.Q6_K, "lm_head": Q.Q6_K, "layers.1.mlp.up_proj": Q.Q5_K,
       "k_proj": Q.Q5_K}


def _type(name: str, a) -> int:
    return next((q for key, q in MIX.items() if key in name), Q.Q4_K)


@pytest.fixture(scope="module")
def kquant_gguf(tmp_path_factory):
    transformers.logging.set_verbosity_error()
    tok = byte_level_gguf_tokenizer("gpt-2")
    cfg = transformers.LlamaConfig(vocab_size=len(tok["tokens"]), hidden_size=256, intermediate_size=512,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("kquants") / "m.gguf"
    write_gguf(path, "llama", transformers.LlamaForCausalLM(cfg).state_dict(), cfg, tokenizer=tok, qtype=_type)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    return path, hf


def test_kquants_stay_quantized_and_match_transformers(kquant_gguf, caplog):
    path, hf = kquant_gguf
    with caplog.at_level("WARNING", logger="engine"):
        llm = LLM(str(path), dtype="float32", num_kv_blocks=32, block_size=16)
    assert "expanded" not in caplog.text and "plain-torch reference" not in caplog.text, caplog.text
    layer = llm.model.layers[1]
    kinds = {n: (w.qtype if isinstance(w, QuantizedWeight) else None) for n, w in (
        ("o", layer.attn.o), ("down", layer.mlp.down.w), ("head", llm.model.lm_head),
        ("embed", llm.model.embed_tokens))}
    assert kinds == {"o": Q.Q4_K, "down": Q.Q6_K, "head": Q.Q6_K, "embed": Q.Q4_K}, kinds
    gen = torch.Generator().manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
    for n in (1, 9, 70):  # a decode row, a small batch, a prefill above the CPU kernels' 64-row switch
        ids = torch.randint(0, hf.config.vocab_size, (n,), generator=gen).tolist()
        with torch.no_grad():
            theirs = hf(torch.tensor([ids])).logits[0].float()
        ours = llm.prompt_logits(ids).cpu()
        torch.testing.assert_close(ours, theirs, atol=1e-3 * theirs.abs().max().item(), rtol=1e-4)
    out = llm.generate([ids[:5]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 8
