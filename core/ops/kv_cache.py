"""Writing new keys and values into the paged KV cache: ``write_kv_cache``.

Cache layout (shared with :mod:`engine.core.ops.attention`): ``key_cache`` and ``value_cache`` are
[num_blocks, block_size, Hk, D], contiguous. Token t goes to slot ``slot_mapping[t]`` =
``block * block_size + offset``, i.e. ``cache[block, offset]``; a negative slot marks a padding
token that is not written. Slots of the real tokens are distinct.
"""

from __future__ import annotations

import torch

from .inputs import randint, randn
from .precision import REF_DTYPES
from .registry import Case, OpDef, Tolerance
from .shapes import HEADS, MAX_ROWS, elements, fit, log_int

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(key, value, key_cache, value_cache, slot_mapping) -> None:
    for name, t in (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache),
                    ("slot_mapping", slot_mapping)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"write_kv_cache: {name} must be a tensor, got {type(t).__name__}")
    if key.dtype not in REF_DTYPES or {value.dtype, key_cache.dtype, value_cache.dtype} != {key.dtype}:
        raise TypeError("write_kv_cache: key, value, key_cache and value_cache must share one dtype of "
                        f"{_DTYPES}; got {key.dtype}, {value.dtype}, {key_cache.dtype}, {value_cache.dtype}")
    if slot_mapping.dtype != torch.int64 or slot_mapping.dim() != 1:
        raise TypeError(f"write_kv_cache: slot_mapping must be 1-D int64 [T], got {slot_mapping.dtype} "
                        f"{tuple(slot_mapping.shape)}")
    if key.dim() != 3 or value.shape != key.shape or key.shape[0] != slot_mapping.shape[0]:
        raise ValueError("write_kv_cache: key and value must both be [T, Hk, D] with T = len(slot_mapping) "
                         f"= {slot_mapping.shape[0]}; got {tuple(key.shape)} and {tuple(value.shape)}")
    if key_cache.dim() != 4 or value_cache.shape != key_cache.shape or key_cache.shape[2:] != key.shape[1:]:
        raise ValueError("write_kv_cache: caches must both be [num_blocks, block_size, Hk, D] matching key's "
                         f"[Hk, D] = {tuple(key.shape[1:])}; got {tuple(key_cache.shape)} and "
                         f"{tuple(value_cache.shape)}")
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("write_kv_cache: key_cache and value_cache must be contiguous")


def _write_kv_cache_ref(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Scatter key[t], value[t] to cache slot slot_mapping[t] in place, skipping negative slots."""
    _check(key, value, key_cache, value_cache, slot_mapping)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    n = key_cache.shape[0] * key_cache.shape[1]
    key_cache.view(n, *key_cache.shape[2:])[slots] = key[keep]
    value_cache.view(n, *value_cache.shape[2:])[slots] = value[keep]


def _write_kv_cache_fake(key, value, key_cache, value_cache, slot_mapping) -> None:
    _check(key, value, key_cache, value_cache, slot_mapping)


def _write_kv_cache_inputs(p, dtype, device, gen):
    t, hk, d, bs, nb = p["tokens"], p["hk"], p["head_dim"], p["block_size"], p["num_blocks"]
    slots = torch.randperm(nb * bs, generator=gen)[:t]
    n_pad = p.get("padding", 0)
    if n_pad:
        slots[randint(0, t, (n_pad,), "cpu", gen)] = -1  # a few padding tokens (may coincide)
    key = randn((t, hk, d), dtype, device, gen)
    value = randn((t, hk, d), dtype, device, gen)
    key_cache = randn((nb, bs, hk, d), dtype, device, gen)
    value_cache = randn((nb, bs, hk, d), dtype, device, gen)
    return key, value, key_cache, value_cache, slots.to(device)


def draw_writes(rng, budget, **extra):
    """one token, a decode batch, a prefill chunk (to 4096 tokens) with padding slots; real KV head shapes."""
    cap = elements(budget)

    def case(name, tokens, padding=0):
        hq, hk, d = rng.choice(HEADS)
        tokens = fit(tokens, 4 * hk * d, cap)
        bs = rng.choice((16, 16, 32))
        return Case(name, {"tokens": tokens, "hq": hq, "hk": hk, "head_dim": d, "block_size": bs,
                           "num_blocks": tokens // bs + rng.randint(1, 4), "padding": min(padding, tokens),
                           **extra}, engine_shape=True)
    return [case("draw_one", 1), case("draw_decode", log_int(rng, 2, 64), rng.randint(0, 3)),
            case("draw_prefill", log_int(rng, 65, MAX_ROWS), rng.randint(1, 8))]


write_kv_cache = OpDef(
    name="write_kv_cache",
    schema="(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
           "Tensor slot_mapping) -> ()",
    reference=_write_kv_cache_ref,
    fake=_write_kv_cache_fake,
    make_inputs=_write_kv_cache_inputs,
    draw=draw_writes,
    cases=[
        Case("smollm_bs16", {"tokens": 9, "hk": 3, "head_dim": 64, "block_size": 16, "num_blocks": 6}),
        Case("padded_bs16", {"tokens": 12, "hk": 3, "head_dim": 64, "block_size": 16, "num_blocks": 4,
                             "padding": 4}),
        Case("d128_bs32", {"tokens": 40, "hk": 2, "head_dim": 128, "block_size": 32, "num_blocks": 5,
                           "padding": 2}),
        Case("single_token", {"tokens": 1, "hk": 8, "head_dim": 128, "block_size": 16, "num_blocks": 3}),
    ],
    rounded_outputs=True,
    tolerances={dt: Tolerance(0.0, 0.0) for dt in _DTYPES},  # a copy: exact
    mutates=(2, 3),
    doc="key, value [T, Hk, D]; key_cache, value_cache [num_blocks, block_size, Hk, D] (same dtype, "
        "contiguous), written in place; slot_mapping int64 [T]: token t goes to "
        "cache[slot // block_size, slot % block_size], slot < 0 skips the token (padding). Other slots are "
        "left untouched. Returns nothing.",
)
