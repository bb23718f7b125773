"""Triton NVFP4 kernels (platforms/triton_kernels/nvfp4.py): quantize bit-exact against the reference (random inputs
and crafted e4m3 / e2m1 ties, zero blocks, saturation), the W4A16 linear on both kernels (GEMV with and without
split-K, tensor cores) for every claimed dtype, odd N and bias; the Blackwell gate and the cuBLAS scale layout on
their own; the native path's glue against an emulated ``torch._scaled_mm``; supports() declining with reasons."""

from __future__ import annotations

import types

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.nvfp4 import (
    E2M1_VALUES,
    _nvfp4_linear_inputs,
    _nvfp4_linear_ref,
    _nvfp4_linear_w4a4_inputs,
    _nvfp4_linear_w4a4_ref,
    _nvfp4_quantize_ref,
    e2m1_decode,
    nvfp4_global_scale,
    nvfp4_linear,
    nvfp4_linear_w4a4,
    nvfp4_quantize,
    unpack,
)
from engine.platforms.triton_kernels import nvfp4 as kmod
from tests.platforms.triton_kernels.conftest import CAPABILITY, DEVICE, run_case


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    # Our own registry (the session one imports every kernel module, some of which are still being written).
    reg = KernelRegistry("triton")
    kmod.register(reg, DEVICE, CAPABILITY)
    return reg


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _assert_quantize_exact(x, gs):
    packed, scales = kmod.quantize(x, gs)
    want_packed, want_scales = _nvfp4_quantize_ref(x, gs)
    assert scales.dtype == torch.float8_e4m3fn and packed.dtype == torch.uint8
    assert torch.equal(scales.view(torch.uint8), want_scales.view(torch.uint8))
    assert torch.equal(packed, want_packed)


# ---------------------------------------------------------------------------------------------------- quantize


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m,k", [(1, 16), (3, 32), (9, 112), (20, 576)])
def test_quantize_matches_reference(registry, m, k, dtype, seed):
    run_case(registry, "nvfp4_quantize", "triton_nvfp4_quantize", {"m": m, "n": 8, "k": k}, dtype, seed)


def test_quantize_fp16_and_conventional_scale(seed):
    """fp16 x (claimed, not in the op's table), and the plain 448*6/amax scale whose ties the op's generator avoids."""
    g = _gen(seed)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = (torch.randn(17, 256, generator=g) * torch.exp2(torch.randint(-8, 4, (17, 16, 1), generator=g))
             .repeat_interleave(16, 1).reshape(17, 256)).to(dtype).to(DEVICE)
        _assert_quantize_exact(x, nvfp4_global_scale(x))


def test_quantize_e4m3_rounding_sweep():
    """Block scales landing on every e4m3 value, every midpoint between neighbours (ties to even) and a hair
    either side, the subnormal range, and above 448 (saturation). With gs = 1 and amax = 6 t, the scale is exactly t."""
    e4m3 = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mids = (e4m3[1:] + e4m3[:-1]) / 2
    t = torch.cat([e4m3, mids, mids * (1 + 2**-20), mids * (1 - 2**-20), torch.tensor([449.0, 464.0, 500.0, 1e6])])
    x = torch.zeros(t.numel(), 16)
    x[:, 0] = 6 * t
    x[:, 1:] = (6 * t)[:, None] * torch.linspace(-0.99, 0.99, 15)
    _assert_quantize_exact(x.to(DEVICE), torch.tensor([1.0], device=DEVICE))


def test_quantize_e2m1_ties_zero_blocks_and_saturation():
    """Values on every e2m1 midpoint (scale 1, so v = x exactly), -0 for tiny negatives, all-zero blocks (scale 0),
    blocks whose scale underflows e4m3, and a global scale so large that scales saturate at 448 and |v| > 6."""
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    row = torch.tensor([6.0, *mids, *[-v for v in mids], -0.1])  # 16 values, amax 6 -> scale 1 with gs = 1
    x = torch.stack([row, -row, row.flip(0), torch.zeros(16), -torch.zeros(16), row * 1e-9, row * 3])
    for gs in (1.0, 1e4):
        _assert_quantize_exact(x.to(DEVICE), torch.tensor([gs], device=DEVICE))


def test_quantize_empty():
    packed, scales = kmod.quantize(torch.zeros(0, 32, device=DEVICE), torch.ones(1, device=DEVICE))
    assert packed.shape == (0, 16) and scales.shape == (0, 2)


# ---------------------------------------------------------------------------------------------------- W4A16 linear

LINEAR_SHAPES = [  # (m, n, k, bias): decode rows, the GEMV's widest M, tensor cores at 5, 16 and a prefill; odd N
    (1, 64, 256, True),
    (3, 24, 32, False),
    (4, 37, 112, True),
    (5, 80, 576, False),
    (16, 40, 160, True),
    (33, 17, 96, True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m,n,k,bias", LINEAR_SHAPES, ids=lambda v: str(v))
def test_linear_matches_reference(registry, m, n, k, bias, dtype, seed):
    run_case(registry, "nvfp4_linear", "triton_nvfp4_w4a16", {"m": m, "n": n, "k": k, "bias": bias}, dtype, seed)


@pytest.mark.parametrize("m", [1, 4, 16])
def test_linear_fp16(m, seed):
    x, w, bs, gs, bias = _nvfp4_linear_inputs({"m": m, "n": 48, "k": 256, "bias": True}, torch.float16, DEVICE,
                                              _gen(seed))
    got = kmod.w4a16_linear(x, w, bs, gs, bias)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), _nvfp4_linear_ref(x, w, bs, gs, bias).float(), atol=1e-2, rtol=2e-3)


def _random_codes_and_scales(n, k, gen):
    """Every byte value and every finite e4m3 scale (subnormals and 0 included), not only what quantize writes."""
    w = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    bs = torch.randint(0, 0x7F, (n, k // 16), generator=gen, dtype=torch.uint8)
    bs[0, :8] = torch.arange(8, dtype=torch.uint8)  # 0 and all seven subnormals
    return w.to(DEVICE), bs.view(torch.float8_e4m3fn).to(DEVICE)


@pytest.mark.parametrize("kernel", ["gemv", "dot"])
def test_both_kernels_all_codes_and_scales(kernel, seed):
    g = _gen(seed)
    w, bs = _random_codes_and_scales(24, 256, g)
    gs = torch.tensor([7.3], device=DEVICE)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(3, 256, generator=g).to(dtype).to(DEVICE)
        bias = torch.randn(24, generator=g).to(dtype).to(DEVICE)
        got = kmod.w4a16_linear(x, w, bs, gs, bias, kernel=kernel)
        want = _nvfp4_linear_ref(x, w, bs, gs, bias)
        tol = nvfp4_linear.tolerances[dtype]
        scale = want.float().abs().max().item()  # random scales up to 448: compare relative to the output range
        torch.testing.assert_close(got.float() / scale, want.float() / scale, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("cfg", [{"asm": False, "sblk": False}, {"asm": True, "sblk": False},
                                 {"asm": False, "sblk": True}, {"asm": True, "sblk": True, "splits": 3},
                                 {"asm": True, "korder": False}, {"asm": True, "pairs": True},
                                 {"asm": False, "pairs": True, "splits": 2}, {"asm": True, "pairs": True, "splits": 3}],
                         ids=["triton_decode", "asm", "sblk", "asm_sblk_split", "planes", "pairs", "pairs_triton_split",
                              "pairs_split3"])
def test_dot_decode_variants(cfg, seed):
    """The tensor-core kernel's decode variants: the inline-PTX decode (GPU only; the interpreter runs the Triton
    decode) and the once-per-block scale loads, on every code and every scale (subnormals too), for each x dtype;
    K order off falls back to the plane-wise dots; the plane-pair dots against x in plane_order, split K too."""
    g = _gen(seed)
    w, bs = _random_codes_and_scales(40, 512, g)
    gs = torch.tensor([5.1], device=DEVICE)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = torch.randn(5, 512, generator=g).to(dtype).to(DEVICE)
        got = kmod.w4a16_linear(x, w, bs, gs, None, kernel="dot", config=dict(cfg, block_n=16))
        want = _nvfp4_linear_ref(x, w, bs, gs, None)
        tol = nvfp4_linear.tolerances[torch.bfloat16 if dtype == torch.float16 else dtype]  # the op lists no fp16
        scale = want.float().abs().max().item()
        torch.testing.assert_close(got.float() / scale, want.float() / scale, atol=tol.atol, rtol=tol.rtol)


def test_gemv_split_k(seed):
    """Few rows of W and a long K: the GEMV splits K and sums fp32 partials (then adds the bias)."""
    n, k = 7, 2048
    _, splits, _ = kmod.gemv_plan(n, k // 16, kmod.sm_count(torch.device(DEVICE), kmod.INTERPRETER_SMS))
    assert splits > 1
    for m, dtype, bias in ((1, torch.float32, True), (2, torch.bfloat16, False), (3, torch.float32, True)):
        x, w, bs, gs, b = _nvfp4_linear_inputs({"m": m, "n": n, "k": k, "bias": bias}, dtype, DEVICE, _gen(seed))
        tol = nvfp4_linear.tolerances[dtype]
        torch.testing.assert_close(kmod.w4a16_linear(x, w, bs, gs, b, kernel="gemv"),
                                   _nvfp4_linear_ref(x, w, bs, gs, b), atol=tol.atol, rtol=tol.rtol)


def test_unaligned_weight_storage(seed):
    """A packed weight viewed at an odd byte offset cannot be read as int32 words: it is copied, not misread."""
    x, w, bs, gs, bias = _nvfp4_linear_inputs({"m": 1, "n": 8, "k": 64, "bias": False}, torch.float32, DEVICE,
                                              _gen(seed))
    storage = torch.empty(w.numel() + 1, dtype=torch.uint8, device=DEVICE)
    shifted = storage[1:].view(w.shape)
    shifted.copy_(w)
    assert shifted.data_ptr() % 4
    for kernel in ("gemv", "dot"):
        torch.testing.assert_close(kmod.w4a16_linear(x, shifted, bs, gs, None, kernel=kernel),
                                   _nvfp4_linear_ref(x, w, bs, gs, None), atol=1e-4, rtol=1e-4)


def test_linear_strided_x_and_empty(seed):
    g = _gen(seed)
    x, w, bs, gs, bias = _nvfp4_linear_inputs({"m": 2, "n": 16, "k": 64, "bias": True}, torch.float32, DEVICE, g)
    xs = torch.randn(2, 128, generator=g).to(DEVICE)[:, ::2]
    torch.testing.assert_close(kmod.w4a16_linear(xs, w, bs, gs, bias), _nvfp4_linear_ref(xs, w, bs, gs, bias),
                               atol=1e-4, rtol=1e-4)
    assert kmod.w4a16_linear(x[:0], w, bs, gs, bias).shape == (0, 16)


def test_gemv_config():
    """M = 1: fewer rows per program before K is split (1024 rows on 132 SMs: 512 programs of 2 rows, then a split),
    none for the H200 shapes; M > 1 the multi-row tile; the GEMV is the default kernel up to GEMV_MAX_M rows of x."""
    tile = (kmod.GEMV_BLOCK_N, kmod.GEMV_BLOCK_B, kmod.GEMV_WARPS, kmod.GEMV_PROGRAMS_PER_SM)
    assert kmod.gemv_config(14336, 1, 132) == tile
    assert kmod.gemv_config(4096, 1, 132) == tile
    assert kmod.gemv_plan(4096, 896, 132, *tile[:2], tile[3])[1] == 1  # 4096 x 14336: 1024 programs, K not split
    assert kmod.gemv_config(1024, 1, 132)[0] == kmod.GEMV_MIN_BLOCK_N
    assert kmod.gemv_config(4096, 3, 132) == (kmod.GEMV_MR_BLOCK_N, kmod.GEMV_MR_BLOCK_B, kmod.GEMV_MR_WARPS,
                                              kmod.PROGRAMS_PER_SM)
    assert 1 <= kmod.GEMV_MAX_M <= 4


def test_gemv_plan():
    assert kmod.gemv_plan(14336, 256, 132)[1] == 1  # up/gate projections: enough rows
    # down projection: 512 programs of 8 rows -> 1024; at the default 4 rows, 1024 programs -> 2048
    assert kmod.gemv_plan(4096, 896, 132, block_n=8, block_b=256) == (256, 2, 512)
    assert kmod.gemv_plan(4096, 896, 132, block_n=4, block_b=128) == (128, 2, 512)
    assert kmod.gemv_plan(4096, 896, 132, block_n=4, block_b=128, splits=4) == (128, 4, 256)  # asked for (tuning)
    block_b, splits, per_split = kmod.gemv_plan(576, 36, 132)
    assert splits > 1 and per_split % block_b == 0 and per_split * (splits - 1) < 36 <= per_split * splits


def test_split_plan():
    """The dot kernel's split-K: enough programs for the SMs, whole K steps per split, no empty split."""
    assert kmod.split_plan(32, 56, 32, 132, 4) == (14, 128)  # 4096 x 14336, BLOCK_N 128: 448 programs
    assert kmod.split_plan(112, 16, 32, 132, 4) == (4, 128)  # 14336 x 4096
    assert kmod.split_plan(1000, 16, 32, 132, 4) == (1, 512)
    for programs, steps in ((1, 1), (3, 7), (5, 100), (64, 3)):
        splits, per = kmod.split_plan(programs, steps, 16, 132, 4)
        assert per % 16 == 0 and per * (splits - 1) < steps * 16 <= per * splits


@pytest.mark.parametrize("splits", [None, 1, 3, 5])
def test_dot_split_k(splits, seed):
    """The tensor-core kernel with K split: fp32 partials summed by the reduce kernel, bias added there once."""
    n, k = 40, 1024
    cfg = {"block_n": 16, "block_t": 16, "num_warps": 4, "num_stages": 2}
    if splits is not None:
        cfg["splits"] = splits
    for m, dtype, bias in ((5, torch.float32, True), (16, torch.bfloat16, False), (3, torch.bfloat16, True)):
        x, w, bs, gs, b = _nvfp4_linear_inputs({"m": m, "n": n, "k": k, "bias": bias}, dtype, DEVICE, _gen(seed))
        tol = nvfp4_linear.tolerances[dtype]
        torch.testing.assert_close(kmod.w4a16_linear(x, w, bs, gs, b, kernel="dot", config=cfg),
                                   _nvfp4_linear_ref(x, w, bs, gs, b), atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("asm", [True, False])
def test_gemv_decode_and_configs(asm, seed):
    """The GEMV with the inline-PTX decode (GPU only; the interpreter runs the Triton decode) and the Triton one,
    unmasked (whole tiles) and masked, several steps per split, explicit splits, the register prefetch, every x
    dtype and up to 4 rows."""
    n, k = 16, 2048
    for m, cfg, dtype in ((1, {"block_b": 16, "splits": 3}, torch.float32),  # 128 blocks in 3 splits: masked
                          (1, {"block_b": 32, "splits": 2, "block_n": 8}, torch.bfloat16),  # whole tiles
                          (2, {"block_b": 32, "splits": 1}, torch.float16), (3, {"block_n": 4}, torch.bfloat16),
                          (4, {"block_n": 8, "block_b": 64}, torch.float32),
                          (1, {"block_b": 16, "splits": 3, "prefetch": True}, torch.bfloat16),  # masked prefetch
                          (2, {"block_b": 32, "splits": 2, "prefetch": True}, torch.float16)):  # whole tiles
        x, w, bs, gs, b = _nvfp4_linear_inputs({"m": m, "n": n, "k": k, "bias": True}, dtype, DEVICE, _gen(seed))
        got = kmod.w4a16_linear(x, w, bs, gs, b, kernel="gemv", config=dict(cfg, asm=asm))
        tol = nvfp4_linear.tolerances[torch.bfloat16 if dtype == torch.float16 else dtype]
        torch.testing.assert_close(got, _nvfp4_linear_ref(x, w, bs, gs, b), atol=tol.atol, rtol=tol.rtol)


def test_gemv_unaligned_16bit_x(seed):
    """16-bit x is read as 8-byte words: a row view at an odd element offset or an odd row stride is copied first."""
    g = _gen(seed)
    x, w, bs, gs, _ = _nvfp4_linear_inputs({"m": 2, "n": 8, "k": 64, "bias": False}, torch.bfloat16, DEVICE, g)
    big = torch.randn(3, 67, generator=g).to(torch.bfloat16).to(DEVICE)
    for xs in (big[:1, 1:65], big[:2, 3:67]):  # offset 1 element; row stride 67
        torch.testing.assert_close(kmod.w4a16_linear(xs, w, bs, gs, None, kernel="gemv"),
                                   _nvfp4_linear_ref(xs, w, bs, gs, None), atol=1e-2, rtol=1e-2)


# ---------------------------------------------------------------------------------------------------- native FP4


def test_native_gate():
    fake = types.SimpleNamespace(float4_e2m1fn_x2=object(), _scaled_mm=object(), __version__="9.9",
                                 version=types.SimpleNamespace(hip=None))
    assert kmod.native_fp4_available((10, 0), fake)[0] is True
    assert kmod.native_fp4_available((10, 3), fake)[0] is True
    assert kmod.native_fp4_available((12, 0), fake)[0] is True
    ok, why = kmod.native_fp4_available((9, 0), fake)
    assert ok is False and "9.0" in why
    ok, why = kmod.native_fp4_available((8, 9), fake)
    assert ok is False and "8.9" in why
    ok, why = kmod.native_fp4_available(None, fake)
    assert ok is False and why
    old = types.SimpleNamespace(_scaled_mm=object(), __version__="2.5")
    ok, why = kmod.native_fp4_available((10, 0), old)
    assert ok is False and "float4_e2m1fn_x2" in why and "2.5" in why
    ok, why = kmod.native_fp4_available((10, 0), types.SimpleNamespace(float4_e2m1fn_x2=object()))
    assert ok is False and "_scaled_mm" in why
    rocm = types.SimpleNamespace(float4_e2m1fn_x2=object(), _scaled_mm=object(),
                                 version=types.SimpleNamespace(hip="6.4"))
    ok, why = kmod.native_fp4_available((10, 0), rocm)
    assert ok is False and "ROCm" in why


def _blocked_index(r, c, cols):
    """Where cuBLAS's block-scale layout puts element (r, c): 128x4 tiles, row-major over tiles, each tile as
    32 rows of 16 = (4 groups of 32 rows) x 4 columns."""
    tile = (r // 128) * ((cols + 3) // 4) + c // 4
    return tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


@pytest.mark.parametrize("rows,cols", [(128, 4), (1, 36), (130, 9), (257, 16)])
def test_blocked_scales_layout(rows, cols, seed):
    g = _gen(seed)
    s = torch.randint(1, 0x7F, (rows, cols), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    out = kmod.blocked_scales(s)
    padded_r, padded_c = -(-rows // 128) * 128, -(-cols // 4) * 4
    assert out.dtype == torch.float8_e4m3fn and out.dim() == 1 and out.is_contiguous()
    assert out.numel() == padded_r * padded_c  # what _scaled_mm checks: 128 * ceil(M/128) * (K/16 padded to 4)
    flat = out.view(torch.uint8)
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    idx = _blocked_index(r, c, cols)
    assert torch.equal(flat[idx.reshape(-1)], s.view(torch.uint8).reshape(-1))
    padding = torch.ones(out.numel(), dtype=torch.bool)
    padding[idx.reshape(-1)] = False
    assert torch.all(flat[padding] == 0)


def _unblock(flat, rows, cols):
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    return flat.view(torch.uint8)[_blocked_index(r, c, cols)].view(torch.float8_e4m3fn)


def _emulated_scaled_mm(a, b, scale_a, scale_b, out_dtype=None):
    """torch._scaled_mm for NVFP4 operands, in fp32 on the CPU: a [M, K/2] fp4x2 row-major, b [K/2, N] fp4x2
    column-major, scales in the blocked layout."""
    assert a.dtype == torch.float4_e2m1fn_x2 and b.dtype == torch.float4_e2m1fn_x2
    assert a.stride(1) == 1 and b.stride(0) == 1, "a row-major, b column-major"
    assert scale_a.dtype == torch.float8_e4m3fn and scale_b.dtype == torch.float8_e4m3fn and out_dtype is not None
    m, k = a.shape[0], a.shape[1] * 2
    n = b.shape[1]
    assert scale_a.is_contiguous() and scale_b.is_contiguous()
    sa = _unblock(scale_a.cpu(), m, k // 16).float().repeat_interleave(16, 1)
    sb = _unblock(scale_b.cpu(), n, k // 16).float().repeat_interleave(16, 1)
    av = e2m1_decode(unpack(a.cpu().view(torch.uint8))) * sa
    bv = e2m1_decode(unpack(b.t().cpu().view(torch.uint8))) * sb
    return (av @ bv.t()).to(out_dtype).to(a.device)


def test_native_fp4_glue_with_emulated_scaled_mm(monkeypatch, seed):
    """The native path's views, transposes, scale layouts, global scales and bias, checked against an emulated
    _scaled_mm (Blackwell is not here) and against the nvfp4_linear_w4a4 reference (x quantized with its
    calibrated global scale)."""
    monkeypatch.setattr(torch, "_scaled_mm", _emulated_scaled_mm)
    x, x_gs, w, bs, gs, bias = _nvfp4_linear_w4a4_inputs({"m": 3, "n": 32, "k": 64, "bias": True}, torch.bfloat16,
                                                         DEVICE, _gen(seed))
    got = kmod.native_fp4_linear(x, x_gs, w, bs, gs, bias)
    xq, xs = _nvfp4_quantize_ref(x, x_gs)
    xd = e2m1_decode(unpack(xq)) * xs.float().repeat_interleave(16, 1) / x_gs
    wd = e2m1_decode(unpack(w)) * bs.float().repeat_interleave(16, 1) / gs
    want = (xd @ wd.t() + bias.float()).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (3, 32)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    tol = nvfp4_linear_w4a4.tolerances[torch.bfloat16]
    torch.testing.assert_close(got, _nvfp4_linear_w4a4_ref(x, x_gs, w, bs, gs, bias), atol=tol.atol, rtol=tol.rtol)
    # the weight's re-laid-out scales are cached, and refreshed when the scales change in place
    first = kmod._weight_blocked_scales(bs)
    assert kmod._weight_blocked_scales(bs) is first
    bs.view(torch.uint8)[0, 0] ^= 1
    assert kmod._weight_blocked_scales(bs) is not first


def test_register_native_only_when_gated(seed):
    reg = KernelRegistry("t")
    kmod.register(reg, "cuda", (9, 0))  # Hopper: W4A16 only, native recorded as skipped with the reason
    names = [i.name for i in reg.implementations(nvfp4_linear)]
    assert names == ["triton_nvfp4_w4a16"] and not reg.implementations(nvfp4_linear_w4a4)
    (skip,) = reg.skipped(nvfp4_linear_w4a4)
    assert skip.name == "native_fp4_scaled_mm" and "9.0" in skip.reason
    reg = KernelRegistry("t")
    kmod.register(reg, "cuda", (10, 0))
    if kmod.native_fp4_available((10, 0), torch)[0]:
        assert [i.name for i in reg.implementations(nvfp4_linear_w4a4)] == ["native_fp4_scaled_mm"]
        assert not reg.skipped()
    reg = KernelRegistry("t")
    kmod.register(reg, "xpu", None)  # not a candidate: nothing registered, nothing to report
    assert [i.name for i in reg.implementations(nvfp4_linear)] == ["triton_nvfp4_w4a16"] and not reg.skipped()


# ---------------------------------------------------------------------------------------------------- supports


def test_supports_declines_with_reasons(registry, seed):
    other = "meta"
    x, w, bs, gs, bias = _nvfp4_linear_inputs({"m": 2, "n": 32, "k": 64, "bias": True}, torch.float32, DEVICE,
                                              _gen(seed))
    lin = kmod.supports_w4a16(DEVICE)
    quant = kmod.supports_quantize(DEVICE)
    native = kmod.supports_native(DEVICE)
    assert lin(x, w, bs, gs, bias) is True and lin(x, w, bs, gs, None) is True
    assert quant(x, gs) is True and native(x, gs, w, bs, gs, bias) is True
    cases = {
        "x device": lin(x.to(other), w, bs, gs, bias),
        "w device": lin(x, w.to(other), bs, gs, bias),
        "x dtype": lin(x.double(), w, bs, gs, bias),
        "x 3-D": lin(x[None], w, bs, gs, bias),
        "K": lin(x[:, :56], w[:, :28], bs[:, :3], gs, bias),
        "w dtype": lin(x, w.to(torch.int8), bs, gs, bias),
        "w shape": lin(x, w[:, :16], bs, gs, bias),
        "scale dtype": lin(x, w, bs.view(torch.uint8), gs, bias),
        "scale shape": lin(x, w, bs[:, :2], gs, bias),
        "w strided": lin(x, torch.zeros(32, 64, dtype=torch.uint8, device=DEVICE)[:, ::2], bs, gs, bias),
        "gs dtype": lin(x, w, bs, gs.double(), bias),
        "gs numel": lin(x, w, bs, gs.repeat(2), bias),
        "bias shape": lin(x, w, bs, gs, bias[:5]),
        "bias int": lin(x, w, bs, gs, bias.int()),
        "q device": quant(x.to(other), gs),
        "q dtype": quant(x.to(torch.int32), gs),
        "q K": quant(x[:, :40], gs),
        "q 1-D": quant(x[0], gs),
        "q gs": quant(x, gs.half()),
        "native K": native(x[:, :48], gs, w[:, :24], bs[:, :3], gs, bias),
        "native N": native(x, gs, w[:24], bs[:24], gs, bias[:24]),
        "native x scale": native(x, gs.double(), w, bs, gs, bias),
    }
    for what, verdict in cases.items():
        assert isinstance(verdict, str) and verdict, (what, verdict)
    assert registry.select(nvfp4_quantize, (x, gs)).name == "triton_nvfp4_quantize"
    assert registry.select(nvfp4_linear, (x, w, bs, gs, bias)).name == "triton_nvfp4_w4a16"
    assert registry.select(nvfp4_linear, (x.double(), w, bs, gs, bias)).name == "reference"


def test_e2m1_table_matches_contract():
    """The kernels decode codes arithmetically; the contract's table is the truth: every byte, both nibbles."""
    w = torch.arange(256, dtype=torch.uint8).reshape(1, 256).repeat(16, 1).to(DEVICE)  # [16, 256]: K = 512
    bs = torch.full((16, 32), 1.0).to(torch.float8_e4m3fn).to(DEVICE)
    gs = torch.ones(1, device=DEVICE)
    eye = torch.eye(512, device=DEVICE)  # x = I: the output is the dequantized weight, transposed
    got = kmod.w4a16_linear(eye[:4], w, bs, gs, None, kernel="gemv")
    table = torch.tensor(E2M1_VALUES)
    codes = torch.stack((torch.arange(256) & 15, torch.arange(256) >> 4), -1).reshape(-1)
    assert torch.equal(got.cpu(), table[codes[:4]][:, None].expand(4, 16))
    got = kmod.w4a16_linear(eye[:32], w, bs, gs, None, kernel="dot")
    assert torch.equal(got.cpu(), table[codes[:32]][:, None].expand(32, 16))
