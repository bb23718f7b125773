"""Triton int8_linear (platforms/triton_kernels/int8_linear.py): both kernels (GEMV and tensor cores, with and without
split-K) against the op's reference on random codes, scales and zero points, for every x dtype, symmetric and
asymmetric weights, every group size the checkpoints use (GGUF Q8_0's 32 included), odd N, bias; supports()
declining with reasons."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.int8 import _int8_linear_inputs, _int8_linear_ref, int8_linear
from engine.platforms.triton_kernels import int8_linear as kmod
from tests.platforms.triton_kernels.conftest import CAPABILITY, DEVICE, run_case

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    reg = KernelRegistry("triton")
    kmod.register(reg, DEVICE, CAPABILITY)
    return reg


def _inputs(m, n, k, group, dtype, seed, zero=True, bias=False, sdt=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    return _int8_linear_inputs({"m": m, "n": n, "k": k, "group": group, "zero": zero, "bias": bias, "sdt": sdt},
                               dtype, DEVICE, gen)


def _check(args, dtype, **kw):
    got = kmod.int8_linear_triton(*args, **kw)
    want = _int8_linear_ref(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    scale = want.float().abs().amax().item() + 1e-6
    err = (got.float() - want.float()).abs().amax().item()
    assert err <= TOL[dtype] * scale, (err, scale, kw)
    return err


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k,group,zero,bias", [(1, 24, 64, 32, False, False), (1, 40, 1024, 128, True, True),
                                                   (2, 33, 96, 96, True, False), (3, 64, 320, 128, True, True),
                                                   (4, 72, 512, 32, False, True), (9, 48, 256, 128, True, False),
                                                   (33, 70, 384, 32, False, True), (80, 96, 576, 64, True, True)])
def test_linear_matches_reference(registry, m, n, k, group, zero, bias, dtype, seed):
    run_case(registry, "int8_linear", "triton_int8_w8a16",
             {"m": m, "n": n, "k": k, "group": group, "zero": zero, "bias": bias}, dtype, seed)


@pytest.mark.parametrize("kernel", ["gemv", "dot"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("zero", [False, True])
def test_both_kernels_every_code_and_zero(kernel, zero, dtype, seed):
    """Every code 0..255 in every row, against zero points 0..255 (or none), on both kernels at M = 3."""
    args = list(_inputs(3, 64, 512, 32, dtype, seed, zero=zero))
    args[1] = torch.arange(64 * 512, device=DEVICE).remainder(256).reshape(64, 512).to(torch.uint8)
    if zero:
        args[3] = torch.arange(64 * 16, device=DEVICE).mul(7).remainder(256).reshape(64, 16).to(torch.uint8)
    _check(tuple(args), dtype, kernel=kernel)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("kernel", ["gemv", "dot"])
def test_split_k_with_bias(kernel, splits, seed):
    args = _inputs(2, 40, 2048, 128, torch.float32, seed, bias=True)
    _check(args, torch.float32, kernel=kernel, config={"splits": splits})


@pytest.mark.parametrize("group", [32, 64, 128, 256])
def test_dot_step_inside_each_group(group, seed):
    """The tensor-core kernel's K step divides the group (scales once a step); a whole-row group takes any step."""
    assert group % kmod.dot_config(20, 1024, group, torch.bfloat16)["block_k"] == 0
    _check(_inputs(20, 40, 1024, group, torch.bfloat16, seed), torch.bfloat16, kernel="dot")
    _check(_inputs(20, 40, 192, 192, torch.bfloat16, seed), torch.bfloat16, kernel="dot")
    with pytest.raises(ValueError, match="divide the group"):
        kmod.int8_linear_triton(*_inputs(20, 40, 256, 32, torch.bfloat16, seed), kernel="dot",
                                config={"block_k": 64})


def test_scale_dtypes_strided_x_and_empty(seed):
    for sdt in (torch.bfloat16, torch.float32):
        _check(_inputs(1, 24, 192, 64, torch.bfloat16, seed, sdt=sdt), torch.bfloat16)
        _check(_inputs(20, 24, 192, 64, torch.bfloat16, seed, sdt=sdt), torch.bfloat16)
    x, codes, scale, zero, g, bias = _inputs(2, 16, 128, 64, torch.bfloat16, seed)
    wide = torch.empty((2, 256), dtype=x.dtype, device=DEVICE)
    wide[:, :128] = x
    for kernel in ("gemv", "dot"):
        _check((wide[:, :128], codes, scale, zero, g, bias), torch.bfloat16, kernel=kernel)
    assert kmod.int8_linear_triton(x[:0], codes, scale, zero, g, bias).shape == (0, 16)


def test_supports_declines_with_reasons(registry, seed):
    sup = kmod.supports_for(DEVICE)
    x, codes, scale, zero, g, bias = _inputs(2, 16, 64, 32, torch.float32, seed)
    assert sup(x, codes, scale, zero, g, bias) is True
    assert "multiples of 32" in sup(x, codes, scale, zero, 48, bias)
    assert "w_zero" in sup(x, codes, scale, zero.to(torch.int32), g, bias)
    assert "K=" in sup(x[:, :32], codes, scale, zero, g, bias)
    assert "w_codes" in sup(x, codes.to(torch.int8), scale, zero, g, bias)
    assert "2-D" in sup(x.to(torch.int32), codes, scale, zero, g, bias)
    assert "contiguous" in sup(x, codes, scale.t().contiguous().t(), zero, g, bias)
    assert "bias" in sup(x, codes, scale, zero, g, torch.zeros(3, device=DEVICE))
    other = "cuda" if DEVICE == "cpu" else "cpu"
    assert "device" in kmod.supports_for(other)(x, codes, scale, zero, g, bias)
    assert [i.name for i in registry.implementations(int8_linear)] == ["triton_int8_w8a16"]
