"""silu_and_mul: reference vs the elementwise formula in float64; fake shapes; torch.ops path; errors."""


import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from engine.core.ops.activation import silu_and_mul as op

PARAMS = [pytest.param(c, dt, id=f"{c.name}-{str(dt)[6:]}") for c in op.cases for dt in op.dtypes]


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_reference_matches_formula(case, dtype, gen):
    (x,) = op.make_inputs(case.params, dtype, "cpu", gen)
    d = x.shape[-1] // 2
    g, u = x.double()[..., :d], x.double()[..., d:]
    expected = g / (1.0 + torch.exp(-g)) * u
    out = op.reference(x)
    assert out.dtype == dtype and out.shape == (*x.shape[:-1], d)
    tol = op.tolerances[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol.atol, rtol=tol.rtol)


def test_gate_and_up_are_not_interchangeable(gen):
    # silu is not symmetric, so a kernel that swaps the halves must differ from the reference.
    (x,) = op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen)
    d = x.shape[-1] // 2
    swapped = torch.cat([x[..., d:], x[..., :d]], -1)
    assert not torch.allclose(op.reference(x), op.reference(swapped), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dtype", op.dtypes)
def test_fake_shapes(dtype):
    with FakeTensorMode():
        out = op.torch_op(torch.empty(2, 3, 2 * 80, dtype=dtype))
    assert out.shape == (2, 3, 80) and out.dtype == dtype


def test_torch_op_matches_call(gen):
    (x,) = op.make_inputs(op.cases[1].params, torch.float32, "cpu", gen)
    torch.testing.assert_close(torch.ops.engine.silu_and_mul(x), op(x), atol=0, rtol=0)


def test_bad_inputs():
    with pytest.raises(ValueError, match="even"):
        op.reference(torch.randn(3, 7))
    with pytest.raises(TypeError, match="dtype"):
        op.reference(torch.ones(3, 8, dtype=torch.int32))


def test_opcheck(gen):
    """torch.library.opcheck: schema (incl. mutation), fake impl vs real outputs, dynamic-shape tracing."""
    torch.library.opcheck(op.torch_op, op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen))
