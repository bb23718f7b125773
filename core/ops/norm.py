"""RMSNorm, plain and fused with the residual add."""

from __future__ import annotations

import torch

from .inputs import randn
from .precision import acc
from .registry import Case, OpDef, Tolerance
from .shapes import row_cases, special_rows

_TOL = {
    torch.float32: Tolerance(1e-5, 1e-5),
    torch.bfloat16: Tolerance(2e-2, 2e-2),
    torch.float16: Tolerance(2e-3, 2e-3),
}
_CASES = [Case("tiny", {"tokens": 3, "hidden": 64}), Case("smollm", {"tokens": 7, "hidden": 576}),
          Case("wide", {"tokens": 5, "hidden": 4096}), Case("odd", {"tokens": 2, "hidden": 100})]


def _draw(rng, budget):
    return row_cases(rng, budget, lambda rows, hidden, special: {"tokens": rows, "hidden": hidden, "special": special})


def _rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = acc(x)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * acc(weight)).to(x.dtype)


def _rms_norm_inputs(p, dtype, device, gen):
    x = randn((p["tokens"], p["hidden"]), dtype, "cpu", gen)
    x = (special_rows(x) if p.get("special") else x).to(device)
    w = randn((p["hidden"],), dtype, device, gen, scale=0.5) + 1
    return x, w.to(dtype), 1e-6


rms_norm = OpDef(
    name="rms_norm",
    schema="(Tensor x, Tensor weight, float eps) -> Tensor",
    reference=_rms_norm_ref,
    fake=lambda x, weight, eps: torch.empty_like(x),
    make_inputs=_rms_norm_inputs,
    cases=_CASES,
    tolerances=_TOL,
    rounded_outputs=True,
    draw=_draw,
    doc="y = x / sqrt(mean(x^2, -1) + eps) * weight, computed in fp32, returned in x.dtype. x: [..., hidden].",
)


def _fused_add_rms_norm_ref(x, residual, weight, eps):
    s = (acc(x) + acc(residual)).to(x.dtype)
    return _rms_norm_ref(s, weight, eps), s


def _fused_add_rms_norm_inputs(p, dtype, device, gen):
    x, w, eps = _rms_norm_inputs(p, dtype, device, gen)
    residual = randn(x.shape, dtype, "cpu", gen)
    return x, (special_rows(residual) if p.get("special") else residual).to(device), w, eps


fused_add_rms_norm = OpDef(
    name="fused_add_rms_norm",
    schema="(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
    reference=_fused_add_rms_norm_ref,
    fake=lambda x, residual, weight, eps: (torch.empty_like(x), torch.empty_like(x)),
    make_inputs=_fused_add_rms_norm_inputs,
    cases=_CASES,
    tolerances=_TOL,
    rounded_outputs=True,
    draw=_draw,
    doc="s = x + residual (rounded to x.dtype); returns (rms_norm(s, weight, eps), s).",
)
