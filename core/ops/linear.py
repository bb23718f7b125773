"""Dense linear layer: ``y = x @ weight.T + bias`` over plain (unquantized) weights.

The reference is torch's ``F.linear`` (the vendor BLAS on every device), so a platform that registers nothing
runs exactly what the models ran before this op existed. GPU platforms add kernels where BLAS leaves bandwidth
unused (a GEMV for the few rows of a decode step) and decline the rest.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .inputs import randn
from .registry import Case, OpDef, Tolerance
from .shapes import HIDDEN, matmul_cases, special_rows

# Outputs are ~N(0, 1) (weights scaled by K^-0.5): one bf16/fp16 ulp of the largest values, fp32 summation order.
_TOL = {
    torch.float32: Tolerance(1e-4, 1e-4),
    torch.bfloat16: Tolerance(1.6e-2, 1.6e-2),
    torch.float16: Tolerance(2e-3, 2e-3),
}
# M = 1..16 rows (decode steps, speculative drafts), odd N and K (masked tails), bias, and shapes above any
# small-M switch; "decode_wide" has a realistic K and many N tiles.
_CASES = [
    Case("m1", {"m": 1, "n": 96, "k": 64}),
    Case("m1_bias_odd", {"m": 1, "n": 130, "k": 200, "bias": True}),
    Case("m2", {"m": 2, "n": 64, "k": 512}),
    Case("m3_bias", {"m": 3, "n": 72, "k": 96, "bias": True}),
    Case("m4", {"m": 4, "n": 40, "k": 1030}),
    Case("m7", {"m": 7, "n": 48, "k": 80}),
    Case("m16_bias", {"m": 16, "n": 128, "k": 256, "bias": True}),
    Case("decode_wide", {"m": 1, "n": 512, "k": 1024}),
    Case("m33", {"m": 33, "n": 200, "k": 136}),
    Case("large", {"m": 256, "n": 1024, "k": 2048, "bias": True}),
]


def _linear_inputs(p, dtype, device, gen):
    k = p["k"]
    x = randn((p["m"], k), dtype, "cpu", gen)
    x = (special_rows(x) if p.get("special") else x).to(device)
    w = randn((p["n"], k), dtype, device, gen, scale=k ** -0.5)
    b = randn((p["n"],), dtype, device, gen) if p.get("bias") else None
    return x, w, b


def _draw(rng, budget):
    cases = matmul_cases(rng, budget, lambda m, n, k: {"m": m, "n": n, "k": k, "bias": rng.random() < 0.3})
    k = rng.choice(HIDDEN)
    cases.append(Case("draw_special_rows", {"m": 16, "n": _special_n(budget, k), "k": k, "special": True},
                      engine_shape=True))
    return cases


def _special_n(budget, k):
    return max(16, min(1024, budget // (16 * k)) // 16 * 16)


def _fake(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


linear = OpDef(
    name="linear",
    schema="(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
    reference=F.linear,
    fake=_fake,
    make_inputs=_linear_inputs,
    cases=_CASES,
    tolerances=_TOL,
    draw=_draw,
    doc="y = x @ weight.T (+ bias), fp32 accumulation, one rounding to x.dtype. x: [..., K], weight: [N, K], "
        "bias: [N] or None; y: [..., N].",
)
