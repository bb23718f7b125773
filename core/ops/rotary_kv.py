"""Rotary embedding and the KV-cache write as one op: ``rotary_write_kv``.

The attention block rotates q and k and then writes k and v to the paged cache; this op does both, so a platform
can do it in one launch (one read of k, no rotated k written and read back). Same contracts as
:mod:`engine.core.ops.rotary` and :mod:`engine.core.ops.kv_cache`; a platform without a kernel for it runs the
two ops (core/models/attention.py asks the registry).
"""

from __future__ import annotations

import torch

from .inputs import randint, randn
from .kv_cache import draw_writes, write_kv_cache
from .registry import Case, OpDef
from .rotary import build_cos_sin_cache, rotary_embedding


def _check(q, k, v, head_dim, q_out) -> None:
    for name, t in (("q", q), ("k", k), ("v", v), ("q_out", q_out)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[2] != head_dim:
            raise ValueError(f"rotary_write_kv: {name} must be a [T, H, head_dim={head_dim}] tensor, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if q_out.shape != q.shape or q_out.dtype != q.dtype:
        raise ValueError(f"rotary_write_kv: q_out must be shaped and typed like q {tuple(q.shape)} {q.dtype}, got "
                         f"{tuple(q_out.shape)} {q_out.dtype}")


def _ref(positions, q, k, v, cos_sin_cache, head_dim, is_neox, q_out, key_cache, value_cache, slot_mapping):
    """q_out = rotary(q); key_cache/value_cache[slot] = rotary(k), v (negative slots skipped)."""
    _check(q, k, v, head_dim, q_out)
    q_rot, k_rot = rotary_embedding.reference(positions, q, k, cos_sin_cache, head_dim, is_neox)
    q_out.copy_(q_rot)
    write_kv_cache.reference(k_rot, v, key_cache, value_cache, slot_mapping)


def _fake(positions, q, k, v, cos_sin_cache, head_dim, is_neox, q_out, key_cache, value_cache, slot_mapping):
    _check(q, k, v, head_dim, q_out)


def _inputs(p, dtype, device, gen):
    t, hq, hk, d, bs, nb = p["tokens"], p["hq"], p["hk"], p["head_dim"], p["block_size"], p["num_blocks"]
    rot, max_pos = p.get("rot_dim", d), 4096
    cache = build_cos_sin_cache(max_pos, rot, 10000.0, torch.float32, device=device)
    positions = randint(0, max_pos, (t,), device, gen)
    slots = torch.randperm(nb * bs, generator=gen)[:t]
    if p.get("padding"):
        slots[randint(0, t, (p["padding"],), "cpu", gen)] = -1
    q, k, v = (randn((t, h, d), dtype, device, gen) for h in (hq, hk, hk))
    q_out = randn((t, hq, d), dtype, device, gen)  # overwritten: its old values must not show through
    key_cache, value_cache = randn((nb, bs, hk, d), dtype, device, gen), randn((nb, bs, hk, d), dtype, device, gen)
    return positions, q, k, v, cache, d, p.get("is_neox", True), q_out, key_cache, value_cache, slots.to(device)


rotary_write_kv = OpDef(
    name="rotary_write_kv",
    schema="(Tensor positions, Tensor q, Tensor k, Tensor v, Tensor cos_sin_cache, int head_dim, bool is_neox, "
           "Tensor(a!) q_out, Tensor(b!) key_cache, Tensor(c!) value_cache, Tensor slot_mapping) -> ()",
    reference=_ref,
    fake=_fake,
    make_inputs=_inputs,
    draw=draw_writes,
    cases=[
        Case("llama_d128", {"tokens": 5, "hq": 8, "hk": 2, "head_dim": 128, "block_size": 16, "num_blocks": 4}),
        Case("smollm_padded", {"tokens": 9, "hq": 9, "hk": 3, "head_dim": 64, "block_size": 16, "num_blocks": 3,
                               "padding": 3}),
        Case("gptj_partial", {"tokens": 4, "hq": 4, "hk": 4, "head_dim": 64, "rot_dim": 32, "is_neox": False,
                              "block_size": 8, "num_blocks": 2}),
        Case("single_token", {"tokens": 1, "hq": 32, "hk": 8, "head_dim": 128, "block_size": 16, "num_blocks": 2}),
    ],
    rounded_outputs=True,
    tolerances=rotary_embedding.tolerances,
    mutates=(7, 8, 9),
    doc="positions int64 [T]; q [T, Hq, D], k and v [T, Hk, D] (any strides); cos_sin_cache as rotary_embedding's; "
        "q_out [T, Hq, D] like q; caches [num_blocks, block_size, Hk, D] contiguous; slot_mapping int64 [T]. "
        "Writes q_out = rotary(q) and cache[slot] = (rotary(k), v) in place (slot < 0 skips the token); returns "
        "nothing. Equal to rotary_embedding followed by write_kv_cache.",
)
