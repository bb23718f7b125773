"""fp16 storage through the native bindings of RMSNorm and SiLU-and-mul (dtype code DTYPE_F16; the ppc platform's
fp16 path), on every ISA variant of this CPU, against the ops' references; codes the kernels do not take are
refused with the reason."""

import pytest
import torch

from engine.core.ops.activation import silu_and_mul
from engine.core.ops.norm import rms_norm
from engine.platforms.cpu import _native


@pytest.mark.parametrize("rows,hidden", [(1, 1), (3, 37), (5, 576), (2, 1001)])
def test_rms_norm_fp16(isa, threads, rows, hidden):
    x = torch.randn(rows, hidden).half()
    w = (1 + 0.1 * torch.randn(hidden)).half()
    out = torch.empty_like(x)
    _native.rms_norm(x.data_ptr(), hidden, w.data_ptr(), out.data_ptr(), hidden, rows, hidden, 1e-6,
                     _native.DTYPE_F16)
    tol = rms_norm.tolerances[torch.float16]
    torch.testing.assert_close(out, rms_norm.reference(x, w, 1e-6), atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("rows,d", [(1, 1), (4, 19), (3, 256), (2, 1001)])
def test_silu_and_mul_fp16(isa, threads, rows, d):
    x = (2 * torch.randn(rows, 2 * d)).half()
    out = torch.empty(rows, d, dtype=torch.float16)
    _native.silu_and_mul(x.data_ptr(), 2 * d, out.data_ptr(), d, rows, d, _native.DTYPE_F16)
    tol = silu_and_mul.tolerances[torch.float16]
    torch.testing.assert_close(out, silu_and_mul.reference(x), atol=tol.atol, rtol=tol.rtol)


def test_unknown_dtype_code_is_refused():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"2 \(fp16\), got 3"):
        _native.rms_norm(x.data_ptr(), 8, x.data_ptr(), x.data_ptr(), 8, 2, 8, 1e-6, 3)
