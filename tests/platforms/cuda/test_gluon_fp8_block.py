"""The Gluon FP8 block-scaled GEMM (platforms/cuda/gluon_fp8_block.py).

Without a GPU: its gate (device, capability, a missing Gluon, scale layouts, FP8 flavour, K, alignment), its
registration, and the kernel compiled for sm_90 by the installed Triton (ptxas ships with Triton's wheel), with the
wgmma (QGMMA), TMA loads and register reallocation of the warp roles in its SASS. On an sm_90 GPU: the kernel against
the op's reference on fresh random inputs, shapes off the tiles, every output dtype, output memory poisoned first.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.fp8 import fp8_linear, quantize_fp8
from engine.core.testing.conformance import compare
from engine.platforms.cuda import gluon_fp8_block as gb
from engine.platforms.triton_kernels import fp8_linear as fl

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
ON_HOPPER = pytest.mark.skipif(not HOPPER, reason="the Gluon FP8 kernel runs on an sm_90 (Hopper) CUDA GPU only")
OUT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _operands(m, n, k, gen, device="cpu", xg=("block", (1, 128)), wg=("block", (128, 128)), bias_dtype=None,
              fp8=torch.float8_e4m3fn):
    x = (torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen).add(0.5)).bfloat16()
    w = (torch.randn(n, k, generator=gen) * k ** -0.5).bfloat16()
    x_q, xs = quantize_fp8(x, xg[0], fp8, xg[1])
    w_q, ws = quantize_fp8(w, wg[0], fp8, wg[1])
    bias = torch.randn(n, generator=gen).to(bias_dtype) if bias_dtype else None
    return tuple(t.to(device) if t is not None else None for t in (x_q, xs, w_q, ws, bias))


# ------------------------------------------------------------------------------------------------ gate


def test_gate_declines_what_it_does_not_run(gen):
    args = _operands(8, 128, 256, gen)
    ok = gb.supports_for("cuda", (9, 0), None)
    assert ok(*args, torch.bfloat16) == "tensors must be on cuda"  # CPU tensors
    for cap in [(8, 9), (10, 0), None]:
        reason = gb.supports_for("cuda", cap, None)(*args, torch.bfloat16)
        assert isinstance(reason, str) and "(9, 0)" in reason
    assert "CUDA" in gb.supports_for("cpu", None, None)(*args, torch.bfloat16)
    assert gb.supports_for("cuda", (9, 0), "Gluon is not importable: X")(*args, torch.bfloat16) == \
        "Gluon is not importable: X"


def test_registers_above_triton_on_hopper_only():
    reg = KernelRegistry("cuda")
    fl.register(reg, "cuda", (9, 0))
    gb.register(reg, "cuda", (9, 0))
    names = [i.name for i in reg.implementations(fp8_linear)]
    if gb.GLUON_MISSING is None:
        assert names.index("scaled_mm") < names.index("gluon_fp8_block") < names.index("triton_fp8_gemm")
    for cap in [(8, 9), (10, 0)]:
        reg = KernelRegistry("cuda")
        gb.register(reg, "cuda", cap)
        assert not reg.implementations(fp8_linear)
        assert [s.name for s in reg.skipped(fp8_linear)] == ["gluon_fp8_block"]
        assert "(9, 0)" in reg.skipped(fp8_linear)[0].reason


def test_a_missing_gluon_is_the_reason(monkeypatch, gen):
    """The module loaded where ``triton.experimental.gluon`` cannot be imported: it still imports, registers
    nothing (a skip with the reason) and its gate declines with that reason."""
    monkeypatch.setitem(sys.modules, "triton.experimental.gluon", None)
    spec = importlib.util.spec_from_file_location("gluon_fp8_block_without_gluon", gb.__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.GLUON_MISSING and "Gluon" in mod.GLUON_MISSING
    reg = KernelRegistry("cuda")
    mod.register(reg, "cuda", (9, 0))
    assert not reg.implementations(fp8_linear)
    assert reg.skipped(fp8_linear)[0].reason == mod.GLUON_MISSING
    args = _operands(8, 128, 256, gen)
    assert mod.supports_for("cuda", (9, 0), mod.GLUON_MISSING)(*args, torch.bfloat16) == mod.GLUON_MISSING


def test_size_floor():
    assert gb.size_verdict(4096, 4096) is True  # 32 x 32 tiles
    assert gb.size_verdict(8192, 8192) is True
    assert gb.size_verdict(4097, 3970) is True  # partial tiles count: 33 x 32
    assert "Triton" in gb.size_verdict(4096, 3968)  # 32 x 31 tiles
    assert "Triton" in gb.size_verdict(1024, 4096)
    assert "Triton" in gb.size_verdict(1, 1 << 20)  # decode, however wide


def test_operand_rules(gen):
    """The rules past device and capability, on CPU tensors (they read shapes, dtypes, strides and alignment)."""

    def verdict(args, out=torch.bfloat16):
        return gb.operands_verdict(*args, out, device_type="cpu")

    assert verdict(_operands(5, 200, 320, gen)) is True  # off-tile M and N; K a multiple of 16, not of 128
    assert verdict(_operands(300, 256, 1024, gen, bias_dtype=torch.float32), torch.float32) is True
    assert verdict(_operands(1, 256, 256, gen), torch.float16) is True
    assert "block" in verdict(_operands(1, 128, 128, gen))  # block scales that read as per-tensor: scaled_mm's
    assert verdict(_operands(8, 128, 256, gen, xg=("token", None))) is True
    assert verdict(_operands(8, 128, 256, gen, xg=("tensor", None))) is True
    assert verdict(_operands(8, 128, 256, gen, wg=("tensor", None))) is True
    assert "block" in verdict(_operands(8, 128, 256, gen, wg=("channel", None)))
    assert "block" in verdict(_operands(8, 128, 256, gen, xg=("token", None), wg=("tensor", None)))
    assert "e4m3fn" in verdict(_operands(8, 128, 256, gen, fp8=torch.float8_e4m3fnuz))
    assert "multiple of 16" in verdict(_operands(8, 128, 200, gen))
    x_q, xs, w_q, ws, _ = _operands(8, 128, 256, gen)
    w_cm = w_q.t().contiguous().t()  # column-major w
    assert "row-major" in verdict((x_q, xs, w_cm, ws, None))
    strided = torch.empty(8, 272, dtype=x_q.dtype)[:, 8:264]  # base 8 bytes off 16-byte alignment
    strided.copy_(x_q)
    assert "aligned" in verdict((strided, xs, w_q, ws, None))
    assert "must be" in verdict((x_q, xs, w_q, ws, None), torch.int8)  # output dtype


# ------------------------------------------------------------------------------------------------ compile


@pytest.mark.skipif(gb.GLUON_MISSING is not None, reason="needs Gluon to compile the kernel")
@pytest.mark.parametrize("out_dtype,bias", [(torch.bfloat16, False), (torch.float32, True)], ids=["bf16", "f32_bias"])
def test_compiles_for_sm90_with_the_warp_roles(out_dtype, bias, tmp_path):
    import triton

    kernel = gb.compile_for_sm90(out_dtype, bias)
    ptx = kernel.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "e4m3.e4m3" in ptx
    assert "cp.async.bulk.tensor" in ptx  # TMA loads
    assert "setmaxnreg" in ptx  # the warp roles get their own register budgets
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(cuobjdump):
        pytest.skip("this Triton wheel carries no cuobjdump: PTX checked only")
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    sass = subprocess.run([cuobjdump, "--dump-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert sass.count("QGMMA.64x128x32.F32.E4M3.E4M3") == 8  # 4 k32 wgmmas per 128-deep step, in each consumer
    assert sass.count("UTMALDG") == 3  # the loader: two x halves and one w tile per step
    assert "LDL" not in sass and "STL" not in sass  # nothing spilled
    assert re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL \w+, 0xe8", sass)  # a consumer raised to 232 registers


# ------------------------------------------------------------------------------------------------ GPU


def _poisoned_call(args, out_dtype):
    """Call the kernel on memory the caching allocator hands back from a NaN-filled block of the output's size."""
    m, n = args[0].shape[0], args[2].shape[0]
    poison = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
    ptr = poison.data_ptr()
    del poison
    got = gb.gluon_fp8_block_linear(*args, out_dtype)
    assert got.data_ptr() == ptr, "the output did not land on the poisoned block: poisoning proves nothing"
    return got


@ON_HOPPER
@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (17, 384, 256), (128, 256, 256), (300, 640, 1024),
                                   (4000, 1024, 2048), (65, 200, 320), (129, 256, 4096)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_matches_reference(m, n, k, out_dtype, gen):
    args = _operands(m, n, k, gen, "cuda")
    assert gb.operands_verdict(*args, out_dtype) is True
    got = _poisoned_call(args, out_dtype)
    assert not got.isnan().any(), "an output element was not written"
    want = fp8_linear.reference(*(a.cpu() for a in args[:4]), None, out_dtype)
    compare(fp8_linear, torch.bfloat16 if out_dtype == torch.float16 else out_dtype, [got.cpu().to(want.dtype)],
            [want], "gluon_fp8_block")


@ON_HOPPER
@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bias(bias_dtype, gen):
    args = _operands(200, 384, 640, gen, "cuda", bias_dtype=bias_dtype)
    for out_dtype in (torch.float32, torch.bfloat16):
        got = _poisoned_call(args, out_dtype)
        want = fp8_linear.reference(*(a.cpu() for a in args), out_dtype)
        compare(fp8_linear, out_dtype, [got.cpu()], [want], "gluon_fp8_block bias")


@ON_HOPPER
def test_registry_picks_it_for_large_outputs_only(gen):
    """On the platform's registry: a 4096 x 4096 output goes to this kernel, a 1024 x 4096 one to the Triton GEMM."""
    reg = KernelRegistry("cuda")
    fl.register(reg, "cuda", (9, 0))
    gb.register(reg, "cuda", (9, 0))
    big = _operands(4096, 4096, 256, gen, "cuda")
    assert reg.select(fp8_linear, big + (torch.bfloat16,)).name == "gluon_fp8_block"
    small = _operands(1024, 4096, 256, gen, "cuda")
    assert reg.select(fp8_linear, small + (torch.bfloat16,)).name == "triton_fp8_gemm"


@ON_HOPPER
@pytest.mark.parametrize("xg,wg", [(("tensor", None), ("block", (128, 128))), (("token", None), ("block", (128, 128))),
                                   (("block", (1, 128)), ("tensor", None))], ids=["tensor_block", "row_block",
                                                                                  "block_tensor"])
def test_scale_pairings(xg, wg, gen):
    args = _operands(150, 384, 512, gen, "cuda", xg=xg, wg=wg)
    assert gb.operands_verdict(*args, torch.float32) is True
    got = _poisoned_call(args, torch.float32)
    want = fp8_linear.reference(*(a.cpu() for a in args[:4]), None, torch.float32)
    compare(fp8_linear, torch.float32, [got.cpu()], [want], f"gluon_fp8_block {xg[0]} x / {wg[0]} w")


@ON_HOPPER
@pytest.mark.parametrize("k", [768, 336], ids=lambda k: f"K{k}")  # 6 and 3 K steps (the last partial)
@pytest.mark.parametrize("config", [dict(STAGES=3), dict(PERSISTENT=False), dict(GROUP_M=1)], ids=str)
def test_config_variants(config, k, gen):
    """The benchmark's variants compute the same function (more tiles than multiprocessors: the persistent loop)."""
    args = _operands(2100, 1280, k, gen, "cuda")
    got = gb.gluon_fp8_block_linear(*args, torch.float32, config=config)
    want = fp8_linear.reference(*(a.cpu() for a in args[:4]), None, torch.float32)
    compare(fp8_linear, torch.float32, [got.cpu()], [want], f"gluon_fp8_block {config}")
