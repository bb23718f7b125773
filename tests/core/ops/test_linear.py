"""linear: the reference is torch's F.linear (the CPU engine's path, unchanged); against a float64 formula; fake
shapes; the cases span M = 1..16 and above; a model's Linear runs the op through a CallSite, and on the cpu
platform (no dense kernel) that is F.linear itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from engine.core.models.layers import Linear
from engine.core.ops import registry as reg_mod
from engine.core.ops.linear import linear as op
from engine.core.ops.registry import KernelRegistry
from engine.platforms.cpu.platform import CpuPlatform

PARAMS = [pytest.param(c, dt, id=f"{c.name}-{str(dt)[6:]}") for c in op.cases for dt in op.dtypes]


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_reference_matches_formula(case, dtype, gen):
    x, w, b = op.make_inputs(case.params, dtype, "cpu", gen)
    expected = x.double() @ w.double().T + (0 if b is None else b.double())
    out = op.reference(x, w, b)
    assert out.dtype == dtype and out.shape == (x.shape[0], w.shape[0])
    tol = op.tolerances[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol.atol, rtol=tol.rtol)


def test_cases_cover_small_and_large_m():
    ms = {c.params["m"] for c in op.cases}
    assert {1, 2, 3, 4, 16} <= ms and max(ms) >= 256
    assert any(c.params.get("bias") for c in op.cases) and any(c.params["k"] % 16 for c in op.cases)


@pytest.mark.parametrize("dtype", op.dtypes)
def test_fake_shapes(dtype):
    with FakeTensorMode():
        out = op.torch_op(torch.empty(2, 3, 64, dtype=dtype), torch.empty(80, 64, dtype=dtype), None)
    assert out.shape == (2, 3, 80) and out.dtype == dtype


def test_torch_op_matches_reference(gen):
    x, w, b = op.make_inputs({"m": 3, "n": 24, "k": 40, "bias": True}, torch.float32, "cpu", gen)
    torch.testing.assert_close(op.torch_op(x, w, b), F.linear(x, w, b))


def test_cpu_platform_runs_f_linear_through_the_call_site(gen):
    """The cpu platform's dense kernels beyond torch's BLAS are fp16 only: an fp32/bf16 Linear resolves to F.linear
    itself (no wrapper), so the CPU engine's speed and its bit-exactness against HF transformers are what they were."""
    cpu = KernelRegistry("cpu")
    CpuPlatform().register_kernels(cpu)
    assert cpu.implementations(op)[-1].fn is F.linear
    before = reg_mod._ACTIVE
    try:
        reg_mod.set_active_registry(cpu)
        w, b = torch.randn(48, 32, generator=gen).bfloat16(), torch.randn(48, generator=gen).bfloat16()
        x = torch.randn(5, 32, generator=gen).bfloat16()
        for bias in (None, b):
            lin = Linear(w, bias)
            assert torch.equal(lin((5,), x), F.linear(x, w, bias))
            assert lin.site.chosen() == {(5,): F.linear}
    finally:
        reg_mod.set_active_registry(before)
