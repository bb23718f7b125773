"""DeepSeek multi-head latent attention (MLA), absorbed decode: ``mla_decode``.

With the up-projections absorbed into the query and output, every head attends to one shared
latent cache: ``kv_cache`` is [num_pages, page_size, Dqk] where Dqk = kv_lora_rank + rope_dim
(512 + 64 for DeepSeek-V2/V3), the same last dim as ``q`` [B, H, Dqk]. Scores use all Dqk
channels; values are the first ``v_dim`` (= kv_lora_rank) channels of the same cache rows.
Paging as in :mod:`engine.core.ops.attention`: token l of sequence b is
``kv_cache[block_tables[b, l // page_size], l % page_size]``; unused table entries are not read.
"""

from __future__ import annotations

import torch

from .attention import make_paged_layout, paged_decode_core, random_seq_lens
from .inputs import randn
from .registry import Case, OpDef, Tolerance
from .shapes import fit, log_int

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(q, kv_cache, block_tables, seq_lens, v_dim):
    for name, t in (("q", q), ("kv_cache", kv_cache), ("block_tables", block_tables), ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"mla_decode: {name} must be a tensor, got {type(t).__name__}")
    if q.dtype not in (*_DTYPES, torch.float64) or kv_cache.dtype != q.dtype:
        raise TypeError(f"mla_decode: q and kv_cache must share one dtype of {_DTYPES}; got {q.dtype}, "
                        f"{kv_cache.dtype}")
    if q.dim() != 3 or kv_cache.dim() != 3 or kv_cache.shape[2] != q.shape[2]:
        raise ValueError("mla_decode: q must be [B, H, Dqk] and kv_cache [num_pages, page_size, Dqk] with "
                         f"the same Dqk; got {tuple(q.shape)} and {tuple(kv_cache.shape)}")
    if not 0 < v_dim <= q.shape[2]:
        raise ValueError(f"mla_decode: v_dim must be in (0, Dqk={q.shape[2]}], got {v_dim}")
    for name, t, dim in (("block_tables", block_tables, 2), ("seq_lens", seq_lens, 1)):
        if t.dtype != torch.int32 or t.dim() != dim:
            raise TypeError(f"mla_decode: {name} must be a {dim}-D int32 tensor, got {t.dtype} "
                            f"{tuple(t.shape)}")
    if not q.shape[0] == seq_lens.shape[0] == block_tables.shape[0]:
        raise ValueError("mla_decode: q [B, H, Dqk], block_tables [B, max_pages] and seq_lens [B] disagree "
                         f"on B: {tuple(q.shape)}, {tuple(block_tables.shape)}, {tuple(seq_lens.shape)}")


def _mla_decode_ref(q, kv_cache, block_tables, seq_lens, scale, v_dim=512):
    """out[b, h] = softmax(scale * q[b, h] . kv_b^T) @ kv_b[:, :v_dim]; fp32 math; [B, H, v_dim], q.dtype."""
    _check(q, kv_cache, block_tables, seq_lens, v_dim)
    kv = kv_cache.unsqueeze(2)  # one shared KV head
    return paged_decode_core(q, kv, kv[..., :v_dim], block_tables, seq_lens, scale)


def _mla_decode_fake(q, kv_cache, block_tables, seq_lens, scale, v_dim=512):
    _check(q, kv_cache, block_tables, seq_lens, v_dim)
    return q.new_empty((q.shape[0], q.shape[1], v_dim))


def _mla_decode_inputs(p, dtype, device, gen):
    d_qk = p.get("kv_lora_rank", 512) + p.get("rope_dim", 64)
    lens = random_seq_lens(p["batch"], p["max_len"], p["page_size"], gen, p.get("min_len", 1))
    bt, num_pages = make_paged_layout(lens, p["page_size"], gen)
    kv_cache = randn((num_pages, p["page_size"], d_qk), dtype, device, gen)
    q = randn((p["batch"], p["heads"], d_qk), dtype, device, gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    # DeepSeek's softmax scale is 1/sqrt(qk_nope + qk_rope = 192), not 1/sqrt(Dqk).
    return q, kv_cache, bt.to(device), seq_lens, p.get("scale", 192 ** -0.5), p.get("kv_lora_rank", 512)


def _draw(rng, budget):
    """DeepSeek-V3's latent (512 + 64) with 16 or 128 heads (TP shards): one sequence, a batch, a context past 4096
    rows, pages of 1, 16 and 64."""
    def case(name, batch, max_len, min_len=1):
        heads = rng.choice((16, 128))
        max_len = fit(max_len, batch * (heads + 1) * 576, budget >> 1, min_len)
        return Case(name, {"batch": batch, "heads": heads, "page_size": rng.choice((1, 16, 64)), "max_len": max_len,
                           "min_len": min(min_len, max_len)}, engine_shape=True)
    return [case("draw_single", 1, log_int(rng, 1, 2048)), case("draw_batch", log_int(rng, 2, 64),
                                                                log_int(rng, 16, 1024)),
            case("draw_long", 1, log_int(rng, 4097, 8192), 4097)]


mla_decode = OpDef(
    name="mla_decode",
    error_scale=lambda q, kv_cache, *rest: kv_cache.abs().amax().item(),
    schema="(Tensor q, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, float scale, int v_dim=512)"
           " -> Tensor",
    reference=_mla_decode_ref,
    fake=_mla_decode_fake,
    make_inputs=_mla_decode_inputs,
    draw=_draw,
    cases=[
        Case("deepseek_p16", {"batch": 3, "heads": 16, "page_size": 16, "max_len": 70}),
        Case("deepseek_p64", {"batch": 2, "heads": 8, "page_size": 64, "max_len": 150}),
        Case("page1", {"batch": 3, "heads": 4, "page_size": 1, "max_len": 20}),
        Case("small_latent", {"batch": 4, "heads": 8, "page_size": 16, "max_len": 40, "kv_lora_rank": 128,
                              "rope_dim": 32, "scale": 160 ** -0.5}),
    ],
    tolerances={torch.float32: Tolerance(2e-5, 2e-5), torch.bfloat16: Tolerance(1e-2, 1e-2),
                torch.float16: Tolerance(2e-3, 2e-3)},
    doc="q [B, H, Dqk] (latent then rope part); kv_cache [num_pages, page_size, Dqk] shared by all heads; "
        "block_tables int32 [B, max_pages]; seq_lens int32 [B] (>= 1). out[b, h] = softmax(scale * q[b, h] "
        ". kv_b^T) @ kv_b[:, :v_dim] over the seq_lens[b] cached rows of b; fp32 softmax; [B, H, v_dim] in "
        "q.dtype.",
)
