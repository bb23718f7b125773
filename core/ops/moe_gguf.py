"""Mixture-of-experts with GGUF-quantized experts: :mod:`.moe`'s routing and SwiGLU experts, the expert weights kept
as GGUF blocks (:mod:`.gguf_quant`: Q4_0, Q4_1, Q8_0 and the K-quants).

GPTQ / AWQ / compressed-tensors INT4 experts arrive here too: the loader repacks them into Q4_0 / Q4_1 blocks
(``engine.core.loader.hf_int4``), exactly as it does their dense layers. ``w13`` holds every expert's gate rows then
up rows in one type; ``w2`` (the down projections) may have its own, as llama.cpp's Q4_K_M mixes give the down
projection more bits.
"""

from __future__ import annotations

import torch

from .gguf_kquants import Q4_K, Q6_K
from .gguf_quant import Q4_0, Q4_1, Q8_0, _gguf_dequantize_ref, check_gguf_raw, draw_qtype, random_gguf_weight
from .inputs import randn
from .moe import distinct_logits, draw_moe, swiglu_experts
from .registry import Case, OpDef, Tolerance
from .shapes import special_rows


def moe_gguf_problem(x, w13, w13_qtype, w2, w2_qtype, router_logits, top_k) -> str | None:
    """Why these arguments are not a ``fused_moe_gguf`` call (None if they are), in words kernels can return from
    ``supports`` too."""
    if not all(isinstance(t, torch.Tensor) for t in (x, w13, w2, router_logits)):
        return "x, w13, w2 and router_logits must be tensors"
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or router_logits.dim() != 2:
        return (f"need x [T, hidden], w13 [E, 2*I, row bytes], w2 [E, hidden, row bytes], router_logits [T, E]; got "
                f"{tuple(x.shape)}, {tuple(w13.shape)}, {tuple(w2.shape)}, {tuple(router_logits.shape)}")
    if not x.dtype.is_floating_point or not router_logits.dtype.is_floating_point:
        return f"x and router_logits must be float tensors, got {x.dtype}, {router_logits.dtype}"
    (t, hidden), (e, two_i, _) = x.shape, w13.shape
    if e == 0 or two_i == 0 or two_i % 2:
        return f"w13 must hold E > 0 experts of 2*I > 0 rows (gate, then up), got {tuple(w13.shape)}"
    try:
        check_gguf_raw(w13.flatten(0, 1), w13_qtype, hidden)
        check_gguf_raw(w2.flatten(0, 1), w2_qtype, two_i // 2)
    except (TypeError, ValueError) as exc:
        return f"expert weights: {exc}"
    if w2.shape[:2] != (e, hidden) or tuple(router_logits.shape) != (t, e):
        return (f"w2 {tuple(w2.shape)} must be [E={e}, hidden={hidden}, ...] and router_logits "
                f"{tuple(router_logits.shape)} [T={t}, E={e}]")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
        return f"top_k must be an int in [1, {e}] (the number of experts), got {top_k!r}"
    return None


def dequantize_experts(w: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    """GGUF experts [E, rows, row bytes] -> fp32 [E, rows, cols] (the reference's decode)."""
    e, rows, _ = w.shape
    return _gguf_dequantize_ref(w.reshape(e * rows, -1), qtype, cols, torch.float32).reshape(e, rows, cols)


def _fused_moe_gguf_ref(x, w13, w13_qtype, w2, w2_qtype, router_logits, top_k, renormalize):
    problem = moe_gguf_problem(x, w13, w13_qtype, w2, w2_qtype, router_logits, top_k)
    if problem:
        raise ValueError(f"fused_moe_gguf: {problem}")
    hidden, inter = x.shape[1], w13.shape[1] // 2
    return swiglu_experts(x, router_logits, top_k, renormalize, w13.shape[0], lambda e, dt: (
        _gguf_dequantize_ref(w13[e], w13_qtype, hidden, dt), _gguf_dequantize_ref(w2[e], w2_qtype, inter, dt)))


def _fused_moe_gguf_fake(x, w13, w13_qtype, w2, w2_qtype, router_logits, top_k, renormalize):
    return x.new_empty(x.shape)


def random_experts(e: int, rows: int, cols: int, qtype: int, device, gen: torch.Generator) -> torch.Tensor:
    """Random GGUF experts [e, rows, row bytes] whose products with O(1) inputs are O(1) (random_gguf_weight's
    per-row scales, so a wrong expert or row shows)."""
    raw = random_gguf_weight(e * rows, cols, qtype, device, gen, scale=cols ** -0.5)
    return raw.reshape(e, rows, -1)


def _inputs(p, dtype, device, gen):
    t, h, i, e = p["tokens"], p["hidden"], p["inter"], p["experts"]
    x = randn((t, h), torch.float32, "cpu", gen)
    x = (special_rows(x) if p.get("special") else x).to(dtype=dtype, device=device)
    w13 = random_experts(e, 2 * i, h, p["w13_qtype"], device, gen)
    w2 = random_experts(e, h, i, p["w2_qtype"], device, gen)
    logits = distinct_logits(t, e, dtype, device, gen)
    return x, w13, p["w13_qtype"], w2, p["w2_qtype"], logits, p["top_k"], p["renormalize"]


def _draw(rng, budget):
    """draw_moe's regimes with hidden and I rounded to whole GGUF blocks (256-wide super-blocks for a K-quant, drawn
    half the time where the size allows) and each weight's type drawn."""
    cases = []
    for case in draw_moe(rng, budget):
        p = dict(case.params)
        p["hidden"] = max(32, p["hidden"] // 32 * 32)
        p["inter"] = max(32, p["inter"] // 32 * 32)
        p["w13_qtype"] = draw_qtype(rng, p["hidden"])
        p["w2_qtype"] = draw_qtype(rng, p["inter"])
        cases.append(Case(case.name, p, engine_shape=True))
    return cases


def _case(name, w13_qtype, w2_qtype, **params):
    return Case(name, {"w13_qtype": w13_qtype, "w2_qtype": w2_qtype, **params})


fused_moe_gguf = OpDef(
    name="fused_moe_gguf",
    schema=("(Tensor x, Tensor w13, int w13_qtype, Tensor w2, int w2_qtype, Tensor router_logits, int top_k, "
            "bool renormalize) -> Tensor"),
    reference=_fused_moe_gguf_ref,
    fake=_fused_moe_gguf_fake,
    make_inputs=_inputs,
    draw=_draw,
    cases=[
        _case("mixtral_tiny_q4_0", Q4_0, Q4_0, tokens=6, hidden=64, inter=96, experts=8, top_k=2, renormalize=True),
        _case("awq_q4_1", Q4_1, Q4_1, tokens=9, hidden=96, inter=32, experts=16, top_k=4, renormalize=False),
        _case("one_token_q8_0", Q8_0, Q8_0, tokens=1, hidden=64, inter=64, experts=8, top_k=2, renormalize=True),
        _case("top1_many_q4_0", Q4_0, Q8_0, tokens=40, hidden=32, inter=64, experts=4, top_k=1, renormalize=False),
        _case("q4_k_m_mix", Q4_K, Q6_K, tokens=5, hidden=256, inter=256, experts=4, top_k=2, renormalize=True),
        _case("prefill_q4_1", Q4_1, Q4_0, tokens=70, hidden=64, inter=64, experts=8, top_k=2, renormalize=True),
    ],
    # bf16 as gguf_linear's: implementations may round the decoded weights and the intermediate to x's dtype
    tolerances={torch.float32: Tolerance(1e-4, 1e-4), torch.bfloat16: Tolerance(5e-2, 3e-2)},
    doc=(
        "x [T, hidden] (float); w13 uint8 [E, 2*I, row_bytes(hidden)]: each expert's gate rows then up rows as GGUF "
        "blocks of type w13_qtype; w2 uint8 [E, hidden, row_bytes(I)] of type w2_qtype (Q4_0=2, Q4_1=3, Q8_0=8, "
        "Q4_K=12, Q5_K=13, Q6_K=14). fused_moe's routing and SwiGLU experts on the weights gguf_dequantize gives "
        "(fp32 math), returned in x.dtype."
    ),
)

