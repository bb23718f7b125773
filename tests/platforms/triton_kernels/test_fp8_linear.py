"""The FP8 kernels of platforms/triton_kernels/fp8_linear.py against the ops' references.

Triton GEMM: every fp8_linear case, every pairing of scale layouts, shapes off the tile sizes and both weight-scale
paths (one block per tile, a block per column), through the interpreter on the CPU or for real on a GPU.
torch._scaled_mm: its gate (device, capability, FP8 flavour, shapes, output dtype) and its argument preparation,
which runs here through the CPU build of torch._scaled_mm; for real on CUDA only. Quantizer: bit-exact codes and
scales, every rounding tie of both FP8 formats, long rows (the two-pass loop) and groups of any width.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.fp8 import FP8_DTYPES, fp8_linear, quantize_fp8
from engine.core.ops.fp8_quant import fp8_quantize_per_token
from engine.core.testing.conformance import compare
from engine.platforms.triton_kernels import fp8_linear as fl
from tests.platforms.triton_kernels.conftest import CAPABILITY, DEVICE, run_case

OUT_DTYPES = [torch.float32, torch.bfloat16]
ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch._scaled_mm and graph capture need CUDA")
GRANS = {  # name -> quantize_fp8 (granularity, block) for x and for w
    "tensor": (("tensor", None), ("tensor", None)),
    "row": (("token", None), ("channel", None)),
    "block": (("block", (1, 128)), ("block", (128, 128))),
}


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    reg = KernelRegistry("triton")
    fl.register(reg, DEVICE, CAPABILITY)
    return reg


def _native_fp8():
    """The FP8 flavours this run's device computes with (both under the interpreter)."""
    if DEVICE == "cpu":
        return list(FP8_DTYPES.values())
    return list(fl.native_fp8_dtypes(DEVICE, CAPABILITY))


def _operands(m, n, k, xg, wg, fp8=torch.float8_e4m3fn, gen=None, bias_dtype=None):
    x = (torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen).add(0.5)).bfloat16()
    w = (torch.randn(n, k, generator=gen) * k ** -0.5).bfloat16()
    x_q, xs = quantize_fp8(x, GRANS[xg][0][0], fp8, GRANS[xg][0][1])
    w_q, ws = quantize_fp8(w, GRANS[wg][1][0], fp8, GRANS[wg][1][1])
    bias = torch.randn(n, generator=gen).to(bias_dtype) if bias_dtype else None
    return tuple(t.to(DEVICE) if t is not None else None for t in (x_q, xs, w_q, ws, bias))


def _check_linear(args, out_dtype, got):
    want = fp8_linear.reference(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args), out_dtype)
    compare(fp8_linear, out_dtype, [got], [want], "fp8_linear")


# ------------------------------------------------------------------------------------------- Triton GEMM


@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("case", fp8_linear.cases, ids=lambda c: c.name)
def test_gemm_op_cases(registry, case, dtype, seed):
    if FP8_DTYPES[case.params["fp8"]] not in _native_fp8():
        pytest.skip(f"float8_{case.params['fp8']} is not this device's flavour")
    run_case(registry, "fp8_linear", "triton_fp8_gemm", case.params, dtype, seed)


@pytest.mark.parametrize("params", [
    {"m": 33, "n": 300, "k": 400, "granularity": "block", "bias": True},  # partial tiles and scale blocks
    {"m": 17, "n": 130, "k": 100, "granularity": "token_channel"},  # K, N off 16: _scaled_mm declines these
    {"m": 1, "n": 96, "k": 1000, "granularity": "tensor", "bias": True},
    {"m": 40, "n": 64, "k": 256, "granularity": "token_tensor"},
], ids=lambda p: "{granularity}_{m}x{n}x{k}".format(**p))
@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
def test_gemm_shapes_off_the_tiles(registry, params, dtype, seed):
    run_case(registry, "fp8_linear", "triton_fp8_gemm", {**params, "fp8": "e4m3fn"}, dtype, seed)


@pytest.mark.parametrize("xg", list(GRANS))
@pytest.mark.parametrize("wg", list(GRANS))
def test_gemm_every_scale_pairing(xg, wg, gen):
    args = _operands(20, 160, 288, xg, wg, gen=gen, bias_dtype=torch.float32)
    _check_linear(args, torch.float32, fl.triton_fp8_linear(*args, torch.float32))


@pytest.mark.parametrize("config", [
    dict(BLOCK_M=16, BLOCK_N=256, BLOCK_K=128, GROUP_M=2, num_warps=4, num_stages=1),  # tile wider than a block
    dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=1),  # two K steps per block
], ids=["scale_per_column", "half_block_k"])
def test_gemm_block_scale_paths(config, gen):
    args = _operands(24, 330, 384, "block", "block", gen=gen)
    _check_linear(args, torch.float32, fl.triton_fp8_linear(*args, torch.float32, config=config))


@pytest.mark.parametrize("variant", [dict(PREFETCH=True), dict(DEFER=True), dict(TMA=True, PREFETCH=True),
                                     dict(TMA=True, DEFER=True), dict(TMA=True)],
                         ids=["prefetch", "defer", "tma_prefetch", "tma_defer", "tma"])
@pytest.mark.parametrize("xg,wg", [("block", "block"), ("tensor", "block"), ("block", "row")])
def test_gemm_block_scale_variants(variant, xg, wg, gen):
    """The block-scale loop variants the benchmark sweeps: same function, off-tile M / N / K (K = 400: a partial
    last scale block; TMA zero-fills what the pointer path masks)."""
    args = _operands(37, 200, 400, xg, wg, gen=gen, bias_dtype=torch.float32)
    for bn in (128, 64):  # one weight block per tile, and two tiles per block
        cfg = dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=128, GROUP_M=2, num_warps=4, num_stages=1, **variant)
        _check_linear(args, torch.float32, fl.triton_fp8_linear(*args, torch.float32, config=cfg))


def test_gemm_default_block_config_uses_tma():
    cfg = fl.gemm_config(4096, 4096, 4096, True)
    if not fl.interpreting():
        assert cfg["TMA"] and cfg["BLOCK_N"] == 128 and cfg["BLOCK_K"] == 128


def test_prefetch_with_defer_is_refused(gen):
    args = _operands(37, 200, 400, "block", "block", gen=gen)
    cfg = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=2, num_warps=4, num_stages=1, PREFETCH=True, DEFER=True)
    with pytest.raises(ValueError, match="PREFETCH and DEFER"):
        fl.triton_fp8_linear(*args, torch.float32, config=cfg)


def test_gemm_empty_and_k_zero(gen):
    x_q, xs, w_q, ws, _ = _operands(3, 32, 64, "tensor", "tensor", gen=gen)
    assert fl.triton_fp8_linear(x_q[:0], xs, w_q, ws, None, torch.bfloat16).shape == (0, 32)
    bias = torch.randn(8, generator=gen).to(DEVICE)
    z = torch.empty(3, 0, dtype=torch.float8_e4m3fn, device=DEVICE)
    one = torch.ones((), device=DEVICE)
    out = fl.triton_fp8_linear(z, one, torch.empty(8, 0, dtype=z.dtype, device=DEVICE), one, bias, torch.float32)
    torch.testing.assert_close(out.cpu(), bias.cpu().expand(3, 8))


def test_gemm_declines_with_reasons(registry, gen):
    (impl,) = [i for i in registry.implementations(fp8_linear) if i.name == "triton_fp8_gemm"]
    x_q, xs, w_q, ws, _ = _operands(4, 32, 64, "row", "row", gen=gen)
    bad = {
        "e5m2": (x_q.to(torch.float8_e5m2), xs, w_q.to(torch.float8_e5m2), ws, None, torch.float32),
        "mixed flavours": (x_q, xs, w_q.to(torch.float8_e4m3fnuz), ws, None, torch.float32),
        "K mismatch": (x_q, xs, w_q[:, :32], ws, None, torch.float32),
        "x scale shape": (x_q, xs[:3], w_q, ws, None, torch.float32),
        "w scale dtype": (x_q, xs, w_q, ws.double(), None, torch.float32),
        "bias shape": (x_q, xs, w_q, ws, torch.zeros(31, device=DEVICE), torch.float32),
        "out dtype": (x_q, xs, w_q, ws, None, torch.int32),
        "3-D x": (x_q[None], xs, w_q, ws, None, torch.float32),
    }
    for why, args in bad.items():
        reason = impl.verdict(args)
        assert isinstance(reason, str) and reason, why
    # a kernel registered for a CUDA device declines tensors on the host (registered with no capability: on a
    # CPU-only machine the registry cannot ask the device)
    reg = KernelRegistry("elsewhere")
    fl.register(reg, "cuda", None)
    gemm = [i for i in reg.implementations(fp8_linear) if i.name == "triton_fp8_gemm"][0]
    on_host = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in (x_q, xs, w_q, ws, None, torch.float32))
    assert "must be on" in gemm.verdict(on_host)


def test_old_gpu_registers_nothing_and_says_why():
    reg = KernelRegistry("ampere")
    fl.register(reg, "cuda", (8, 0))
    assert not reg.implementations(fp8_linear) and not reg.implementations(fp8_quantize_per_token)
    skipped = {s.name: s.reason for s in reg.skipped()}
    assert set(skipped) == {"scaled_mm", "triton_fp8_gemm", "triton_quant"}
    assert all("8.9" in why for why in skipped.values()), skipped


# ------------------------------------------------------------------------------------------- torch._scaled_mm


def test_native_fp8_flavours():
    assert fl.native_fp8_dtypes("cpu", None) == ()
    if torch.version.hip is None:
        assert fl.native_fp8_dtypes("cuda", (8, 0)) == ()
        assert fl.native_fp8_dtypes("cuda", (8, 9)) == (torch.float8_e4m3fn,)
        assert fl.native_fp8_dtypes("cuda", (9, 0)) == (torch.float8_e4m3fn,)


def test_scaled_mm_gate(registry, gen):
    args = _operands(16, 64, 128, "tensor", "tensor", gen=gen)
    if DEVICE == "cpu":  # it cannot run here: recorded as skipped, with the reason
        assert not [i for i in registry.implementations(fp8_linear) if i.name == "scaled_mm"]
        assert "CUDA" in [s.reason for s in registry.skipped(fp8_linear) if s.name == "scaled_mm"][0]
    else:
        impl = [i for i in registry.implementations(fp8_linear) if i.name == "scaled_mm"][0]
        assert impl.priority > max(i.priority for i in registry.implementations(fp8_linear) if i is not impl)
    cpu_args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
    assert "8.9" in fl.scaled_mm_supports_for("cuda", (8, 6))(*cpu_args, torch.bfloat16)
    assert "must be on cuda" in fl.scaled_mm_supports_for("cuda", (9, 0))(*cpu_args, torch.bfloat16)
    assert "must be on xpu" in fl.scaled_mm_supports_for("xpu", None)(*cpu_args, torch.bfloat16)
    assert "CUDA" in fl.scaled_mm_supports_for("cpu", None)(*cpu_args, torch.bfloat16)


def test_xpu_scaled_mm_gate_and_registration():
    """XPU runs per-tensor / row-wise fp8_linear through torch._scaled_mm (oneDNN) from torch 2.10 on: the gate on
    versions, and what an XPU registration records under this torch (an Intel GPU is not needed to register)."""
    assert fl.xpu_scaled_mm_gate("2.13.0+xpu", True)[0]
    assert fl.xpu_scaled_mm_gate("2.10.0", True)[0]
    ok, why = fl.xpu_scaled_mm_gate("2.9.1+xpu", True)
    assert not ok and "torch >= 2.10" in why
    assert not fl.xpu_scaled_mm_gate("2.13.0", False)[0]
    assert "not understood" in fl.xpu_scaled_mm_gate("nightly", True)[1]
    reg = KernelRegistry("xpu")
    fl.register(reg, "xpu", None)
    runs, why = fl.xpu_scaled_mm_gate(torch.__version__, hasattr(torch, "_scaled_mm"))
    names = [i.name for i in reg.implementations(fp8_linear)]
    assert ("scaled_mm" in names) == runs and "triton_fp8_gemm" in names
    if runs:
        impl = next(i for i in reg.implementations(fp8_linear) if i.name == "scaled_mm")
        assert "oneDNN" in impl.note and "not run on Intel hardware" in impl.note
    else:
        assert [s.reason for s in reg.skipped(fp8_linear) if s.name == "scaled_mm"] == [why]


def test_scaled_mm_verdict_rules(gen):
    def verdict(m, n, k, xg, wg, out=torch.bfloat16, bias=None):
        return fl.scaled_mm_verdict(*_operands(m, n, k, xg, wg, gen=gen, bias_dtype=bias), out)

    assert verdict(5, 64, 128, "tensor", "tensor", torch.float32) is True  # any output per-tensor
    assert verdict(5, 64, 128, "tensor", "tensor", torch.float32, bias=torch.float32) is True  # bias added after
    assert verdict(5, 64, 128, "row", "row") is True
    assert verdict(5, 64, 128, "row", "tensor", bias=torch.bfloat16) is True
    assert "bf16 output" in verdict(5, 64, 128, "row", "row", torch.float32)
    assert "bf16 bias" in verdict(5, 64, 128, "row", "row", bias=torch.float32)
    assert "Triton" in verdict(5, 128, 256, "block", "block")
    assert "multiples of 16" in verdict(5, 64, 100, "tensor", "tensor")
    assert "multiples of 16" in verdict(5, 40, 128, "tensor", "tensor")
    x_q, xs, w_q, ws, _ = _operands(5, 64, 128, "tensor", "tensor", gen=gen)
    assert "row-major" in fl.scaled_mm_verdict(x_q.t().contiguous().t(), xs, w_q, ws, None, torch.bfloat16)


@functools.cache
def _cpu_scaled_mm_takes_row_scales() -> bool:
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.bfloat16)
    except RuntimeError as exc:
        if "per-tensor" in str(exc):
            return False
        raise
    return True


@pytest.mark.parametrize("xg,wg", [("tensor", "tensor"), ("row", "row"), ("row", "tensor"), ("tensor", "row")])
@pytest.mark.parametrize("out,bias", [(torch.bfloat16, None), (torch.bfloat16, torch.bfloat16),
                                      (torch.float32, None), (torch.float32, torch.float32),
                                      (torch.bfloat16, torch.float32), (torch.float16, torch.float16)])
def test_scaled_mm_args(xg, wg, out, bias, gen):
    args = tuple(a.cpu() if a is not None else None
                 for a in _operands(6, 48, 64, xg, wg, gen=gen, bias_dtype=bias))
    if fl.scaled_mm_verdict(*args, out) is not True:
        pytest.skip(f"declined: {fl.scaled_mm_verdict(*args, out)}")
    kwargs, post_bias, cast_to = fl.scaled_mm_args(*args, out)
    x_q, xs, w_q, ws, b = args
    assert kwargs["mat1"] is x_q and kwargs["mat2"].stride() == (1, 64)  # column-major mat2, no copy
    if (xg, wg) == ("tensor", "tensor"):
        assert kwargs["scale_a"].shape == () and kwargs["scale_b"].shape == ()
    else:
        assert kwargs["scale_a"].shape == (6, 1) and kwargs["scale_b"].shape == (1, 48)
        assert kwargs["scale_a"].is_contiguous() and kwargs["scale_b"].t().is_contiguous()
    assert all(s.dtype == torch.float32 for s in (kwargs["scale_a"], kwargs["scale_b"]))
    if b is not None and b.dtype == out and out != torch.float32:
        assert kwargs["bias"] is b and post_bias is None and cast_to is None
    elif b is not None:
        assert "bias" not in kwargs and kwargs["out_dtype"] == torch.float32 and post_bias.dtype == torch.float32
        assert cast_to == (None if out == torch.float32 else out)
    # The CPU build of torch._scaled_mm takes the same arguments (without the GPU's layout rules): run them. Some
    # builds (torch 2.11's) take only per-tensor scales on the CPU; there the GPU tests below run these cases.
    if (xg, wg) != ("tensor", "tensor") and not _cpu_scaled_mm_takes_row_scales():
        pytest.skip("this torch's CPU _scaled_mm takes per-tensor scales only: the numeric check runs on CUDA")
    got = fl.scaled_mm_linear(*args, out)
    assert got.dtype == out
    want = fp8_linear.reference(*args, out)
    torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=1e-2)


@ON_CUDA
@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("case", fp8_linear.cases, ids=lambda c: c.name)
def test_scaled_mm_on_cuda(registry, case, dtype, seed):
    from engine.core.testing.conformance import Unsupported

    try:
        run_case(registry, "fp8_linear", "scaled_mm", case.params, dtype, seed)
    except Unsupported as exc:
        pytest.skip(str(exc))


@ON_CUDA
@pytest.mark.parametrize("xg,wg,out", [("tensor", "tensor", torch.float32), ("row", "row", torch.bfloat16),
                                       ("row", "tensor", torch.bfloat16)])
def test_scaled_mm_on_cuda_large(xg, wg, out, gen):
    if torch.float8_e4m3fn not in _native_fp8():
        pytest.skip("no e4m3fn tensor cores")
    args = _operands(256, 512, 1024, xg, wg, gen=gen, bias_dtype=out)
    _check_linear(args, out, fl.scaled_mm_linear(*args, out))


# ------------------------------------------------------------------------------------------- quantizer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", fp8_quantize_per_token.cases, ids=lambda c: c.name)
def test_quant_op_cases(registry, case, dtype, seed):
    if FP8_DTYPES[case.params["fp8"]] not in _native_fp8():
        pytest.skip(f"float8_{case.params['fp8']} is not this device's flavour")
    run_case(registry, "fp8_quantize_per_token", "triton_quant", case.params, dtype, seed)


@pytest.mark.parametrize("params", [
    {"m": 3, "k": fl.ROW_BLOCK_MAX},  # the largest row held in registers
    {"m": 3, "k": fl.ROW_BLOCK_MAX + 300, "zero_row": True},  # the two-pass loop, a partial last chunk
    {"m": 4, "k": 128 * 40 + 5, "group_size": 128},  # more groups than one program takes
    {"m": 5, "k": 300, "group_size": 64},
    {"m": 5, "k": 300, "group_size": 100},  # a width that is not a power of two
    {"m": 2, "k": 7, "group_size": 128},  # one partial group
])
def test_quant_shapes(registry, params, seed):
    run_case(registry, "fp8_quantize_per_token", "triton_quant", {"fp8": "e4m3fn", **params}, torch.bfloat16, seed)


def _tie_row(fp8: torch.dtype) -> torch.Tensor:
    """fp32 values whose scale is exactly 1 (the row's amax is the format's max): every finite code, every midpoint
    between neighbouring codes (exact ties), and one fp32 ulp either side of each midpoint, both signs."""
    codes = torch.arange(256, dtype=torch.uint8).view(fp8).float()
    vals = codes[torch.isfinite(codes) & (codes >= 0)].unique().sort().values
    mids = (vals[1:] + vals[:-1]) / 2
    row = torch.cat([vals, mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)])
    return torch.cat([row, -row])


@pytest.mark.parametrize("fp8_name", list(FP8_DTYPES))
@pytest.mark.parametrize("group_size", [0, 128])
def test_quant_every_code_and_tie_exact(registry, fp8_name, group_size):
    fp8 = FP8_DTYPES[fp8_name]
    if fp8 not in _native_fp8():
        pytest.skip(f"{fp8} is not this device's flavour")
    row = _tie_row(fp8)
    if group_size:  # every group must hold the max so that its scale is 1
        groups = math.ceil(row.numel() / (group_size - 1))
        row = torch.nn.functional.pad(row, (0, groups * (group_size - 1) - row.numel()))
        row = torch.cat([row.view(groups, -1), torch.full((groups, 1), torch.finfo(fp8).max)], 1).flatten()
    x = row[None].to(DEVICE)
    q, s = fl.triton_fp8_quantize(x, fp8_name, group_size)
    q_ref, s_ref = fp8_quantize_per_token.reference(x.cpu(), fp8_name, group_size)
    assert torch.all(s_ref == 1)
    assert torch.equal(s.cpu(), s_ref)
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))


def test_quant_declines_with_reasons(registry, gen):
    impl = registry.implementations(fp8_quantize_per_token)[0]
    x = torch.randn(4, 64, generator=gen).to(DEVICE)
    for why, args in {"3-D": (x[None], "e4m3fn", 0), "int": (x.int(), "e4m3fn", 0), "name": (x, "e5m2", 0),
                      "negative group": (x, "e4m3fn", -1), "huge group": (x, "e4m3fn", fl.ROW_BLOCK_MAX * 2),
                      "fp64": (x.double(), "e4m3fn", 0)}.items():
        reason = impl.verdict(args)
        assert isinstance(reason, str) and reason, why
    if torch.float8_e4m3fn in _native_fp8():
        assert impl.verdict((x, "e4m3fn", 128)) is None


def test_quant_feeds_the_gemm(registry, gen):
    """Per-token / 1x128 activations from the quantizer, per-channel / 128x128 weights: the linear of the
    quantized operands is the reference's."""
    x = torch.randn(9, 256, generator=gen).bfloat16().to(DEVICE)
    for group, (wg, wb) in ((0, ("channel", None)), (128, ("block", (128, 128)))):
        x_q, xs = fl.triton_fp8_quantize(x, "e4m3fn", group)
        w_q, ws = quantize_fp8((torch.randn(64, 256, generator=gen) / 16).bfloat16(), wg, torch.float8_e4m3fn, wb)
        args = (x_q, xs, w_q.to(DEVICE), ws.to(DEVICE), None)
        _check_linear(args, torch.float32, fl.triton_fp8_linear(*args, torch.float32))


# ------------------------------------------------------------------------------------------- CUDA graphs


@ON_CUDA
def test_fp8_kernels_capture_in_a_cuda_graph(gen):
    """Nothing reads back to the host: quantize + GEMM (and _scaled_mm) capture and replay."""
    x = torch.randn(32, 512, generator=gen).bfloat16().cuda()
    w_q, ws = quantize_fp8((torch.randn(256, 512, generator=gen) / 16).bfloat16().cuda(), "block",
                           torch.float8_e4m3fn, (128, 128))
    wc_q, wcs = quantize_fp8((torch.randn(256, 512, generator=gen) / 16).bfloat16().cuda(), "channel",
                             torch.float8_e4m3fn)

    def step():
        xq, xs = fl.triton_fp8_quantize(x, "e4m3fn", 128)
        xt, xts = fl.triton_fp8_quantize(x, "e4m3fn", 0)
        return fl.triton_fp8_linear(xq, xs, w_q, ws, None, torch.bfloat16), fl.scaled_mm_linear(
            xt, xts, wc_q, wcs, None, torch.bfloat16)

    eager = step()  # compiles outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = step()
    x.copy_(torch.randn(32, 512, generator=gen).bfloat16())
    g.replay()
    fresh = step()
    for o, f, e in zip(outs, fresh, eager, strict=True):
        assert torch.equal(o, f) and not torch.equal(o, e)
