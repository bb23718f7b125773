"""The native fp16 linear (csrc/fp16_linear*.cpp, the kernel the ppc plugin's VSX path is) through its binding, on
every ISA variant of this CPU, against torch on the same fp16 inputs with fp32 accumulation."""

import pytest
import torch

from engine.platforms.cpu import _native


def fp16_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape[0], w.shape[0], dtype=torch.float16)
    _native.fp16_linear(x.data_ptr(), x.stride(0), w.data_ptr(), w.stride(0), y.data_ptr(), y.stride(0),
                        x.shape[0], w.shape[0], x.shape[1])
    return y


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 37, 576), (3, 8, 33), (11, 65, 200)])
def test_fp16_linear_matches_torch(isa, threads, m, n, k):
    x = torch.randn(m, k).half()
    w = torch.randn(n, k + 3).half()[:, :k]  # strided rows
    want = (x.float() @ w.float().T).half()
    torch.testing.assert_close(fp16_linear(x, w).float(), want.float(), atol=2e-3 * k ** 0.5, rtol=2e-3)


def test_fp16_linear_rejects_bad_shapes():
    x = torch.randn(2, 8).half()
    with pytest.raises(ValueError, match="k > 0"):
        _native.fp16_linear(x.data_ptr(), 8, x.data_ptr(), 8, x.data_ptr(), 8, 2, 2, 0)
