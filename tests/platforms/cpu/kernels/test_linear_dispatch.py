"""Which kernel runs a dense ``linear`` on the cpu platform: fp16 goes to the native fp16 kernel for the row counts
measured faster than torch's fp16 GEMM on this kind of CPU (kernels/linear.py), everything else to torch's BLAS
(``torch_blas``), and neither is reported as the reference; an fp16 op with no fp16 kernel still is, once."""

from __future__ import annotations

import logging

import pytest
import torch

from engine.core.ops.linear import linear
from engine.core.ops.moe import fused_moe
from engine.core.ops.registry import KernelRegistry
from engine.platforms.cpu import _native, read_cpuinfo
from engine.platforms.cpu.kernels import linear as cpu_linear
from engine.platforms.cpu.kernels import register

FP16_FLAG = "flags\t\t: fpu sse avx2 fma f16c avx512f avx512bw avx512_fp16\n"
NO_FP16_FLAG = "flags\t\t: fpu sse avx2 fma f16c avx512f avx512bw avx512_bf16\n"


def test_measured_rules():
    assert cpu_linear.cpu_fp16_max_m("avx512", FP16_FLAG) == cpu_linear.X86_AVX512FP16_MAX_M
    assert cpu_linear.cpu_fp16_max_m("avx2", FP16_FLAG) == cpu_linear.X86_AVX512FP16_MAX_M
    assert cpu_linear.cpu_fp16_max_m("avx512", NO_FP16_FLAG) is cpu_linear.EVERY_M
    assert cpu_linear.cpu_fp16_max_m("avx2", "") is cpu_linear.EVERY_M
    for isa in ("scalar", "neon", "rvv", "vsx"):  # vsx here: the cpu platform on POWER, which ppc serves instead
        assert cpu_linear.cpu_fp16_max_m(isa, FP16_FLAG) == 0
    assert cpu_linear.ppc_fp16_max_m("vsx") is cpu_linear.EVERY_M and cpu_linear.ppc_fp16_max_m("scalar") == 0


def _args(m, dtype, bias=False):
    x, w = torch.randn(m, 64, dtype=dtype), torch.randn(24, 64, dtype=dtype)
    return x, w, torch.randn(24, dtype=dtype) if bias else None


@pytest.mark.parametrize("isa", [i for i in _native.supported_isas() if i in ("avx512", "avx2", "scalar")])
def test_fp16_rows_go_native_up_to_the_rule_the_rest_to_torch_blas(isa, caplog):
    before = _native.isa()
    _native.set_isa(isa)
    try:
        reg = KernelRegistry("cpu")
        register(reg)  # the rule is read at registration, from the ISA in use and this CPU's flags
    finally:
        _native.set_isa(before)
    max_m = cpu_linear.cpu_fp16_max_m(isa, read_cpuinfo())
    with caplog.at_level(logging.WARNING, logger="engine"):
        for m in (1, 2, 3, 64):
            for bias in (False, True):
                native = max_m is None or m <= max_m
                assert reg.select(linear, _args(m, torch.float16, bias)).name == (
                    "native_fp16" if native else "torch_blas"), (isa, max_m, m)
        for dtype in (torch.float32, torch.bfloat16):
            assert reg.select(linear, _args(1, dtype)).name == "torch_blas"
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    names = [i.name for i in reg.implementations(linear)]
    assert names == (["torch_blas"] if max_m == 0 else ["native_fp16", "torch_blas"])


def test_an_fp16_op_without_an_fp16_kernel_is_told_once(caplog):
    """An fp16 MoE model still runs fused_moe on the reference on the cpu platform: said once, with the reason."""
    reg = KernelRegistry("cpu")
    register(reg)
    gen = torch.Generator().manual_seed(0)
    params = {"tokens": 3, "hidden": 64, "inter": 32, "experts": 4, "top_k": 2, "renormalize": True}
    x, w13, w2, logits, top_k, renorm = fused_moe.make_inputs(params, torch.float16, "cpu", gen)
    with caplog.at_level(logging.WARNING, logger="engine"):
        for t in (3, 1, 3):
            assert reg.select(fused_moe, (x[:t], w13, w2, logits[:t], top_k, renorm)).platform == "core"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "fused_moe runs on its plain-torch reference" in messages[0], messages
    assert "cpu.native: x, w13, w2 dtypes torch.float16" in messages[0]
