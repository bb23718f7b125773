"""Mixture-of-experts feed-forward: softmax top-k routing and SwiGLU experts, fused into one op."""

from __future__ import annotations

import torch

from .inputs import randn, uniform
from .precision import acc
from .registry import Case, OpDef, Tolerance
from .shapes import HIDDEN, MAX_TENSOR_ELEMENTS, elements, fit, log_int, special_rows


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing.

    router_logits: [T, E], any float dtype. The softmax runs in fp32 over the E experts; the top_k largest
    probabilities are kept (which of two exactly equal logits wins is unspecified). With ``renormalize`` the
    kept weights are divided by their sum so each token's weights sum to 1.
    Returns (weights fp32 [T, top_k], expert ids int64 [T, top_k]), each row in descending weight order.
    """
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits must be [tokens, experts], got shape {tuple(router_logits.shape)}")
    n_experts = router_logits.shape[1]
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k must be in [1, {n_experts}] (the number of experts), got {top_k}")
    probs = torch.softmax(acc(router_logits), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int64)


def kernel_shape_problem(x, w13, w2, router_logits) -> str | None:
    """Why a fused-MoE kernel cannot take these shapes (None if it can): the op's layout with every size > 0, as a
    ``supports`` reason. Kernels share it so that they decline the same inputs with the same words."""
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or router_logits.dim() != 2:
        return "need x [T, hidden], w13 [E, 2*I, hidden], w2 [E, hidden, I], router_logits [T, E]"
    (t, h), (e, two_i, h13) = x.shape, w13.shape
    if two_i == 0 or two_i % 2 or h13 != h or h == 0 or e == 0:
        return f"w13 must be [E, 2*I, hidden={h}] with I, hidden, E > 0, got {tuple(w13.shape)}"
    if tuple(w2.shape) != (e, h, two_i // 2) or tuple(router_logits.shape) != (t, e):
        return f"w2 {tuple(w2.shape)} or router_logits {tuple(router_logits.shape)} do not match x and w13"
    return None


def _check(x, w13, w2, router_logits, top_k):
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"fused_moe wants x [T, hidden], w13 [E, 2*I, hidden], w2 [E, hidden, I]; got "
                         f"{tuple(x.shape)}, {tuple(w13.shape)}, {tuple(w2.shape)}")
    n_tok, hidden = x.shape
    n_exp, two_i, w13_hidden = w13.shape
    if two_i % 2 or w13_hidden != hidden:
        raise ValueError(f"w13 must be [E, 2*I, hidden={hidden}] (gate rows then up rows), got "
                         f"{tuple(w13.shape)}")
    if tuple(w2.shape) != (n_exp, hidden, two_i // 2):
        raise ValueError(f"w2 must be [E={n_exp}, hidden={hidden}, I={two_i // 2}], got {tuple(w2.shape)}")
    if tuple(router_logits.shape) != (n_tok, n_exp):
        raise ValueError(f"router_logits must be [T={n_tok}, E={n_exp}], got {tuple(router_logits.shape)}")
    if not (x.dtype == w13.dtype == w2.dtype) or not x.dtype.is_floating_point:
        raise TypeError(f"x, w13 and w2 must share one float dtype, got {x.dtype}, {w13.dtype}, {w2.dtype}")
    if not router_logits.dtype.is_floating_point:
        raise TypeError(f"router_logits must be a float tensor, got {router_logits.dtype}")
    if not 1 <= top_k <= n_exp:
        raise ValueError(f"top_k must be in [1, {n_exp}] (the number of experts), got {top_k}")


def expert_groups(router_logits: torch.Tensor, top_k: int, renormalize: bool, num_experts: int):
    """Route, then group the (token, slot) pairs by expert: yields (expert, token indices, their routing weights
    [n, 1] fp32) for every expert with tokens, in expert order, tokens ascending (one sort for all experts)."""
    weights, ids = route(router_logits, top_k, renormalize)
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    flat_w = weights.reshape(-1)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        pairs = order[start:start + n]
        start += n
        yield e, pairs // top_k, flat_w[pairs, None]


def swiglu_experts(x, router_logits, top_k: int, renormalize: bool, num_experts: int, expert_weights):
    """The routed SwiGLU experts in x's accumulation dtype (fp32, or fp64 for the kit's oracle), returned in x.dtype:
    ``expert_weights(e, dtype)`` gives expert e's (w13 [2I, hidden], w2 [hidden, I]) as plain matrices of dtype. The
    references of every fused-MoE op share it; they differ in how they decode their experts."""
    xf = acc(x)
    out = torch.zeros(x.shape, dtype=xf.dtype, device=x.device)
    for e, tokens, weight in expert_groups(router_logits, top_k, renormalize, num_experts):
        w13, w2 = expert_weights(e, xf.dtype)
        gate_up = xf[tokens] @ w13.t()
        inter = gate_up.shape[1] // 2
        h = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out[tokens] += (h @ w2.t()) * weight  # a token meets each expert at most once
    return out.to(x.dtype)


def _fused_moe_ref(x, w13, w2, router_logits, top_k, renormalize):
    _check(x, w13, w2, router_logits, top_k)
    return swiglu_experts(x, router_logits, top_k, renormalize, w13.shape[0],
                          lambda e, dt: (w13[e].to(dt), w2[e].to(dt)))


def _fused_moe_fake(x, w13, w2, router_logits, top_k, renormalize):
    return x.new_empty(x.shape)


def distinct_logits(tokens: int, experts: int, dtype, device, gen: torch.Generator) -> torch.Tensor:
    """Router logits whose values in each row are at least 0.2 apart (in bf16 too), so that the top-k
    choice cannot depend on rounding or tie-breaking: a random permutation of 0, .25, .5, ... plus noise
    below 0.05."""
    perm = torch.argsort(torch.rand((tokens, experts), generator=gen), dim=-1).float()
    noise = torch.rand((tokens, experts), generator=gen) * 0.05
    return (perm * 0.25 - experts * 0.125 + noise).to(dtype=dtype, device=device)


# (experts, top_k) of real MoE models: Mixtral, Qwen1.5-MoE, DeepSeek-V2-Lite, Qwen3-MoE; and a top-1 router
MOE_ROUTING = ((8, 2), (60, 4), (64, 6), (128, 8), (16, 1))


def draw_moe(rng, budget, **extra):
    """decode (1-16 tokens), prefill (64-1024 tokens) and special (zero, tiny and huge token rows), each with a real
    model's routing and hidden size; the intermediate size is what the budget leaves (a multiple of 16)."""
    cap = min(elements(budget) * 4, 2 * MAX_TENSOR_ELEMENTS)  # the experts' weights are most of a case
    cases = []
    for name, lo, hi, special in (("draw_decode", 1, 16, False), ("draw_prefill", 64, 1024, False),
                                  ("draw_special", 8, 64, True)):
        e, k = rng.choice(MOE_ROUTING)
        h = rng.choice(HIDDEN)
        inter = max(16, min(2 * h, cap // (3 * e * h)) // 16 * 16)
        while 3 * e * h * inter > cap and h > 64:
            h //= 2
        t = fit(log_int(rng, lo, hi), k * 3 * h * inter, budget, 1)
        cases.append(Case(name, {"tokens": t, "hidden": h, "inter": inter, "experts": e, "top_k": k,
                                 "renormalize": rng.random() < 0.5, "special": special,
                                 **{key: rng.choice(values) for key, values in extra.items()}}, engine_shape=True))
    return cases


def _fused_moe_inputs(p, dtype, device, gen):
    t, h, i, e = p["tokens"], p["hidden"], p["inter"], p["experts"]
    x = randn((t, h), dtype, "cpu", gen)
    x = (special_rows(x) if p.get("special") else x).to(device)
    # Scaled so gate/up and the output are O(1); per-expert magnitudes differ so a wrong expert id shows.
    mag = uniform((e, 1, 1), 0.5, 2.0, torch.float32, "cpu", gen)
    w13 = randn((e, 2 * i, h), torch.float32, "cpu", gen, scale=h ** -0.5) * mag
    w13 = w13.to(dtype=dtype, device=device)
    w2 = randn((e, h, i), dtype, device, gen, scale=i ** -0.5)
    logits = distinct_logits(t, e, dtype, device, gen)
    return x, w13, w2, logits, p["top_k"], p["renormalize"]


def _case(name, **params):
    return Case(name, params)


fused_moe = OpDef(
    name="fused_moe",
    schema="(Tensor x, Tensor w13, Tensor w2, Tensor router_logits, int top_k, bool renormalize) -> Tensor",
    reference=_fused_moe_ref,
    fake=_fused_moe_fake,
    make_inputs=_fused_moe_inputs,
    draw=draw_moe,
    cases=[
        _case("mixtral_tiny", tokens=6, hidden=64, inter=96, experts=8, top_k=2, renormalize=True),
        _case("e16_top4", tokens=9, hidden=48, inter=32, experts=16, top_k=4, renormalize=False),
        _case("one_token", tokens=1, hidden=64, inter=64, experts=8, top_k=2, renormalize=True),
        _case("top1_many", tokens=40, hidden=32, inter=40, experts=4, top_k=1, renormalize=False),
        _case("e16_top4_renorm", tokens=17, hidden=80, inter=56, experts=16, top_k=4, renormalize=True),
        _case("prefill_top2", tokens=70, hidden=64, inter=48, experts=8, top_k=2, renormalize=True),
    ],
    tolerances={torch.float32: Tolerance(1e-4, 1e-4), torch.bfloat16: Tolerance(2e-2, 2e-2)},
    doc=(
        "x [T, hidden]; w13 [E, 2*I, hidden] (rows 0..I-1 gate, I..2I-1 up); w2 [E, hidden, I]; "
        "router_logits [T, E]; (weights, ids) = route(router_logits, top_k, renormalize) (fp32 softmax, "
        "top-k, optionally renormalised to sum 1); "
        "expert_e(x) = w2[e] @ (silu(w13[e, :I] @ x) * (w13[e, I:] @ x)); "
        "out[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]). fp32 math, returned in x.dtype. "
        "x, w13, w2 share one dtype; router_logits may be any float dtype."
    ),
)
