"""Mixture-of-experts with NVFP4 experts (W4A16): :mod:`.moe`'s routing and SwiGLU experts, the expert weights kept
as ModelOpt exports them (:mod:`.nvfp4`: packed e2m1 codes, an e4m3 scale per 16 along K).

Each expert's projections carry their own fp32 global scale (ModelOpt's ``weight_scale_2``, here in the ops'
convention ``1 / weight_scale_2``); gate and up need not share one, so the op takes one global scale per output row:
``[E, 2*I]`` for ``w13`` (the gate's repeated over its rows, then the up's) and ``[E, hidden]`` for ``w2``.
"""

from __future__ import annotations

import torch

from .inputs import randn, uniform
from .moe import distinct_logits, draw_moe, swiglu_experts
from .nvfp4 import _SCALE_DTYPES, BLOCK, _nvfp4_quantize_ref, _varied_blocks, e2m1_decode, nvfp4_global_scale, unpack
from .registry import Case, OpDef, Tolerance
from .shapes import special_rows


def _expert_problem(name: str, packed, block_scale, global_scale, e: int, rows: int, cols: int) -> str | None:
    want = ((e, rows, cols // 2), (e, rows, cols // BLOCK), (e, rows))
    got = tuple(tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in (packed, block_scale, global_scale))
    if got != want:
        return f"{name}: packed, block_scale, global_scale must be {want}, got {got}"
    dtypes = (packed.dtype, block_scale.dtype)
    if dtypes != (torch.uint8, torch.float8_e4m3fn) or global_scale.dtype not in _SCALE_DTYPES:
        return (f"{name}: need uint8 codes, float8_e4m3fn block scales and float32 global scales, got "
                f"{packed.dtype}, {block_scale.dtype}, {global_scale.dtype}")
    return None


def moe_nvfp4_problem(x, w13_packed, w13_block_scale, w13_global_scale, w2_packed, w2_block_scale, w2_global_scale,
                      router_logits, top_k) -> str | None:
    """Why these arguments are not a ``fused_moe_nvfp4`` call (None if they are); kernels return it from supports."""
    if not all(isinstance(t, torch.Tensor) for t in (x, w13_packed, w2_packed, router_logits)):
        return "x, w13_packed, w2_packed and router_logits must be tensors"
    if x.dim() != 2 or w13_packed.dim() != 3 or router_logits.dim() != 2:
        return (f"need x [T, hidden], w13_packed [E, 2*I, hidden/2], router_logits [T, E]; got {tuple(x.shape)}, "
                f"{tuple(w13_packed.shape)}, {tuple(router_logits.shape)}")
    if not x.dtype.is_floating_point or not router_logits.dtype.is_floating_point:
        return f"x and router_logits must be float tensors, got {x.dtype}, {router_logits.dtype}"
    (t, hidden), (e, two_i) = x.shape, w13_packed.shape[:2]
    if e == 0 or two_i == 0 or two_i % 2 or hidden % BLOCK or (two_i // 2) % BLOCK:
        return f"need E, I > 0 and hidden ({hidden}), I ({two_i // 2}) multiples of {BLOCK}"
    problem = (_expert_problem("w13", w13_packed, w13_block_scale, w13_global_scale, e, two_i, hidden)
               or _expert_problem("w2", w2_packed, w2_block_scale, w2_global_scale, e, hidden, two_i // 2))
    if problem:
        return problem
    if tuple(router_logits.shape) != (t, e):
        return f"router_logits must be [T={t}, E={e}], got {tuple(router_logits.shape)}"
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
        return f"top_k must be an int in [1, {e}] (the number of experts), got {top_k!r}"
    return None


def dequantize_expert(packed: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor,
                      e: int) -> torch.Tensor:
    """Expert ``e``'s fp32 weight [rows, cols]: e2m1 * block_scale / global_scale (per row)."""
    scale = block_scale[e].float().repeat_interleave(BLOCK, dim=1) / global_scale[e].float()[:, None]
    return e2m1_decode(unpack(packed[e])) * scale


def _fused_moe_nvfp4_ref(x, w13_packed, w13_block_scale, w13_global_scale, w2_packed, w2_block_scale,
                         w2_global_scale, router_logits, top_k, renormalize):
    problem = moe_nvfp4_problem(x, w13_packed, w13_block_scale, w13_global_scale, w2_packed, w2_block_scale,
                                w2_global_scale, router_logits, top_k)
    if problem:
        raise ValueError(f"fused_moe_nvfp4: {problem}")
    return swiglu_experts(x, router_logits, top_k, renormalize, w13_packed.shape[0], lambda e, dt: (
        dequantize_expert(w13_packed, w13_block_scale, w13_global_scale, e).to(dt),
        dequantize_expert(w2_packed, w2_block_scale, w2_global_scale, e).to(dt)))


def _fused_moe_nvfp4_fake(x, *args):
    return x.new_empty(x.shape)


def quantize_experts(w: torch.Tensor, row_groups: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 experts [E, rows, cols] -> (packed, block_scale, per-row global scale [E, rows]); each expert's rows
    in ``row_groups`` equal parts (gate and up: 2), each part quantized with its own conventional global scale."""
    packed, scales, gs = [], [], []
    for we in w:
        for part in we.chunk(row_groups):
            g = nvfp4_global_scale(part)
            p, s = _nvfp4_quantize_ref(part, g)
            packed.append(p)
            scales.append(s)
            gs.append(g.expand(part.shape[0]))
    e, rows = w.shape[:2]
    return (torch.cat(packed).reshape(e, rows, -1), torch.cat(scales).reshape(e, rows, -1),
            torch.cat(gs).reshape(e, rows).contiguous())


def _inputs(p, dtype, device, gen):
    t, h, i, e = p["tokens"], p["hidden"], p["inter"], p["experts"]
    x = randn((t, h), torch.float32, "cpu", gen)
    x = (special_rows(x) if p.get("special") else x).to(dtype=dtype, device=device)
    mag = uniform((e, 1, 1), 0.5, 2.0, torch.float32, "cpu", gen)  # a wrong expert shows
    w13 = _varied_blocks(e * 2 * i, h, "cpu", gen, h ** -0.5).reshape(e, 2 * i, h) * mag
    w2 = _varied_blocks(e * h, i, "cpu", gen, i ** -0.5).reshape(e, h, i)
    w13_q = quantize_experts(w13, row_groups=2)
    w2_q = quantize_experts(w2)
    logits = distinct_logits(t, e, dtype, device, gen)
    return (x, *(a.to(device) for a in w13_q), *(a.to(device) for a in w2_q), logits, p["top_k"], p["renormalize"])


def _draw(rng, budget):
    """draw_moe's regimes with hidden and I rounded to whole 16-element blocks."""
    cases = []
    for case in draw_moe(rng, budget):
        p = dict(case.params, hidden=max(16, case.params["hidden"] // 16 * 16),
                 inter=max(16, case.params["inter"] // 16 * 16))
        cases.append(Case(case.name, p, engine_shape=True))
    return cases


def _case(name, **params):
    return Case(name, params)


fused_moe_nvfp4 = OpDef(
    name="fused_moe_nvfp4",
    schema=("(Tensor x, Tensor w13_packed, Tensor w13_block_scale, Tensor w13_global_scale, Tensor w2_packed, "
            "Tensor w2_block_scale, Tensor w2_global_scale, Tensor router_logits, int top_k, bool renormalize) "
            "-> Tensor"),
    reference=_fused_moe_nvfp4_ref,
    fake=_fused_moe_nvfp4_fake,
    make_inputs=_inputs,
    draw=_draw,
    cases=[
        _case("mixtral_tiny", tokens=6, hidden=64, inter=96, experts=8, top_k=2, renormalize=True),
        _case("e16_top4", tokens=9, hidden=48, inter=32, experts=16, top_k=4, renormalize=False),
        _case("one_token", tokens=1, hidden=64, inter=64, experts=8, top_k=2, renormalize=True),
        _case("top1_many", tokens=40, hidden=32, inter=48, experts=4, top_k=1, renormalize=False),
        _case("prefill_top2", tokens=70, hidden=64, inter=48, experts=8, top_k=2, renormalize=True),
    ],
    # the dequantized weight is exact in bf16 (6 significant bits); implementations may keep the intermediate in
    # x's dtype and apply 1 / global_scale to the sums
    tolerances={torch.float32: Tolerance(1e-4, 1e-4), torch.bfloat16: Tolerance(3e-2, 3e-2)},
    doc=(
        "x [T, hidden] (hidden % 16 == 0); w13_packed uint8 [E, 2*I, hidden/2] (gate rows then up rows; two e2m1 "
        "codes a byte, low nibble = even k), w13_block_scale float8_e4m3fn [E, 2*I, hidden/16], w13_global_scale "
        "fp32 [E, 2*I] (per row); w2_* alike with [E, hidden, I/2], [E, hidden, I/16], [E, hidden]. Weight[e, n, k] "
        "= e2m1(code) * block_scale[e, n, k // 16] / global_scale[e, n]. fused_moe's routing and SwiGLU experts on "
        "those weights (fp32 math, activations not quantized), returned in x.dtype."
    ),
)
