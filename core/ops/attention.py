"""Paged attention over the KV cache: ``paged_attention_decode`` and ``paged_attention_prefill``.

Cache layout (written by :mod:`engine.core.ops.kv_cache`): ``key_cache``, ``value_cache`` are
[num_blocks, block_size, Hk, D]. Sequence b's token at position l lives in
``cache[block_tables[b, l // block_size], l % block_size]``. ``block_tables`` is int32
[B, max_blocks]; entries past ``ceil(seq_lens[b] / block_size)`` are unused, may hold any value
and must not be read. ``seq_lens`` int32 [B] counts every cached token of sequence b (>= 1),
including the new ones. GQA: query head h reads KV head ``h // (Hq // Hk)``. Scores are
``scale * q . k`` and the softmax is taken in fp32; the output has q's dtype.
"""

from __future__ import annotations

import math

import torch

from .inputs import randint, randn
from .precision import REF_DTYPES, acc
from .registry import Case, OpDef, Tolerance
from .shapes import HEADS, fit, log_int, special_rows

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TOL = {
    torch.float32: Tolerance(2e-5, 2e-5),
    torch.bfloat16: Tolerance(1e-2, 1e-2),
    torch.float16: Tolerance(2e-3, 2e-3),
}


def gather_paged(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size, ...] x [B, max_blocks] -> [B, max_blocks * block_size, ...].

    Unused table entries are clamped into range; the caller masks the positions they cover.
    """
    bt = block_tables.long().clamp(0, cache.shape[0] - 1)
    return cache[bt].flatten(1, 2)


def paged_decode_core(q, key_cache, value_cache, block_tables, seq_lens, scale):
    """fp32 math for one query per sequence. q [B, Hq, D]; caches [N, bs, Hk, D|Dv] -> [B, Hq, Dv].

    Works without reading any value back to the host (safe under CUDA-graph capture).
    """
    b, hq, d = q.shape
    k = acc(gather_paged(key_cache, block_tables))  # [B, L, Hk, D]
    v = acc(gather_paged(value_cache, block_tables))
    hk = k.shape[2]
    s = torch.einsum("bhgd,blhd->bhgl", acc(q).view(b, hk, hq // hk, d), k) * scale
    valid = torch.arange(k.shape[1], device=q.device)[None, :] < seq_lens.long()[:, None]  # [B, L]
    p = s.masked_fill(~valid[:, None, None, :], float("-inf")).softmax(-1)
    # Slots past seq_len hold whatever the cache held (NaN bit patterns included): 0 * NaN is NaN, so zero them.
    v = torch.where(valid[:, :, None, None], v, 0.0)
    return torch.einsum("bhgl,blhd->bhgd", p, v).reshape(b, hq, v.shape[-1]).to(q.dtype)


def _tensors(op, **named):
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")


def _check_common(op, q, key_cache, value_cache, block_tables, seq_lens):
    _tensors(op, q=q, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables,
             seq_lens=seq_lens)
    if q.dtype not in REF_DTYPES or key_cache.dtype != q.dtype or value_cache.dtype != q.dtype:
        raise TypeError(f"{op}: q, key_cache and value_cache must share one dtype of {_DTYPES}; got "
                        f"{q.dtype}, {key_cache.dtype}, {value_cache.dtype}")
    if q.dim() != 3 or key_cache.dim() != 4 or value_cache.shape != key_cache.shape:
        raise ValueError(f"{op}: q must be [*, Hq, D] and both caches [num_blocks, block_size, Hk, D]; got "
                         f"{tuple(q.shape)}, {tuple(key_cache.shape)}, {tuple(value_cache.shape)}")
    hq, d, hk = q.shape[1], q.shape[2], key_cache.shape[2]
    if key_cache.shape[3] != d or hq % hk:
        raise ValueError(f"{op}: need cache head_dim == q head_dim ({key_cache.shape[3]} vs {d}) and "
                         f"Hq ({hq}) a multiple of Hk ({hk})")
    for name, t, dim in (("block_tables", block_tables, 2), ("seq_lens", seq_lens, 1)):
        if t.dtype != torch.int32 or t.dim() != dim:
            raise TypeError(f"{op}: {name} must be a {dim}-D int32 tensor, got {t.dtype} {tuple(t.shape)}")
    if seq_lens.shape[0] != block_tables.shape[0]:
        raise ValueError(f"{op}: seq_lens [B] and block_tables [B, max_blocks] disagree on B: "
                         f"{tuple(seq_lens.shape)} vs {tuple(block_tables.shape)}")


def _check_decode(q, key_cache, value_cache, block_tables, seq_lens):
    _check_common("paged_attention_decode", q, key_cache, value_cache, block_tables, seq_lens)
    if q.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"paged_attention_decode: q has {q.shape[0]} rows but there are {seq_lens.shape[0]} "
                         "sequences; decode takes exactly one query per sequence")


def _decode_ref(q, key_cache, value_cache, block_tables, seq_lens, scale):
    """One new query per sequence attends to all seq_lens[b] cached tokens. Returns [B, Hq, D]."""
    _check_decode(q, key_cache, value_cache, block_tables, seq_lens)
    return paged_decode_core(q, key_cache, value_cache, block_tables, seq_lens, scale)


def _decode_fake(q, key_cache, value_cache, block_tables, seq_lens, scale):
    _check_decode(q, key_cache, value_cache, block_tables, seq_lens)
    return torch.empty_like(q)


def _check_prefill(q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens):
    op = "paged_attention_prefill"
    _check_common(op, q, key_cache, value_cache, block_tables, seq_lens)
    _tensors(op, cu_seqlens_q=cu_seqlens_q)
    if cu_seqlens_q.dtype != torch.int32 or cu_seqlens_q.shape != (seq_lens.shape[0] + 1,):
        raise TypeError(f"{op}: cu_seqlens_q must be int32 [B+1] = [{seq_lens.shape[0] + 1}], got "
                        f"{cu_seqlens_q.dtype} {tuple(cu_seqlens_q.shape)}")


def _prefill_ref(q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, scale):
    """Causal attention of each sequence's last q_len tokens over its whole cached context.

    Loops over sequences on the host (reads cu_seqlens_q and seq_lens back); fp32 math.
    """
    _check_prefill(q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens)
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    if cu[0] != 0 or cu[-1] != q.shape[0]:
        raise ValueError(f"paged_attention_prefill: cu_seqlens_q must run from 0 to T={q.shape[0]}, got {cu}")
    bs, hk, d = key_cache.shape[1:]
    hq = q.shape[1]
    out = torch.empty_like(q)
    for b, n_kv in enumerate(lens):
        start, n_q = cu[b], cu[b + 1] - cu[b]
        if n_q == 0:
            continue
        if not 0 < n_q <= n_kv <= block_tables.shape[1] * bs:
            raise ValueError(f"paged_attention_prefill: sequence {b} has {n_q} queries and seq_len {n_kv}; "
                             f"need 1 <= q_len <= seq_len <= max_blocks*block_size = "
                             f"{block_tables.shape[1] * bs}")
        blocks = block_tables[b, : math.ceil(n_kv / bs)].long()
        k = acc(key_cache[blocks].flatten(0, 1)[:n_kv])  # [L, Hk, D]
        v = acc(value_cache[blocks].flatten(0, 1)[:n_kv])
        qb = acc(q[start: start + n_q]).view(n_q, hk, hq // hk, d)
        s = torch.einsum("thgd,lhd->hgtl", qb, k) * scale
        q_pos = torch.arange(n_kv - n_q, n_kv, device=q.device)
        future = torch.arange(n_kv, device=q.device)[None, :] > q_pos[:, None]  # [q_len, L]
        p = s.masked_fill(future, float("-inf")).softmax(-1)
        out[start: start + n_q] = torch.einsum("hgtl,lhd->thgd", p, v).reshape(n_q, hq, d).to(q.dtype)
    return out


def _prefill_fake(q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, scale):
    _check_prefill(q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens)
    return torch.empty_like(q)


def make_paged_layout(seq_lens: list[int], block_size: int, gen: torch.Generator, spare_blocks: int = 3,
                      spare_columns: int = 1, shared_blocks: int = 0, gaps: bool = False) -> tuple[torch.Tensor, int]:
    """A shuffled int32 block table [B, max_blocks] for ``seq_lens`` and the number of blocks it needs.

    Each sequence gets distinct blocks in random order; unused table entries point at random blocks
    (some of them other sequences' or spare ones), so a kernel that reads past seq_len reads garbage.
    ``shared_blocks``: every sequence's first blocks are sequence 0's (a shared prompt prefix, as prefix caching
    makes them). ``gaps``: some unused entries hold -1 or an index past the cache (the contract lets them hold any
    value), so a kernel that dereferences them reads out of bounds."""
    need = [math.ceil(n / block_size) for n in seq_lens]
    shared = min([shared_blocks, *need]) if shared_blocks else 0
    num_blocks = need[0] + sum(n - shared for n in need[1:]) + spare_blocks
    width = max(need) + spare_columns
    perm = torch.randperm(num_blocks, generator=gen)
    table = randint(0, num_blocks, (len(seq_lens), width), "cpu", gen)
    used = 0
    for b, n in enumerate(need):
        own = n if b == 0 else n - shared
        if b > 0 and shared:
            table[b, :shared] = table[0, :shared]
        table[b, n - own:n] = perm[used: used + own]
        used += own
    if gaps:
        unused = torch.arange(width)[None, :] >= torch.tensor(need)[:, None]
        wild = torch.where(torch.rand(table.shape, generator=gen) < 0.5, -1, num_blocks + 7)
        table = torch.where(unused, wild, table)
    return table.to(torch.int32), num_blocks


def random_seq_lens(batch: int, max_len: int, block_size: int, gen: torch.Generator, min_len: int = 1) -> list[int]:
    """Random lengths in [min_len, max_len]; the first is forced off a block_size multiple."""
    lens = randint(min_len, max_len + 1, (batch,), "cpu", gen).tolist()
    if lens[0] % block_size == 0:
        lens[0] -= 1 if lens[0] > 1 else -1
    return lens


def _paged_kv(p, lens, dtype, device, gen):
    bt, nb = make_paged_layout(lens, p["block_size"], gen, shared_blocks=p.get("shared_blocks", 0),
                               gaps=p.get("gaps", False))
    shape = (nb, p["block_size"], p["hk"], p["head_dim"])
    return randn(shape, dtype, device, gen), randn(shape, dtype, device, gen), bt.to(device)


def _decode_inputs(p, dtype, device, gen):
    lens = random_seq_lens(p["batch"], p["max_len"], p["block_size"], gen, p.get("min_len", 1))
    kc, vc, bt = _paged_kv(p, lens, dtype, device, gen)
    q = _queries((p["batch"], p["hq"], p["head_dim"]), p, dtype, device, gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, kc, vc, bt, seq_lens, p["head_dim"] ** -0.5


def _prefill_inputs(p, dtype, device, gen):
    """q_mode "full": q_len = seq_len (plain prefill); "partial": 1 <= q_len <= seq_len (chunked prefill or a
    prefix-cache hit; at most ``max_q``); "mixed": alternate, starting with full; "one": one query per sequence."""
    lens = random_seq_lens(p["batch"], p["max_len"], p["block_size"], gen, p.get("min_len", 1))
    mode = p.get("q_mode", "mixed")
    q_lens = []
    for b, n in enumerate(lens):
        full = mode == "full" or (mode == "mixed" and b % 2 == 0)
        q_lens.append(1 if mode == "one" else n if full else int(randint(1, min(n, p.get("max_q", n)) + 1, (1,),
                                                                                "cpu", gen)))
    kc, vc, bt = _paged_kv(p, lens, dtype, device, gen)
    q = _queries((sum(q_lens), p["hq"], p["head_dim"]), p, dtype, device, gen)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, kc, vc, bt, cu, seq_lens, p["head_dim"] ** -0.5


def _queries(shape, p, dtype, device, gen):
    """Queries; with ``special`` the first (token, head) rows are zero, tiny and 50x (scores of several hundred:
    a softmax without its running maximum overflows exp)."""
    q = randn(shape, dtype, "cpu", gen)
    return (special_rows(q, huge=50.0) if p.get("special") else q).to(device)


def _shape(batch, hq, hk, d, bs, max_len, **extra):
    return {"batch": batch, "hq": hq, "hk": hk, "head_dim": d, "block_size": bs, "max_len": max_len, **extra}


def _drawn_case(rng, budget, name, batch, max_len, min_len=1, queries=1, **extra) -> Case:
    """A drawn attention case: a real model's head shape and block size, ``max_len`` cut so that the case's work
    (``queries`` per sequence, each reading every key) fits the budget."""
    hq, hk, d = rng.choice(HEADS)
    max_len = fit(max_len, batch * queries * (hq + hk) * d, budget >> 2, min_len)
    return Case(name, {"batch": batch, "hq": hq, "hk": hk, "head_dim": d, "block_size": rng.choice((16, 16, 32)),
                       "max_len": max_len, "min_len": min(min_len, max_len), **extra}, engine_shape=True)


def _draw_decode(rng, budget):
    """single (one sequence, up to 2048 keys), batch (2-64 sequences), long (past 4096 keys), shared (a common prefix
    of blocks, unused table entries of -1 and past the cache) and special (zero, tiny and huge query rows, and
    sequences of one key)."""
    return [_drawn_case(rng, budget, "draw_single", 1, log_int(rng, 1, 2048)),
            _drawn_case(rng, budget, "draw_batch", log_int(rng, 2, 64), log_int(rng, 16, 1024)),
            _drawn_case(rng, budget, "draw_long", 1, log_int(rng, 4097, 16384), 4097),
            _drawn_case(rng, budget, "draw_shared", log_int(rng, 3, 8), log_int(rng, 64, 512), 64,
                        shared_blocks=rng.randint(1, 3), gaps=True),
            _drawn_case(rng, budget, "draw_special", log_int(rng, 3, 16), log_int(rng, 1, 300), special=True)]


def _draw_prefill(rng, budget):
    """full (whole prompts), chunk (a chunk of queries over a context past 4096 keys), shared (prefix-cache hits on
    shared blocks, gaps in the table), one (one query per sequence) and special (zero, tiny and huge queries)."""
    chunk, full = log_int(rng, 16, 256), log_int(rng, 32, 512)
    shared, special = log_int(rng, 64, 384), log_int(rng, 16, 200)
    return [_drawn_case(rng, budget, "draw_full", log_int(rng, 1, 4), full, queries=full, q_mode="full"),
            _drawn_case(rng, budget, "draw_chunk", 1, log_int(rng, 4097, 8192), 4097, queries=chunk,
                        q_mode="partial", max_q=chunk),
            _drawn_case(rng, budget, "draw_shared", log_int(rng, 2, 6), shared, 64, queries=shared, q_mode="mixed",
                        shared_blocks=rng.randint(1, 3), gaps=True),
            _drawn_case(rng, budget, "draw_one", log_int(rng, 2, 16), log_int(rng, 1, 1024), q_mode="one"),
            _drawn_case(rng, budget, "draw_special", log_int(rng, 1, 3), special, queries=special, q_mode="mixed",
                        special=True)]


_DECODE_CASES = [
    Case("smollm_bs16", _shape(4, 9, 3, 64, 16, 80)),
    Case("mha_d128_bs32", _shape(3, 4, 4, 128, 32, 100)),
    Case("gqa3_d128_bs16", _shape(5, 6, 2, 128, 16, 60)),
    Case("short_bs32", _shape(6, 9, 3, 64, 32, 10)),
]

paged_attention_decode = OpDef(
    name="paged_attention_decode",
    schema="(Tensor q, Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor seq_lens, "
           "float scale) -> Tensor",
    reference=_decode_ref,
    fake=_decode_fake,
    make_inputs=_decode_inputs,
    cases=_DECODE_CASES,
    draw=_draw_decode,
    error_scale=lambda q, key_cache, value_cache, *rest: value_cache.abs().amax().item(),
    tolerances=_TOL,
    doc="q [B, Hq, D]: one new query per sequence (its K/V already in the cache); key_cache, value_cache "
        "[num_blocks, block_size, Hk, D]; block_tables int32 [B, max_blocks]; seq_lens int32 [B] (>= 1). "
        "out[b, h] = softmax(scale * q[b, h] . K_b^T) V_b over the seq_lens[b] cached tokens of b, KV head "
        "h // (Hq/Hk); fp32 softmax; returns [B, Hq, D] in q.dtype.",
)

paged_attention_prefill = OpDef(
    name="paged_attention_prefill",
    schema="(Tensor q, Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor cu_seqlens_q, "
           "Tensor seq_lens, float scale) -> Tensor",
    reference=_prefill_ref,
    fake=_prefill_fake,
    make_inputs=_prefill_inputs,
    cases=[
        Case("smollm_mixed_bs16", _shape(4, 9, 3, 64, 16, 70)),
        Case("mha_d128_bs32_partial", _shape(3, 4, 4, 128, 32, 90, q_mode="partial")),
        Case("gqa3_d128_bs16_mixed", _shape(3, 6, 2, 128, 16, 50)),
        Case("single_full_bs32", _shape(1, 9, 3, 64, 32, 77, q_mode="full")),
    ],
    draw=_draw_prefill,
    error_scale=lambda q, key_cache, value_cache, *rest: value_cache.abs().amax().item(),
    tolerances=_TOL,
    doc="q [T, Hq, D]: the new tokens of B sequences packed, sequence b owning rows cu_seqlens_q[b] to "
        "cu_seqlens_q[b+1] (int32 [B+1]); they are the LAST q_len_b of its seq_lens[b] tokens (int32 [B]), "
        "whose K/V are all in the paged cache already (prefix-cache hits and earlier chunks included). Query "
        "i of b sits at position seq_lens[b] - q_len_b + i and attends causally to cache positions <= it; "
        "caches and block_tables as for paged_attention_decode; fp32 softmax; [T, Hq, D] in q.dtype.",
)
