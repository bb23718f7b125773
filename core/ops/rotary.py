"""Rotary position embedding (RoPE): the op ``rotary_embedding`` and ``build_cos_sin_cache``.

Layout: ``q`` is [T, Hq*D] (or any [T, ..., D]-shaped view whose per-token size is a multiple of
``head_dim``), ``k`` likewise with Hk heads. ``cos_sin_cache`` is [max_pos, rot_dim]: columns
``[:rot_dim/2]`` hold cos(pos * inv_freq), columns ``[rot_dim/2:]`` hold sin(pos * inv_freq).
Only the first ``rot_dim`` of each head's ``head_dim`` channels are rotated (partial rotary);
the rest pass through unchanged.

Pairing of the rotated channels, for frequency j in [0, rot_dim/2):
- neox (``is_neox=True``, HF Llama "rotate_half"): channels j and j + rot_dim/2;
- GPT-J (``is_neox=False``, interleaved): channels 2j and 2j+1.
Each pair (a, b) becomes (a*cos - b*sin, b*cos + a*sin).
"""

from __future__ import annotations

import math

import torch

from .inputs import randint, randn
from .precision import REF_DTYPES, acc
from .registry import Case, OpDef, Tolerance
from .shapes import HEADS, MAX_ROWS, elements, fit, log_int

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def build_cos_sin_cache(max_pos: int, rot_dim: int, base: float, dtype: torch.dtype = torch.float32,
                        scaling: dict | None = None, device=None) -> torch.Tensor:
    """The [max_pos, rot_dim] cos|sin table for ``rotary_embedding``, computed in float64.

    ``scaling`` follows HF ``rope_scaling`` (key ``rope_type`` or ``type``): None or type
    "default" for none; "linear" with ``factor`` (positions divided by factor); "llama3" with
    ``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``;
    "yarn" with ``factor`` (else max_pos / original), ``original_max_position_embeddings``, optional
    ``beta_fast``/``beta_slow``, ``mscale``/``mscale_all_dim`` or ``attention_factor`` (which scales cos and sin).
    """
    if rot_dim <= 0 or rot_dim % 2:
        raise ValueError(f"build_cos_sin_cache: rot_dim must be a positive even number, got {rot_dim}")
    inv_freq = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        pass
    elif kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif kind == "yarn":
        inv_freq, attention = _yarn_inv_freq(inv_freq, rot_dim, base, max_pos, scaling)
    else:
        raise ValueError(f"build_cos_sin_cache: unsupported rope scaling type {kind!r}; "
                         "supported: None/'default', 'linear', 'llama3', 'yarn'")
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    table = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    if kind == "yarn":
        table = table * attention
    return table.to(dtype=dtype, device=device)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1)."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _yarn_inv_freq(inv_freq: torch.Tensor, dim: int, base: float, max_pos: int, s: dict) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071) as HF transformers computes it: frequencies between the interpolated (/ factor) and
    the original ones along a linear ramp between the correction dims of beta_fast and beta_slow rotations."""
    if not s.get("original_max_position_embeddings"):
        raise ValueError("build_cos_sin_cache: yarn rope scaling needs original_max_position_embeddings (the "
                         "pretraining context); the model's config lacks it")
    old_ctx = float(s["original_max_position_embeddings"])
    factor = float(s.get("factor") or max_pos / old_ctx)
    attention = s.get("attention_factor")
    if attention is None:
        mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
        attention = (yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all) if mscale and mscale_all
                     else yarn_mscale(factor))

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(s.get("beta_fast") or 32), correction_dim(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: original frequency (extrapolation), 0: interpolated
    return inv_freq / factor * (1 - keep) + inv_freq * keep, float(attention)


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    if not s.get("original_max_position_embeddings"):
        raise ValueError("build_cos_sin_cache: yarn rope scaling needs original_max_position_embeddings (the "
                         "pretraining context); the model's config lacks it")
    old_ctx = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_ctx / wavelen - low) / (high - low)
    mid = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_ctx / low, inv_freq / factor, mid)
    return torch.where(wavelen < old_ctx / high, inv_freq, out)


def _check(positions, q, k, cos_sin_cache, head_dim) -> int:
    for name, t in (("positions", positions), ("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rotary_embedding: {name} must be a tensor, got {type(t).__name__}")
    if positions.dtype != torch.int64 or positions.dim() != 1:
        raise TypeError(f"rotary_embedding: positions must be 1-D int64 [T], got {positions.dtype} "
                        f"{tuple(positions.shape)}")
    if q.dtype not in REF_DTYPES or k.dtype != q.dtype:
        raise TypeError(f"rotary_embedding: q and k must share one dtype of {_DTYPES}, got "
                        f"{q.dtype}/{k.dtype}")
    if cos_sin_cache.dtype not in (torch.float32, q.dtype):
        raise TypeError(f"rotary_embedding: cos_sin_cache must be float32 or q's dtype ({q.dtype}), "
                        f"got {cos_sin_cache.dtype}")
    if cos_sin_cache.dim() != 2:
        raise ValueError("rotary_embedding: cos_sin_cache must be [max_pos, rot_dim], got "
                         f"{tuple(cos_sin_cache.shape)}")
    rot = cos_sin_cache.shape[1]
    if rot % 2 or not 0 < rot <= head_dim:
        raise ValueError(f"rotary_embedding: rot_dim (cos_sin_cache.shape[1] = {rot}) must be even and in "
                         f"(0, head_dim={head_dim}]")
    t = positions.shape[0]
    for name, x in (("q", q), ("k", k)):
        if x.dim() < 2 or x.shape[0] != t or math.prod(x.shape[1:]) % head_dim:
            raise ValueError(f"rotary_embedding: {name} must be [T={t}, H*{head_dim}], got {tuple(x.shape)}")
    return rot


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, is_neox: bool):
    t, rot = x.shape[0], 2 * cos.shape[-1]
    xf = acc(x).reshape(t, math.prod(x.shape[1:]) // head_dim, head_dim)
    xr = xf[..., :rot]
    if is_neox:
        a, b = xr[..., : rot // 2], xr[..., rot // 2:]
    else:
        a, b = xr[..., 0::2], xr[..., 1::2]
    ra, rb = a * cos - b * sin, b * cos + a * sin
    rotated = torch.cat([ra, rb], -1) if is_neox else torch.stack([ra, rb], -1).flatten(-2)
    return torch.cat([rotated, xf[..., rot:]], -1).reshape(x.shape).to(x.dtype)


def _rotary_ref(positions, q, k, cos_sin_cache, head_dim: int, is_neox: bool):
    """Returns (q_rot, k_rot), new tensors shaped and typed like q and k; math in fp32."""
    rot = _check(positions, q, k, cos_sin_cache, head_dim)
    cs = acc(cos_sin_cache)[positions]  # [T, rot]
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2:]
    return _rotate(q, cos, sin, head_dim, is_neox), _rotate(k, cos, sin, head_dim, is_neox)


def _rotary_fake(positions, q, k, cos_sin_cache, head_dim, is_neox):
    _check(positions, q, k, cos_sin_cache, head_dim)
    return torch.empty_like(q), torch.empty_like(k)


def _rotary_inputs(p, dtype, device, gen):
    t, hq, hk, d = p["tokens"], p["hq"], p["hk"], p["head_dim"]
    rot, max_pos = p.get("rot_dim", d // p.get("rot_frac", 1)), p.get("max_pos", 4096)
    cache_dtype = dtype if p.get("cache_in_q_dtype") else torch.float32
    cache = build_cos_sin_cache(max_pos, rot, p.get("base", 10000.0), cache_dtype, device=device)
    positions = randint(0, max_pos, (t,), device, gen)
    q = randn((t, hq * d), dtype, device, gen)
    k = randn((t, hk * d), dtype, device, gen)
    return positions, q, k, cache, d, p.get("is_neox", True)


def _draw(rng, budget):
    """one token, a decode batch, a prefill, positions up to 32768 (long-context tables), a partial rotary dim; head
    shapes and bases of real models (SmolLM2 100k, Llama 3 500k, Qwen 1M)."""
    cap = elements(budget)

    def case(name, tokens, **extra):
        hq, hk, d = rng.choice(HEADS)
        tokens = fit(tokens, (hq + hk) * d, cap)
        return Case(name, {"tokens": tokens, "hq": hq, "hk": hk, "head_dim": d, "is_neox": rng.random() < 0.7,
                           "base": rng.choice((10000.0, 100000.0, 500000.0, 1000000.0)), **extra}, engine_shape=True)
    return [case("draw_one", 1), case("draw_decode", log_int(rng, 2, 64)),
            case("draw_prefill", log_int(rng, 65, MAX_ROWS)),
            case("draw_long_positions", log_int(rng, 8, 256), max_pos=32768),
            case("draw_partial", log_int(rng, 2, 64), rot_frac=2)]


rotary_embedding = OpDef(
    name="rotary_embedding",
    schema="(Tensor positions, Tensor q, Tensor k, Tensor cos_sin_cache, int head_dim, bool is_neox)"
           " -> (Tensor, Tensor)",
    reference=_rotary_ref,
    fake=_rotary_fake,
    make_inputs=_rotary_inputs,
    draw=_draw,
    cases=[
        Case("smollm_neox", {"tokens": 7, "hq": 9, "hk": 3, "head_dim": 64, "base": 100000.0}),
        Case("llama_d128", {"tokens": 5, "hq": 8, "hk": 2, "head_dim": 128, "base": 500000.0}),
        Case("gptj", {"tokens": 6, "hq": 4, "hk": 4, "head_dim": 64, "is_neox": False}),
        Case("partial_neox", {"tokens": 5, "hq": 4, "hk": 2, "head_dim": 64, "rot_dim": 32}),
        Case("partial_gptj", {"tokens": 4, "hq": 3, "hk": 1, "head_dim": 128, "rot_dim": 64,
                              "is_neox": False}),
        Case("cache_in_q_dtype", {"tokens": 5, "hq": 6, "hk": 2, "head_dim": 64, "cache_in_q_dtype": True}),
    ],
    rounded_outputs=True,
    tolerances={
        torch.float32: Tolerance(1e-5, 1e-5),
        torch.bfloat16: Tolerance(2e-2, 2e-2),
        torch.float16: Tolerance(2e-3, 2e-3),
    },
    doc="positions int64 [T]; q [T, Hq*D], k [T, Hk*D]; cos_sin_cache [max_pos, rot_dim] (cos half, then sin "
        "half; fp32 or q's dtype); rot_dim <= head_dim. Returns new (q, k) with the first rot_dim channels "
        "of every head rotated by position (neox: pairs j, j+rot/2; GPT-J: pairs 2j, 2j+1), tail unchanged. "
        "fp32 math, one rounding to q.dtype.",
)
