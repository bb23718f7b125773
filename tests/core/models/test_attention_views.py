"""SelfAttention hands q, k and v on as strided column slices of the fused qkv projection only where the kernels
chosen for those views are the ones chosen for contiguous copies (and not an op's reference): on the cpu platform
rotary and the KV write run as one kernel (rotary_write_kv) that reads strided token rows, so q, k and v stay views
(q and k are copied where q/k norm runs first: its rms_norm takes no strided 3-D x); a platform with kernels for
neither copies all three; the output equals the all-copies path in every case."""

from __future__ import annotations

import pytest
import torch

from engine.core.models.attention import SelfAttention
from engine.core.models.batch import ForwardBatch
from engine.core.models.config import ModelConfig
from engine.core.ops import registry as reg_mod
from engine.core.ops.registry import KernelRegistry
from engine.core.ops.rotary import build_cos_sin_cache
from engine.platforms.cpu.platform import CpuPlatform

H, HK, D, HIDDEN, BS = 4, 2, 32, 96, 4


def attention_layer(qk_norm: bool, gen, device="cpu") -> SelfAttention:
    cfg = ModelConfig(arch="qwen3" if qk_norm else "llama", vocab_size=64, hidden_size=HIDDEN, intermediate_size=64,
                      num_layers=1, num_heads=H, num_kv_heads=HK, head_dim=D, max_position=64, qk_norm=qk_norm)
    p = "model.layers.0.self_attn."
    shapes = {"q": (H * D, HIDDEN), "k": (HK * D, HIDDEN), "v": (HK * D, HIDDEN), "o": (HIDDEN, H * D)}
    w = {f"{p}{n}_proj.weight": (torch.randn(s, generator=gen) * 0.1).bfloat16() for n, s in shapes.items()}
    if qk_norm:
        w[p + "q_norm.weight"] = (1 + 0.1 * torch.randn(D, generator=gen)).bfloat16()
        w[p + "k_norm.weight"] = (1 + 0.1 * torch.randn(D, generator=gen)).bfloat16()
    w = {n: t.to(device) for n, t in w.items()}
    return SelfAttention(cfg, w, "model.layers.0.", build_cos_sin_cache(64, D, 10000.0, device=device))


def prefill_batch(t: int, device="cpu"):
    tables = torch.arange(4, dtype=torch.int32, device=device).view(1, 4)
    return ForwardBatch(positions=torch.arange(t, device=device), slot_mapping=torch.arange(t, device=device),
                        block_tables=tables, seq_lens=torch.tensor([t], dtype=torch.int32, device=device),
                        cu_seqlens_q=torch.tensor([0, t], dtype=torch.int32, device=device), is_decode=False,
                        logits_indices=torch.tensor([t - 1], device=device))


def run_attention(attn, registry, x, batch):
    """(output, (key_cache, value_cache), attn._plan's answer) of one prefill step through ``registry``."""
    kv = tuple(torch.zeros(4, BS, HK, D, dtype=torch.bfloat16, device=x.device) for _ in range(2))
    before = reg_mod._ACTIVE
    try:
        reg_mod.set_active_registry(registry)
        key = (x.shape[0], 1, 4, False)
        return attn(key, x, batch, kv), kv, attn._plan(key, *_qkv(attn, key, x), batch, kv)
    finally:
        reg_mod.set_active_registry(before)


def _qkv(attn, key, x):
    q, k, v = attn.qkv_proj(key, x).split(attn.qkv_split, dim=-1)
    return (y.view(x.shape[0], -1, D) for y in (q, k, v))


@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3"])
def test_views_where_the_kernels_take_them(qk_norm, gen):
    cpu = KernelRegistry("cpu")
    CpuPlatform().register_kernels(cpu)
    bare = KernelRegistry("bare")  # no kernels: every op runs its reference
    attn = attention_layer(qk_norm, gen)
    x, batch = torch.randn(7, HIDDEN, generator=gen).bfloat16(), prefill_batch(7)
    out_cpu, kv_cpu, views_cpu = run_attention(attn, cpu, x, batch)
    out_bare, kv_bare, views_bare = run_attention(attn, bare, x, batch)
    # the cpu's rms_norm takes no strided 3-D x: with q/k norm, q and k are copied too
    assert views_cpu == (True, not qk_norm, True)  # the fused rotary + KV write kernel, on views
    assert views_bare == (False, False, False)
    tol = dict(atol=2e-2, rtol=2e-2)  # native kernels against plain-torch references, bf16
    torch.testing.assert_close(out_cpu.float(), out_bare.float(), **tol)
    for a, b in zip(kv_cpu, kv_bare, strict=True):
        torch.testing.assert_close(a.float(), b.float(), **tol)
