"""MoE GGUF files (Mixtral as llama, qwen2moe with its gated shared expert, qwen3moe), written from random HF models
with each layer's experts as one 3-D tensor per projection, as convert_hf_to_gguf.py writes them: the experts stay in
their blocks (fused_moe_gguf) and the logits match transformers' on the weights gguf-py decodes from the file."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine import LLM
from engine.core.loader import ModelLoadError, load_checkpoint
from engine.core.models.weights import QuantizedWeight
from tests.core.loader.builders import byte_level_gguf_tokenizer, write_gguf

transformers = pytest.importorskip("transformers")
Q = gguf.GGMLQuantizationType

# name: (GGUF arch, HF config, HF model, config extras, expert types: gate/up, down)
MODELS = {
    "mixtral": ("llama", "MixtralConfig", "MixtralForCausalLM", dict(intermediate_size=64, num_local_experts=4),
                (Q.Q4_0, Q.Q8_0)),
    "qwen2_moe": ("qwen2moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4,
        norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[]), (Q.Q4_1, Q.Q4_1)),
    "qwen3_moe": ("qwen3moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        intermediate_size=96, moe_intermediate_size=64, num_experts=4, head_dim=32, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[]), (Q.Q8_0, Q.Q4_0)),
}


def _build(tmp_path, name: str):
    arch, cfg_cls, model_cls, extra, (q13, q2) = MODELS[name]
    tok = byte_level_gguf_tokenizer("qwen2")
    cfg = getattr(transformers, cfg_cls)(vocab_size=len(tok["tokens"]), hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                         rms_norm_eps=1e-5, tie_word_embeddings=False, num_experts_per_tok=2, **extra)
    torch.manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
    hf = getattr(transformers, model_cls)(cfg).eval()
    sd = {k: v for k, v in hf.state_dict().items() if ".mlp.experts." not in k}
    experts = {}  # GGUF name -> (raw blocks, type); the model then gets what gguf-py decodes from them
    for i, layer in enumerate(hf.model.layers):
        ex = layer.mlp.experts
        inter = ex.down_proj.shape[-1]
        for part, w, q in (("gate", ex.gate_up_proj[:, :inter], q13), ("up", ex.gate_up_proj[:, inter:], q13),
                           ("down", ex.down_proj, q2)):
            raw = gguf.quants.quantize(w.detach().float().contiguous().numpy(), q)
            experts[f"blk.{i}.ffn_{part}_exps.weight"] = (raw, q)
            decoded = torch.from_numpy(gguf.quants.dequantize(raw, q)).reshape(w.shape)
            with torch.no_grad():
                w.copy_(decoded)

    def add_moe(writer):
        writer.add_expert_count(cfg.num_local_experts if name == "mixtral" else cfg.num_experts)
        writer.add_expert_used_count(2)
        for tensor_name, (raw, q) in experts.items():
            writer.add_tensor(tensor_name, raw, raw_dtype=q)

    path = write_gguf(tmp_path / f"{name}.gguf", arch, sd, cfg, tokenizer=tok, extra=add_moe)
    return hf, path, len(tok["tokens"])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_moe_gguf_keeps_experts_in_blocks_and_matches_transformers(tmp_path, name):
    hf, path, vocab = _build(tmp_path, name)
    ck = load_checkpoint(path)
    q13, q2 = MODELS[name][4]
    assert ck.config.arch == name and ck.config.num_experts == 4 and ck.config.num_experts_per_tok == 2
    w = ck.weights["model.layers.1.block_sparse_moe.experts.3.w2.weight" if name == "mixtral" else
                   "model.layers.1.mlp.experts.3.down_proj.weight"]
    assert isinstance(w, QuantizedWeight) and w.qtype == q2 and w.shape == (64, ck.config.moe_intermediate_size)
    llm = LLM(str(path), dtype="float32", num_kv_blocks=32, block_size=16)
    experts = llm.model.layers[0].mlp.experts
    assert experts.gguf and (experts.w13_qtype, experts.w2_qtype) == (q13, q2)
    gen = torch.Generator().manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
    ids = torch.randint(0, vocab, (19,), generator=gen).tolist()
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(llm.prompt_logits(ids).cpu(), theirs, atol=1e-4, rtol=1e-4)


def test_per_expert_tensors_of_old_files_are_refused(tmp_path):
    tok = byte_level_gguf_tokenizer("qwen2")
    cfg = transformers.LlamaConfig(vocab_size=len(tok["tokens"]), hidden_size=64, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    sd = transformers.LlamaForCausalLM(cfg).state_dict()

    def old_layout(writer):
        writer.add_expert_count(2)
        writer.add_expert_used_count(1)
        writer.add_tensor("blk.0.ffn_gate.0.weight", np.zeros((64, 64), dtype=np.float32))

    path = write_gguf(tmp_path / "old.gguf", "llama", sd, cfg, tokenizer=tok, extra=old_layout)
    with pytest.raises(ModelLoadError, match="convert the model again"):
        load_checkpoint(path)
