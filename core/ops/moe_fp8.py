"""W8A8 FP8 mixture-of-experts: :mod:`.moe`'s routing and SwiGLU experts with FP8 expert weights (static
scales) and FP8 activations quantized per token on the fly.

Weights come in ``float8_e4m3fn`` (max 448, the OCP format NVIDIA uses) or ``float8_e4m3fnuz`` (max 240,
AMD MI300); both weight tensors share one of the two, and the activations are quantized to that same format
(an FP8 tensor-core product takes two operands of one format). Scale layouts, fp32, per expert ``e``:

- per-expert tensor: ``[E]`` or ``[E, 1, 1]``, one scale for all of ``w[e]``;
- per output channel: ``[E, N, 1]`` (``N`` = 2*I for ``w13``, hidden for ``w2``), one scale per row of ``w[e]``;
- 128x128 blocks: ``[E, ceil(N/128), ceil(K/128)]`` (DeepSeek-V3's and Qwen3-FP8's experts), both weights alike.

The dequantized weight is ``w_q[e].float() * scale[e]`` (broadcast; blocks expanded). Activations use
:func:`.fp8.quantize_fp8` with granularity "token" (scale = max(amax(row), 1e-12) / fp8_max, values rounded to
nearest-even after clamping to +-fp8_max), or with block weights per 1x128 group of each row (granularity "block",
``block=(1, 128)``), as DeepSeek's block-FP8 GEMMs quantize them.
"""

from __future__ import annotations

import dataclasses

import torch

from .fp8 import BLOCK_K, FP8_DTYPES, _expand, fp8_needs, quantize_fp8
from .inputs import randn, uniform
from .moe import _check, distinct_logits, draw_moe, expert_groups
from .precision import REF_DTYPES
from .registry import Case, OpDef, Tolerance
from .shapes import special_rows

ACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def block_shape(n_exp: int, rows: int, cols: int) -> tuple[int, int, int]:
    """The shape of 128x128 block scales of ``n_exp`` [rows, cols] expert matrices."""
    return (n_exp, -(-rows // BLOCK_K), -(-cols // BLOCK_K))


def is_block_scale(scale: torch.Tensor, rows: int, cols: int) -> bool:
    """Whether ``scale`` holds 128x128 block scales of [rows, cols] experts (a shape that also reads as per tensor or
    per channel is read that way: the same scaling)."""
    return (scale.dim() == 3 and tuple(scale.shape) == block_shape(scale.shape[0], rows, cols)
            and tuple(scale.shape[1:]) not in ((1, 1), (rows, 1)))


def block_scaled(w13_scale: torch.Tensor, w2_scale: torch.Tensor, two_i: int, hidden: int) -> bool | None:
    """Whether the experts' weight scales are 128x128 blocks (True), per tensor or channel (False), or a mix of the
    two (None). w13's scale decides: a w2 of at most 128x128 has a block scale of shape [E, 1, 1], which reads as per
    tensor too (the same scaling, and its one group a row is the row)."""
    if is_block_scale(w13_scale, two_i, hidden):
        return True if tuple(w2_scale.shape) == block_shape(w13_scale.shape[0], hidden, two_i // 2) else None
    return None if is_block_scale(w2_scale, hidden, two_i // 2) else False


def _check_scale(scale, n_exp: int, rows: int, cols: int, what: str) -> None:
    if not isinstance(scale, torch.Tensor) or scale.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{what} must be a float32 tensor, got {getattr(scale, 'dtype', type(scale))}")
    if tuple(scale.shape) not in ((n_exp,), (n_exp, 1, 1), (n_exp, rows, 1), block_shape(n_exp, rows, cols)):
        raise ValueError(f"{what} has shape {tuple(scale.shape)}; it must be [{n_exp}] or [{n_exp}, 1, 1] "
                         f"(per-expert tensor), [{n_exp}, {rows}, 1] (per output channel) or "
                         f"{list(block_shape(n_exp, rows, cols))} (128x128 blocks)")


def _check_fp8(x, w13_q, w13_scale, w2_q, w2_scale, router_logits, top_k):
    if w13_q.dtype not in FP8_DTYPES.values() or w2_q.dtype != w13_q.dtype:
        raise TypeError(f"w13_q and w2_q must both be float8_e4m3fn or both float8_e4m3fnuz, got {w13_q.dtype}, "
                        f"{w2_q.dtype}")
    if x.dtype not in REF_DTYPES:
        raise TypeError(f"x must be float32, bfloat16 or float16 (float64 in the conformance kit's oracle), got "
                        f"{x.dtype}")
    # moe's shape checks want one dtype for x and the weights: hand it x-dtype stand-ins of the weight shapes
    _check(x, torch.empty(w13_q.shape, dtype=x.dtype, device="meta"),
           torch.empty(w2_q.shape, dtype=x.dtype, device="meta"), router_logits, top_k)
    n_exp, two_i, hidden = w13_q.shape
    _check_scale(w13_scale, n_exp, two_i, hidden, "w13_scale")
    _check_scale(w2_scale, n_exp, hidden, two_i // 2, "w2_scale")
    if block_scaled(w13_scale, w2_scale, two_i, hidden) is None:
        raise ValueError("w13_scale and w2_scale must both be 128x128 block scales or neither: the activations are "
                         "quantized per 1x128 group for block weights, per token otherwise")


def dequantize_expert(w_q: torch.Tensor, scale: torch.Tensor, e: int) -> torch.Tensor:
    """``w_q[e]`` dequantized to fp32 (scale layouts as in the module docstring)."""
    rows, cols = w_q.shape[1:]
    if is_block_scale(scale, rows, cols):
        return w_q[e].float() * _expand(scale[e], rows, cols, BLOCK_K, BLOCK_K)
    s = scale[e].reshape(-1, 1) if scale.dim() == 3 else scale[e].reshape(1, 1)
    return w_q[e].float() * s


def _quant_dequant(a: torch.Tensor, fp8_dtype: torch.dtype, groups: bool = False) -> torch.Tensor:
    """Dynamic FP8 quantization of ``a`` [rows, K] per row (``groups``: per 1x128 group), dequantized in fp32."""
    if groups:
        q, s = quantize_fp8(a, "block", fp8_dtype, (1, BLOCK_K))
        return q.float() * _expand(s, *a.shape, 1, BLOCK_K)
    q, s = quantize_fp8(a, "token", fp8_dtype)
    return q.float() * s


def _fused_moe_fp8_ref(x, w13_q, w13_scale, w2_q, w2_scale, router_logits, top_k, renormalize):
    _check_fp8(x, w13_q, w13_scale, w2_q, w2_scale, router_logits, top_k)
    fp8 = w13_q.dtype
    inter = w13_q.shape[1] // 2
    groups = is_block_scale(w13_scale, 2 * inter, x.shape[1])
    xd = _quant_dequant(x, fp8, groups)  # per token (or 1x128 group), once for all its experts
    out = torch.zeros(x.shape, dtype=xd.dtype, device=x.device)
    for e, tokens, weight in expert_groups(router_logits, top_k, renormalize, w13_q.shape[0]):
        gate_up = xd[tokens] @ dequantize_expert(w13_q, w13_scale, e).t().to(xd.dtype)
        # the intermediate is stored in x's dtype (as every implementation keeps it), then quantized per row
        h = (torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]).to(x.dtype)
        hd = _quant_dequant(h, fp8, groups)
        y = hd @ dequantize_expert(w2_q, w2_scale, e).t().to(hd.dtype)
        out[tokens] += y * weight  # a token meets each expert at most once
    return out.to(x.dtype)


def _fused_moe_fp8_fake(x, w13_q, w13_scale, w2_q, w2_scale, router_logits, top_k, renormalize):
    return x.new_empty(x.shape)


def _quantize_experts(w: torch.Tensor, granularity: str, fp8_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per expert: ``quantize_fp8`` per output channel ("channel": scales [E, N, 1]), per tensor ("tensor":
    scales [E]; "tensor3d": [E, 1, 1]) or per 128x128 block ("block": [E, N/128, K/128])."""
    qs, scales = [], []
    for e in range(w.shape[0]):
        if granularity == "block":
            q, s = quantize_fp8(w[e], "block", fp8_dtype, (BLOCK_K, BLOCK_K))
        else:
            q, s = quantize_fp8(w[e], "channel" if granularity == "channel" else "tensor", fp8_dtype)
        qs.append(q)
        scales.append(s)
    scale = torch.stack(scales)
    if granularity == "tensor3d":
        scale = scale.reshape(-1, 1, 1)
    return torch.stack(qs), scale


def _varied_weights(e, rows, cols, gen, scale):
    """Normals times a per-expert factor in [0.5, 1.5] and a per-row factor in [0.7, 1.4] (fp32, on the CPU), so a
    wrong expert or a misapplied per-channel scale shows."""
    mag = uniform((e, 1, 1), 0.5, 1.5, torch.float32, "cpu", gen)
    row = torch.exp2(uniform((e, rows, 1), -0.5, 0.5, torch.float32, "cpu", gen))
    return randn((e, rows, cols), torch.float32, "cpu", gen, scale=scale) * mag * row


def _fused_moe_fp8_inputs(p, dtype, device, gen):
    t, h, i, e = p["tokens"], p["hidden"], p["inter"], p["experts"]
    fp8 = FP8_DTYPES[p["fp8"]]
    g = p["granularity"]
    # per-token magnitudes in [0.7, 1.4] too, so a wrong activation scale shows
    x = randn((t, h), torch.float32, "cpu", gen) * torch.exp2(uniform((t, 1), -0.5, 0.5, torch.float32, "cpu", gen))
    x = special_rows(x) if p.get("special") else x
    w13_q, w13_scale = _quantize_experts(_varied_weights(e, 2 * i, h, gen, h ** -0.5), g, fp8)
    w2_q, w2_scale = _quantize_experts(_varied_weights(e, h, i, gen, i ** -0.5), g, fp8)
    logits = distinct_logits(t, e, dtype, device, gen)
    return (x.to(dtype=dtype, device=device), w13_q.to(device), w13_scale.to(device), w2_q.to(device),
            w2_scale.to(device), logits, p["top_k"], p["renormalize"])


def _case(name, **params):
    return Case(name, params)


def _whole_blocks(case: Case) -> Case:
    """A drawn block-scaled case with hidden and I rounded down to whole 128-wide blocks (as block-FP8 models have
    them, and as block kernels take them)."""
    p = case.params
    if p.get("granularity") != "block":
        return case
    h, i = max(128, p["hidden"] // 128 * 128), max(128, p["inter"] // 128 * 128)
    while h * i > p["hidden"] * p["inter"] and h > 128:  # I rounded up: keep the experts within the drawn size
        h = max(128, h // 256 * 128)
    return dataclasses.replace(case, params={**p, "hidden": h, "inter": i})


fused_moe_fp8 = OpDef(
    name="fused_moe_fp8",
    # Hopper's FP8 tensor cores accumulate in about 13 mantissa bits, not fp32: cuBLAS, Triton and Gluon FP8 GEMMs
    # measured 3e-4 to 4e-4 relative error on the H200 (K = 64 to 4096) where the fp32 reference made 5e-6.
    accumulation_roundoff=2.0 ** -10,
    quantizes_intermediates=True,
    schema=("(Tensor x, Tensor w13_q, Tensor w13_scale, Tensor w2_q, Tensor w2_scale, Tensor router_logits, "
            "int top_k, bool renormalize) -> Tensor"),
    reference=_fused_moe_fp8_ref,
    fake=_fused_moe_fp8_fake,
    make_inputs=_fused_moe_fp8_inputs,
    draw=lambda rng, budget: [fp8_needs(_whole_blocks(c)) for c in draw_moe(
        rng, budget, fp8=("e4m3fn", "e4m3fnuz"), granularity=("channel", "tensor", "tensor3d", "block"))],
    cases=[
        _case("mixtral_tiny_channel", tokens=6, hidden=64, inter=96, experts=8, top_k=2, renormalize=True,
              fp8="e4m3fn", granularity="channel"),
        _case("e16_top4_tensor", tokens=9, hidden=48, inter=32, experts=16, top_k=4, renormalize=False,
              fp8="e4m3fn", granularity="tensor"),
        _case("one_token_fnuz", tokens=1, hidden=64, inter=64, experts=8, top_k=2, renormalize=True,
              fp8="e4m3fnuz", granularity="channel"),
        _case("top1_many_tensor3d", tokens=40, hidden=32, inter=40, experts=4, top_k=1, renormalize=False,
              fp8="e4m3fn", granularity="tensor3d"),
        _case("e16_top4_fnuz", tokens=17, hidden=80, inter=56, experts=16, top_k=4, renormalize=True,
              fp8="e4m3fnuz", granularity="tensor"),
        _case("prefill_top2_channel", tokens=70, hidden=64, inter=48, experts=8, top_k=2, renormalize=True,
              fp8="e4m3fn", granularity="channel"),
        _case("deepseek_block", tokens=5, hidden=256, inter=128, experts=8, top_k=2, renormalize=True,
              fp8="e4m3fn", granularity="block"),
        _case("block_fnuz_prefill", tokens=66, hidden=128, inter=256, experts=4, top_k=2, renormalize=False,
              fp8="e4m3fnuz", granularity="block"),
        _case("block_partial_edges", tokens=7, hidden=192, inter=80, experts=4, top_k=2, renormalize=True,
              fp8="e4m3fn", granularity="block"),
        # w2 is one 128x128 block: its block scale [E, 1, 1] also reads as per tensor (a kit draw found the check
        # refusing it)
        _case("block_one_tile_w2", tokens=3, hidden=128, inter=128, experts=4, top_k=2, renormalize=True,
              fp8="e4m3fn", granularity="block"),
    ],
    # Outputs are O(1). FP8 keeps 3 mantissa bits: an implementation that sums in another order (or, on Hopper,
    # accumulates FP8 products in fewer bits) now and then rounds an activation to the neighbouring FP8 value, a
    # step of 1/16 to 1/8 of it, and a changed row maximum moves the scale of a whole row. Simulated over 720 runs
    # of these cases, relative noise of 1e-6 / 1e-5 / 6e-5 on both GEMMs' results stayed within 0.05 / 0.10 / 0.10
    # (max |err| / (1 + |ref|)), while one mean scale in place of per-channel scales errs by 0.27 at least.
    tolerances={torch.float32: Tolerance(0.15, 0.15), torch.bfloat16: Tolerance(0.15, 0.15),
                torch.float16: Tolerance(0.15, 0.15)},
    doc=(
        "x [T, hidden] (fp32/bf16/fp16: the dtype axis and the output dtype); w13_q [E, 2*I, hidden] (gate rows, "
        "then up rows), w2_q [E, hidden, I]: both float8_e4m3fn or both float8_e4m3fnuz; w13_scale / w2_scale fp32 "
        "[E] or [E, 1, 1] (per expert), [E, N, 1] (per output channel) or [E, ceil(N/128), ceil(K/128)] (128x128 "
        "blocks, both alike), dequantized weight = w_q[e].float() * scale[e] (blocks expanded). (weights, ids) = "
        "route(router_logits, top_k, renormalize) as in fused_moe. Per token xd = dequant(quantize_fp8(x, 'token', "
        "w13_q.dtype)) (block weights: per 1x128 group, quantize_fp8(x, 'block', fp8, (1, 128))); gate_up = xd @ "
        "W13[e]^T (fp32); h = (silu(gate) * up).to(x.dtype); hd = h quantized the same way (per (token, expert) row "
        "or its 1x128 groups); out[t] = sum_j weights[t, j] * hd @ W2[e]^T, fp32, returned in x.dtype."
    ),
)

