"""Triton int4_linear (platforms/triton_kernels/int4_linear.py): both kernels (GEMV with and without split-K, tensor
cores with and without split-K) against the op's reference on random codes, scales and zero points, for every x
dtype, symmetric and asymmetric weights, every group size the checkpoints use, odd N, bias, unaligned storage;
supports() declining with reasons."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.int4 import _int4_linear_inputs, _int4_linear_ref, int4_linear
from engine.platforms.triton_kernels import int4_linear as kmod
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
    return _int4_linear_inputs({"m": m, "n": n, "k": k, "group": group, "zero": zero, "bias": bias, "sdt": sdt},
                               dtype, DEVICE, gen)


def _check(args, dtype, **kw):
    got = kmod.int4_linear_triton(*args, **kw)
    want = _int4_linear_ref(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    scale = want.float().abs().amax().item() + 1e-6
    err = (got.float() - want.float()).abs().amax().item()
    assert err <= TOL[dtype] * scale, (err, scale, kw)
    return err


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k,group,zero,bias", [(1, 24, 64, 32, False, False), (1, 40, 256, 128, True, True),
                                                   (2, 33, 96, 96, True, False), (3, 64, 320, 128, True, True),
                                                   (4, 72, 512, 64, False, True), (9, 48, 256, 128, True, False),
                                                   (33, 70, 384, 128, True, True), (80, 96, 576, 64, False, True)])
def test_linear_matches_reference(registry, m, n, k, group, zero, bias, dtype, seed):
    run_case(registry, "int4_linear", "triton_int4_w4a16",
             {"m": m, "n": n, "k": k, "group": group, "zero": zero, "bias": bias}, dtype, seed)


@pytest.mark.parametrize("kernel", ["gemv", "dot"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_both_kernels_every_code_and_zero(kernel, dtype, seed):
    """Every code 0..15 against every zero point 0..15 in one weight, on both kernels at M = 3."""
    args = list(_inputs(3, 256, 256, 32, dtype, seed))
    codes = torch.arange(256 * 256, device=DEVICE).remainder(16).reshape(256, 256).to(torch.uint8)
    args[1] = codes[:, 0::2] | (codes[:, 1::2] << 4)
    args[3] = torch.arange(256 * 8, device=DEVICE).div(3, rounding_mode="floor").remainder(16).reshape(256, 8).to(
        torch.uint8)
    _check(tuple(args), dtype, kernel=kernel)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("kernel", ["gemv", "dot"])
def test_split_k_with_bias(kernel, splits, seed):
    args = _inputs(2, 40, 1024, 128, torch.float32, seed, bias=True)
    _check(args, torch.float32, kernel=kernel, config={"splits": splits})


def test_scale_dtypes_and_whole_row_group(seed):
    for sdt in (torch.bfloat16, torch.float32):
        _check(_inputs(1, 24, 192, 192, torch.bfloat16, seed, sdt=sdt), torch.bfloat16)
        _check(_inputs(20, 24, 192, 192, torch.bfloat16, seed, sdt=sdt), torch.bfloat16)


def test_unaligned_weight_storage_and_strided_x(seed):
    x, packed, scale, zero, g, bias = _inputs(2, 16, 128, 64, torch.bfloat16, seed)
    store = torch.empty(packed.numel() + 3, dtype=torch.uint8, device=DEVICE)
    odd = store[3:].view(packed.shape)
    odd.copy_(packed)
    wide = torch.empty((2, 256), dtype=x.dtype, device=DEVICE)
    wide[:, :128] = x
    for kernel in ("gemv", "dot"):
        _check((wide[:, :128], odd, scale, zero, g, bias), torch.bfloat16, kernel=kernel)


def test_empty(seed):
    x, packed, scale, zero, g, bias = _inputs(1, 16, 64, 32, torch.float32, seed)
    assert kmod.int4_linear_triton(x[:0], packed, scale, zero, g, bias).shape == (0, 16)


def test_supports_declines_with_reasons(registry, seed):
    sup = kmod.supports_for(DEVICE)
    x, packed, scale, zero, g, bias = _inputs(2, 16, 64, 32, torch.float32, seed)
    assert sup(x, packed, scale, zero, g, bias) is True
    assert "multiples of 32" in sup(x, packed, scale, zero, 48, bias)
    assert "w_zero" in sup(x, packed, scale, zero.to(torch.int32), g, bias)
    assert "K=" in sup(x[:, :32], packed, scale, zero, g, bias)
    assert "2-D" in sup(x.to(torch.int32), packed, scale, zero, g, bias)
    assert "contiguous" in sup(x, packed, scale.t().contiguous().t(), zero, g, bias)
    assert "bias" in sup(x, packed, scale, zero, g, torch.zeros(3, device=DEVICE))
    other = "cuda" if DEVICE == "cpu" else "cpu"
    assert "device" in kmod.supports_for(other)(x, packed, scale, zero, g, bias)
    assert [i.name for i in registry.implementations(int4_linear)] == ["triton_int4_w4a16"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize("m", [1, 16, 70])
def test_dot_ptx_decode(m, zero, dtype, seed):
    """The inline-PTX decode of the tensor-core kernel (GPU, sm_90+) against the reference; the scale's rounding to x's
    dtype stays inside the op's tolerance."""
    if not kmod.ptx_sm90(torch.device(DEVICE)):
        pytest.skip("inline PTX runs on NVIDIA GPUs of compute capability >= 9.0 only (not under the interpreter)")
    args = _inputs(m, 136, 512, 128, dtype, seed, zero=zero, bias=True)
    for planes in (True, False):
        _check(args, dtype, kernel="dot", config={"asm": True, "planes": planes})
        _check(args, dtype, kernel="dot", config={"asm": False, "planes": planes})


def test_ptx_gate_off_a_gpu():
    assert kmod.ptx_sm90(torch.device("cpu")) is False
    if DEVICE == "cpu":  # the interpreter: never PTX, whatever the config asks
        x, packed, scale, zero, g, bias = _inputs(3, 16, 64, 32, torch.bfloat16, 0)
        _check((x, packed, scale, zero, g, bias), torch.bfloat16, kernel="dot", config={"asm": True})


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mantissa", [False, True])
@pytest.mark.parametrize("zero", [False, True])
def test_gemv_both_decodes(mantissa, zero, dtype, seed):
    """The GEMV's two decodes (a shift per value, or nibbles in place with x taking the powers of two) at M = 1..4,
    every code against every zero point."""
    for m in (1, 4):
        args = list(_inputs(m, 64, 512, 64, dtype, seed, zero=zero, bias=True))
        codes = torch.arange(64 * 512, device=DEVICE).remainder(16).reshape(64, 512).to(torch.uint8)
        args[1] = codes[:, 0::2] | (codes[:, 1::2] << 4)
        _check(tuple(args), dtype, kernel="gemv", config={"mantissa": mantissa})


@pytest.mark.parametrize("group", [32, 64, 128, 256])
def test_dot_one_group_per_step_and_not(group, seed):
    """The tensor-core kernel's scale loads: once per row and step where a step lies in one group (group 128 and 256
    with 128-value steps), once per word where it spans several (32, 64); split K too."""
    for splits in (1, 3):
        args = _inputs(20, 40, 1024, group, torch.float32, seed, zero=True, bias=True)
        _check(args, torch.float32, kernel="dot", config={"splits": splits, "block_t": 16})


def test_plane_order_puts_nibble_pairs_together(seed):
    """plane_order: in each run of 8 T columns, columns 8t + e and 8t + e + 4 go to 2 e T + 2 t and the one after."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 256, generator=gen)
    for t in (4, 16):
        got = kmod.plane_order(x, t)
        for step in range(256 // (8 * t)):
            for e in range(4):
                for j in range(t):
                    for h in range(2):
                        assert torch.equal(got[:, step * 8 * t + 2 * e * t + 2 * j + h],
                                           x[:, step * 8 * t + 8 * j + e + 4 * h])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize("planes,ahead,widen", [(True, False, True), (True, False, False), (True, True, True),
                                                (False, False, True), (False, True, True)])
def test_dot_plane_pairs_and_k_order(planes, ahead, widen, zero, dtype, seed):
    """The tensor-core step both ways (four dots on plane pairs against x in plane_order, or the planes put back in K
    order), with and without the scales loaded a step ahead, groups of 32 / 64 with one scale load a group widened
    or a per-word tile; K of whole steps, split K, and a K that is not whole steps (always K order)."""
    cfg = {"planes": planes, "ahead": ahead, "widen": widen, "block_t": 16}
    for m, k, group, splits in ((20, 1024, 128, 1), (20, 1024, 128, 2), (7, 384, 64, 1), (33, 320, 32, 1),
                                (18, 512, 32, 1), (5, 1024, 64, 2)):  # groups of 32 / 64: several a step
        args = list(_inputs(m, 48, k, group, dtype, seed, zero=zero, bias=True))
        if k == 1024:  # every code against every zero point
            codes = torch.arange(48 * k, device=DEVICE).remainder(16).reshape(48, k).to(torch.uint8)
            args[1] = codes[:, 0::2] | (codes[:, 1::2] << 4)
        _check(tuple(args), dtype, kernel="dot", config={**cfg, "splits": splits})


def test_default_gemv_rows_follow_the_group_size(monkeypatch):
    """The GEMV is the default up to 2 rows where tensor-core steps lie in one group (groups of 128+, a whole row),
    up to 4 for groups of 32 / 64 while their widened scale loads are off."""
    bf16 = torch.bfloat16
    assert kmod.default_gemv_max_m(128, 4096, bf16) == kmod.default_gemv_max_m(4096, 4096, bf16) == 2
    monkeypatch.setattr(kmod, "DOT_WIDEN", False)
    assert kmod.default_gemv_max_m(32, 4096, bf16) == kmod.default_gemv_max_m(64, 4096, bf16) == 4
    monkeypatch.setattr(kmod, "DOT_WIDEN", True)
    assert kmod.default_gemv_max_m(32, 4096, bf16) == 2
