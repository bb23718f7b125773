"""Tensor parallelism (core/models/tensor_parallel.py): the split of heads and intermediate size, GGUF weights sliced
in their blocks, and the built-in model on two real gloo ranks giving TP=1's logits and greedy tokens."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.core.models import tensor_parallel as tp
from engine.core.models.batch import ForwardBatch
from engine.core.models.config import ModelConfig
from engine.core.models.weights import QuantizedWeight
from engine.core.ops.gguf_quant import Q4_1, Q8_0, _gguf_dequantize_ref, _linear_inputs
from tests.core.serving.live_server import free_port

WORLD = 2
PROMPT = [1, 504, 3458, 282, 4237, 314, 1812, 30, 378, 2263, 282, 260, 3458, 2436, 17, 314]
STEPS = 12


def test_split_evenly_and_heads():
    assert tp.split_evenly(9, 2) == [(0, 5), (5, 9)]
    assert tp.split_evenly(1536, 2) == [(0, 768), (768, 1536)]
    # SmolLM2-135M: 9 query heads in 3 KV groups of 3
    assert tp.head_ranges(9, 3, 2) == [tp.HeadRange(0, 6, 0, 2), tp.HeadRange(6, 9, 2, 3)]
    assert tp.head_ranges(32, 8, 4)[3] == tp.HeadRange(24, 32, 6, 8)
    with pytest.raises(tp.TensorParallelError, match="at most 3"):
        tp.head_ranges(9, 3, 4)
    # vocabulary slices: equal (all-gather), the last cut at the end
    assert [tp.vocab_range(49152, r, 2) for r in range(2)] == [(0, 24576), (24576, 49152)]
    assert [tp.vocab_range(10, r, 3) for r in range(3)] == [(0, 4), (4, 8), (8, 10)]


@pytest.mark.parametrize("qtype", [Q4_1, Q8_0])
def test_gguf_columns_are_sliced_in_whole_blocks(qtype, gen):
    _, raw, q, k = _linear_inputs({"qtype": qtype, "m": 1, "n": 6, "k": 256}, torch.float32, "cpu", gen)
    w = QuantizedWeight(raw, q, 6, k)
    dense = _gguf_dequantize_ref(raw, q, k, torch.float32)
    for lo, hi in ((0, 64), (64, 256), (96, 160)):
        part = tp.shard_cols(w, lo, hi)
        assert (part.rows, part.cols) == (6, hi - lo) and part.raw.is_contiguous()
        assert torch.equal(_gguf_dequantize_ref(part.raw, q, hi - lo, torch.float32), dense[:, lo:hi])
    rows = tp.shard_rows(w, 2, 5)
    assert torch.equal(_gguf_dequantize_ref(rows.raw, q, k, torch.float32), dense[2:5])
    with pytest.raises(tp.TensorParallelError, match="32-value blocks"):
        tp.shard_cols(w, 16, 64)


def test_what_it_cannot_split_is_refused_with_the_way_out():
    cfg = ModelConfig("deepseek_v3", 32, 64, 128, 1, 4, 4, 16, 64, kv_lora_rank=16, qk_rope_head_dim=8)
    with pytest.raises(tp.TensorParallelError, match="tensor_parallel_size=1"):
        tp.shard_model(cfg, {}, 0, 2)
    with pytest.raises(tp.TensorParallelError, match="tensor_parallel_size=1"):
        tp.shard_rows(object(), 0, 1)


def _greedy(model, cfg, steps: int) -> tuple[list[torch.Tensor], list[int]]:
    """Prefill PROMPT, then ``steps`` greedy decode steps over a paged cache of 16-token blocks: the logits of each
    step and the tokens."""
    bs = 16
    blocks = -(-(len(PROMPT) + steps) // bs)
    kv = [tuple(torch.zeros(blocks, bs, cfg.num_kv_heads, cfg.head_dim) for _ in range(2))
          for _ in range(cfg.num_layers)]
    tables = torch.arange(blocks, dtype=torch.int32).view(1, -1)
    ids, pos, out_logits, tokens = PROMPT, 0, [], []
    while len(tokens) < steps:
        t = len(ids)
        batch = ForwardBatch(positions=torch.arange(pos, pos + t), slot_mapping=torch.arange(pos, pos + t),
                             block_tables=tables, seq_lens=torch.tensor([pos + t], dtype=torch.int32),
                             cu_seqlens_q=torch.tensor([0, t], dtype=torch.int32), is_decode=t == 1,
                             logits_indices=torch.tensor([t - 1]))
        hidden = model.forward(torch.tensor(ids), batch, kv)
        logits = model.logits(hidden[batch.logits_indices])[0]
        out_logits.append(logits)
        tokens.append(int(logits.argmax()))
        pos += t
        ids = [tokens[-1]]
    return out_logits, tokens


def _worker(rank: int, port: int) -> None:
    from engine.core.loader.checkpoint import load_checkpoint
    from engine.core.models.decoder import DecoderModel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    try:
        torch.set_num_threads(1)
        ck = load_checkpoint()
        cfg, weights = tp.shard_model(ck.config, ck.weights, rank, WORLD)
        assert (cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size) == ((6, 2, 768) if rank == 0 else (3, 1, 768))
        assert weights["model.embed_tokens.weight"].shape[0] == 24576  # the vocabulary's half (tied LM head)
        logits, tokens = _greedy(DecoderModel(cfg, weights, tensor_parallel=(rank, WORLD)), cfg, STEPS)
        if rank == 0:  # the whole model, in this process alone (its ops never all-reduce)
            want_logits, want_tokens = _greedy(DecoderModel(ck.config, ck.weights), ck.config, STEPS)
            assert tokens == want_tokens
            for got, want in zip(logits, want_logits, strict=True):
                torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-3)
    finally:
        dist.destroy_process_group()



def test_builtin_model_on_two_gloo_ranks_matches_one(default_model):
    mp.spawn(_worker, args=(free_port(),), nprocs=WORLD, join=True)
