"""fp8_quantize_per_token's reference against an independent quantizer: float64 arithmetic (a float64 quotient
rounded once to fp32 is the correctly rounded fp32 quotient) and the FP8 code tables built from the published bit
layouts, searched for the nearest value with ties to the even code."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from engine.core.ops.fp8 import fp8_linear, quantize_fp8
from engine.core.ops.fp8_quant import fp8_quantize_per_token as op

X_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def code_table(name: str) -> np.ndarray:
    """Values of the non-negative codes, in code order: e4m3fn (bias 7) 0..0x7E, 0x7F being NaN; e4m3fnuz (bias 8)
    0..0x7F (240), its only NaN being 0x80."""
    bias = 7 if name == "e4m3fn" else 8
    vals = [2.0 ** (e - bias) * (1 + m / 8) if e else 2.0 ** (1 - bias) * m / 8 for e in range(16) for m in range(8)]
    return np.array(vals[:127] if name == "e4m3fn" else vals)


def independent(x: torch.Tensor, name: str, group: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes as uint8 [M, K], scales as float32 [M, G])."""
    table = code_table(name)
    qmax = table[-1]
    xd = x.double().numpy()
    m, k = xd.shape
    g = group or k
    ng = math.ceil(k / g)
    padded = np.zeros((m, ng * g))
    padded[:, :k] = xd
    amax = np.abs(padded.reshape(m, ng, g)).max(axis=2)
    floor = np.float64(np.float32(1e-12))  # the clamp happens on fp32 amax values
    scale = (np.maximum(amax, floor) / qmax).astype(np.float32)  # amax is exact; one rounding of the quotient
    full = np.repeat(scale.astype(np.float64), g, axis=1)[:, :k]
    v = np.abs((xd / full).astype(np.float32).astype(np.float64))  # the correctly rounded fp32 quotient
    v = np.minimum(v, qmax)
    hi = np.minimum(np.searchsorted(table, v), len(table) - 1)  # first code >= v
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = v - table[lo], table[hi] - v
    code = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    neg = np.signbit(xd)
    if name == "e4m3fnuz":
        neg &= code != 0  # no negative zero (0x80 is NaN)
    return (code | (neg << 7)).astype(np.uint8), scale


def check(x, name, group):
    q, s = op.reference(x, name, group)
    want_q, want_s = independent(x, name, group)
    assert q.dtype == {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[name]
    assert s.dtype == torch.float32 and s.shape == want_s.shape == (x.shape[0], math.ceil(x.shape[1] / (group or
                                                                                                       x.shape[1])))
    np.testing.assert_array_equal(s.numpy(), want_s)
    np.testing.assert_array_equal(q.view(torch.uint8).numpy(), want_q)


@pytest.mark.parametrize("dtype", X_DTYPES, ids=str)
@pytest.mark.parametrize("case", op.cases, ids=lambda c: c.name)
def test_cases_match_independent_quantizer(case, dtype, gen):
    x, name, group = op.make_inputs(dict(case.params), dtype, "cpu", gen)
    check(x, name, group)


@pytest.mark.parametrize("name", ["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("group,k", [(0, 1), (0, 333), (64, 300), (100, 300), (128, 127), (128, 1000)])
def test_groups_of_any_width(name, group, k, gen):
    x = torch.randn(6, k, generator=gen) * torch.rand(6, 1, generator=gen).mul(8).exp2()
    check(x.bfloat16(), name, group)
    check(x, name, group)


@pytest.mark.parametrize("name", ["e4m3fn", "e4m3fnuz"])
def test_every_code_and_tie(name):
    """A row whose scale is exactly 1: every finite code, every midpoint (ties go to the even code) and the fp32
    values either side of each midpoint, both signs, plus values that round to (negative) zero."""
    vals = torch.tensor(code_table(name), dtype=torch.float32)
    mids = (vals[1:] + vals[:-1]) / 2
    row = torch.cat([vals, mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1),
                     vals[1:2] / 4, vals[1:2] / 2])
    x = torch.cat([row, -row])[None]
    check(x, name, 0)
    q, s = op.reference(x, name, 0)
    assert s.item() == 1.0
    codes = q.view(torch.uint8)[0, : len(vals)]
    assert torch.equal(codes, torch.arange(len(vals), dtype=torch.uint8))  # each code maps to itself


def test_matches_quantize_fp8_and_feeds_fp8_linear(gen):
    x = torch.randn(5, 256, generator=gen).bfloat16()
    q0, s0 = op.reference(x, "e4m3fn", 0)
    q1, s1 = quantize_fp8(x, "token", torch.float8_e4m3fn)
    assert torch.equal(q0.view(torch.uint8), q1.view(torch.uint8)) and torch.equal(s0, s1)
    q, s = op.reference(x, "e4m3fn", 128)
    assert s.shape == (5, 2)  # the 1x128 layout fp8_linear reads
    w_q, w_s = quantize_fp8(torch.randn(64, 256, generator=gen).bfloat16(), "block", torch.float8_e4m3fn, (128, 128))
    out = fp8_linear.reference(q, s, w_q, w_s, None, torch.float32)
    want = x.float() @ (w_q.float() * w_s.repeat_interleave(128, 0)[:64].repeat_interleave(128, 1)).t()
    assert ((out - want).norm() / want.norm()) < 0.05


def test_zero_row_and_edges():
    x = torch.zeros(2, 130)
    x[1, 0] = -1e-30  # far below any code: -0 in e4m3fn
    q, s = op.reference(x, "e4m3fn", 128)
    assert torch.all(q.float() == 0) and torch.all(s == torch.tensor(1e-12) / 448)
    assert q.view(torch.uint8)[1, 0] == 0x80 and q.view(torch.uint8)[0, 0] == 0
    q, _ = op.reference(x, "e4m3fnuz", 0)
    assert torch.all(q.view(torch.uint8) == 0)  # e4m3fnuz has no -0


def test_fake_and_torch_op():
    with FakeTensorMode():
        x = torch.empty(7, 300, dtype=torch.bfloat16, device="cuda")
        q, s = torch.ops.engine.fp8_quantize_per_token(x, "e4m3fnuz", 128)
        assert q.dtype == torch.float8_e4m3fnuz and q.shape == (7, 300) and q.device.type == "cuda"
        assert s.dtype == torch.float32 and s.shape == (7, 3) and s.device.type == "cuda"
        _, s = op.fake(x, "e4m3fn", 0)
        assert s.shape == (7, 1)


@pytest.mark.parametrize("args,exc", [
    ((torch.randn(2, 3, 4), "e4m3fn", 0), ValueError),
    ((torch.randn(2, 4).double(), "e4m3fn", 0), TypeError),
    ((torch.randn(2, 4), "e5m2", 0), ValueError),
    ((torch.randn(2, 4), "e4m3fn", -1), ValueError),
])
def test_refuses_bad_arguments(args, exc):
    with pytest.raises(exc):
        op.reference(*args)
    with pytest.raises(exc):
        op.fake(*args)
