"""The Triton GEMV behind ``linear`` (platforms/triton_kernels/linear.py) against the op's reference: every
conformance case it takes in every dtype, contiguous and strided; what the cases do not reach (every M up to the
switch, tails of K past the tile, tile overrides, K = 0); the hand-off to the vendor BLAS above the switch; on CUDA,
capture in a graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.core.ops import KernelRegistry
from engine.core.ops.linear import linear
from engine.core.testing.conformance import Check, compare, run_check
from engine.platforms.triton_kernels import linear as tl_linear
from tests.platforms.triton_kernels.conftest import CAPABILITY, DEVICE

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    reg = KernelRegistry("triton")
    tl_linear.register(reg, DEVICE, CAPABILITY)
    return reg


def gemv_impl(registry):
    impl = registry.implementations(linear)[0]
    assert impl.name == "triton_gemv"
    return impl


GEMV_CASES = [c for c in linear.cases if c.params["m"] <= tl_linear.MAX_M]


def test_cases_reach_the_gemv_and_past_it():
    assert len(GEMV_CASES) >= 3 and len(GEMV_CASES) < len(linear.cases)


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: c.name)
def test_op_cases(registry, case, dtype, strided, seed):
    run_check(Check(linear, gemv_impl(registry), case, dtype, strided=strided), DEVICE, seed)


def _inputs(m, n, k, dtype, gen, bias=False):
    x = torch.randn(m, k, generator=gen).to(dtype=dtype, device=DEVICE)
    w = (torch.randn(n, k, generator=gen) * max(k, 1) ** -0.5).to(dtype=dtype, device=DEVICE)
    b = torch.randn(n, generator=gen).to(dtype=dtype, device=DEVICE) if bias else None
    return x, w, b


def _check(y, x, w, b, dtype):
    want = F.linear(x.cpu().float(), w.cpu().float(), None if b is None else b.cpu().float()).to(dtype)
    compare(linear, dtype, [y], [want], "triton_gemv")


@pytest.mark.parametrize("m", range(1, tl_linear.KERNEL_MAX_M + 1))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_m_with_a_k_tail(m, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    _, _, block_k, _, _ = tl_linear.gemv_config(m, 10_000, dtype)
    k = block_k + 24  # one full tile, then a masked tail
    x, w, b = _inputs(m, 37, k, dtype, gen, bias=m % 2 == 1)
    _check(tl_linear.triton_gemv(x, w, b), x, w, b, dtype)


@pytest.mark.parametrize("config", [(1, 2, 16, 1, 1), (1, 16, 64, 4, 2)])
def test_tile_override(config, seed):
    gen = torch.Generator().manual_seed(seed)
    x, w, b = _inputs(1, 50, 200, torch.float32, gen, bias=True)
    _check(tl_linear.triton_gemv(x, w, b, config), x, w, b, torch.float32)


def test_empty_k_gives_the_bias(seed):
    gen = torch.Generator().manual_seed(seed)
    x, w, b = _inputs(2, 5, 0, torch.float32, gen, bias=True)
    torch.testing.assert_close(tl_linear.triton_gemv(x, w, b).cpu(), b.cpu().expand(2, 5))
    torch.testing.assert_close(tl_linear.triton_gemv(x, w, None).cpu(), torch.zeros(2, 5))


def test_rows_past_the_kernel_are_an_error(seed):
    x, w, _ = _inputs(tl_linear.KERNEL_MAX_M + 1, 5, 8, torch.float32, torch.Generator().manual_seed(seed))
    with pytest.raises(ValueError, match="F.linear"):
        tl_linear.triton_gemv(x, w, None)


def test_blas_takes_what_the_gemv_declines(registry, seed):
    gen = torch.Generator().manual_seed(seed)
    small, big = _inputs(tl_linear.MAX_M, 8, 16, torch.bfloat16, gen), _inputs(tl_linear.MAX_M + 1, 8, 16,
                                                                              torch.bfloat16, gen)
    assert registry.select(linear, small).name == "triton_gemv"
    assert registry.select(linear, big).name == "torch_blas"
    assert "BLAS runs larger M" in gemv_impl(registry).verdict(big)
    x3 = small[0].view(1, 1, 16)
    assert "x must be [M, K]" in gemv_impl(registry).verdict((x3, small[1], None))
    mixed = (small[0], small[1].float(), None)
    assert "share one dtype" in gemv_impl(registry).verdict(mixed)
    elsewhere = "meta" if DEVICE != "meta" else "cpu"
    moved = tuple(t.to(elsewhere) for t in small[:2]) + (None,)
    assert all(i.verdict(moved) is not None for i in registry.implementations(linear))


def test_declines_rather_than_raises_on_odd_arguments(registry):
    x = torch.zeros(3, device=DEVICE)
    for args in ((x, x, None), (x.view(3, 1), x.view(1, 3), None), ("x", x, None), (x.view(1, 3), x.view(1, 3), x)):
        assert isinstance(gemv_impl(registry).verdict(args), str)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
def test_graph_capture(seed):
    gen = torch.Generator().manual_seed(seed)
    x, w, b = _inputs(1, 4096, 4096, torch.bfloat16, gen, bias=True)
    tl_linear.triton_gemv(x, w, b)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = tl_linear.triton_gemv(x, w, b)
    x.copy_(torch.randn(x.shape, generator=gen).to(x))
    g.replay()
    torch.cuda.synchronize()
    _check(y, x, w, b, torch.bfloat16)
