"""Native CPU kernels (engine.platforms.cpu._native) against the ops' references, for every ISA variant
this CPU runs; ISA selection and its errors; supports() refusals falling back to the reference."""

import os
import subprocess
import sys

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.gguf_quant import Q4_0, Q4_1, Q8_0, gguf_dequantize, gguf_linear, random_gguf_weight
from engine.core.ops.norm import fused_add_rms_norm, rms_norm
from engine.platforms.cpu import _native
from engine.platforms.cpu.kernels import register

ISAS = _native.supported_isas()
NATIVE_DTYPES = (torch.float32, torch.bfloat16)
OPS = (gguf_dequantize, gguf_linear, rms_norm, fused_add_rms_norm)
CASES = [pytest.param(op, c, dt, id=f"{op.name}-{c.name}-{str(dt)[6:]}")
         for op in OPS for c in op.cases for dt in NATIVE_DTYPES if dt in op.dtypes]


def native(registry, op):
    return registry.implementations(op)[0]  # the best (gguf_linear has a fallback registered below it)


def check(op, impl, args):
    """impl(*args) vs op.reference(*args): exact for dequantize, the op's tolerance otherwise."""
    got, want = impl.fn(*args), op.reference(*args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if op is gguf_dequantize:
            assert torch.equal(g, w), (g.float() - w.float()).abs().max()
        else:
            tol = op.tolerances[w.dtype]
            torch.testing.assert_close(g, w, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("op,case,dtype", CASES)
def test_op_cases(op, case, dtype, isa, registry, gen):
    args = op.make_inputs(case.params, dtype, "cpu", gen)
    impl = registry.select(op, args)
    assert impl.platform == "cpu", registry.explain(op, args)
    check(op, impl, args)


@pytest.mark.parametrize("hidden", [1, 7, 8, 15, 16, 17, 33, 100, 4099])
@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
def test_norm_tails_and_layouts(hidden, dtype, isa, registry, gen):
    # Hidden sizes around the 8/16-lane widths; 3-D input; rows strided inside a wider buffer.
    x = torch.randn(2, 3, hidden, generator=gen).to(dtype)
    r = torch.randn(2, 3, hidden, generator=gen).to(dtype)
    w = (torch.randn(hidden, generator=gen) * 0.5 + 1).to(dtype)
    check(rms_norm, native(registry, rms_norm), (x, w, 1e-5))
    check(fused_add_rms_norm, native(registry, fused_add_rms_norm), (x, r, w, 1e-5))
    wide = torch.randn(4, hidden + 5, generator=gen).to(dtype)[:, 2:2 + hidden]
    r2 = torch.randn(4, hidden, generator=gen).to(dtype)
    assert native(registry, rms_norm).verdict((wide, w, 1e-5)) is None  # strided rows need no copy
    check(rms_norm, native(registry, rms_norm), (wide, w, 1e-5))
    check(fused_add_rms_norm, native(registry, fused_add_rms_norm), (wide, r2, w, 1e-5))


@pytest.mark.parametrize("qtype", [Q4_0, Q4_1, Q8_0])
@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
def test_dequant_strided_rows_and_empty(qtype, dtype, isa, registry, gen):
    raw = random_gguf_weight(6, 64, qtype, "cpu", gen)
    padded = torch.cat([raw, raw[:, :7]], dim=1)[:, :raw.shape[1]]  # rows 7 bytes further apart
    assert padded.stride(0) != raw.shape[1]
    impl = native(registry, gguf_dequantize)
    assert impl.verdict((padded, qtype, 64, dtype)) is None
    check(gguf_dequantize, impl, (padded, qtype, 64, dtype))
    assert impl.fn(raw[:0], qtype, 64, dtype).shape == (0, 64)


def test_isa_selection():
    assert ISAS[-1] == "scalar" and _native.isa() in ISAS
    flags = set()
    for line in open("/proc/cpuinfo") if os.path.exists("/proc/cpuinfo") else ():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if flags and os.uname().machine == "x86_64":  # an independent reading of the CPU's features
        avx2 = {"avx2", "fma", "f16c"} <= flags
        assert ("avx2" in ISAS) == avx2
        assert ("avx512" in ISAS) == (avx2 and {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags)
    assert ("neon" in ISAS) == (os.uname().machine == "aarch64")
    assert ("vsx" in ISAS) == (os.uname().machine == "ppc64le")
    with pytest.raises(ValueError, match="avx512, avx2, neon, vsx, rvv, scalar"):
        _native.set_isa("sse9")
    for name in ("avx512", "avx2", "neon", "vsx", "rvv"):
        if name not in ISAS:  # runs only on a CPU that lacks the ISA
            with pytest.raises(RuntimeError, match=f"'{name}'.*cannot run it"):
                _native.set_isa(name)
    assert _native.isa() in ISAS


def _import_with_env(value: str) -> subprocess.CompletedProcess:
    code = "from engine.platforms.cpu import _native; print(_native.isa())"
    env = dict(os.environ, ENGINE_CPU_ISA=value)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_env_var_forces_isa():
    lowest = ISAS[-1] if len(ISAS) == 1 else ISAS[1]
    proc = _import_with_env(lowest)
    assert proc.returncode == 0 and proc.stdout.strip() == lowest, proc.stderr
    bad = _import_with_env("avx1024")
    assert bad.returncode != 0 and "ENGINE_CPU_ISA" in bad.stderr and "avx1024" in bad.stderr
    missing = [n for n in ("avx512", "avx2") if n not in ISAS]
    if missing:
        proc = _import_with_env(missing[0])
        assert proc.returncode != 0 and "cannot run it" in proc.stderr


def test_unsupported_inputs_fall_back_to_reference(gen):
    x = torch.randn(6, 64, generator=gen)
    raw_q4_0 = random_gguf_weight(3, 64, Q4_0, "cpu", gen)
    w = torch.randn(64, generator=gen)
    refused = {
        "fp64": (rms_norm, (x.double(), w.double(), 1e-6)),  # fp16 is native now (kernels/test_fp16_wrappers.py)
        "non-contiguous": (rms_norm, (x.t().contiguous().t(), w, 1e-6)),
        "3-D permuted": (rms_norm, (x.view(2, 3, 64).transpose(0, 1), w, 1e-6)),
        "weight dtype": (rms_norm, (x, w.bfloat16(), 1e-6)),
        "residual dtype": (fused_add_rms_norm, (x, x.bfloat16(), w, 1e-6)),
        "dequant fp64": (gguf_dequantize, (raw_q4_0, Q4_0, 64, torch.float64)),
        "raw column-major": (gguf_dequantize,
                             (random_gguf_weight(3, 64, Q8_0, "cpu", gen).t().contiguous().t(), Q8_0, 64,
                              torch.float32)),
        "linear fp64": (gguf_linear, (x.double(), random_gguf_weight(5, 64, Q4_1, "cpu", gen), Q4_1, 64)),
    }
    for why, (op, args) in refused.items():
        registry = KernelRegistry("cpu")  # fresh: choices are cached by shape, not by layout
        register(registry)
        reason = native(registry, op).verdict(args)
        assert isinstance(reason, str) and reason, why
        assert registry.select(op, args) is op.reference_impl, why
    # Unsupported qtype: the native kernel declines and the reference raises the actionable error.
    raw = torch.randint(0, 255, (2, 44), dtype=torch.uint8, generator=gen)
    assert native(registry, gguf_dequantize).verdict((raw, 6, 64, torch.float32))
    assert native(registry, gguf_linear).verdict((x, raw, 6, 64))


def test_cached_choice_survives_strided_input(registry, gen):
    # The registry caches by shape[1:], not strides: the chosen native kernel must stay correct for a
    # layout that its supports() would refuse.
    x = torch.randn(4, 3, 64, generator=gen)
    w = torch.randn(64, generator=gen)
    impl = registry.select(rms_norm, (x, w, 1e-6))
    assert impl.platform == "cpu"
    strided = torch.randn(3, 4, 64, generator=gen).transpose(0, 1)
    torch.testing.assert_close(impl.fn(strided, w, 1e-6), rms_norm.reference(strided, w, 1e-6),
                               atol=1e-5, rtol=1e-5)
    raw = random_gguf_weight(3, 64, Q4_1, "cpu", gen)
    col_major = raw.t().contiguous().t()
    deq = native(registry, gguf_dequantize).fn
    assert torch.equal(deq(col_major, Q4_1, 64, torch.float32), gguf_dequantize.reference(raw, Q4_1, 64,
                                                                                           torch.float32))


def test_cached_choice_guards_sizes_outside_the_cache_key(registry, gen):
    # The first dimension of every argument is outside the cache key, so the native wrapper must
    # not trust a weight length or residual row count that supports() never saw.
    x = torch.randn(5, 64, generator=gen)
    w = torch.randn(64, generator=gen)
    assert registry.select(rms_norm, (x, w, 1e-6)).platform == "cpu"
    w1 = torch.randn(1, generator=gen)  # broadcasts in the reference
    torch.testing.assert_close(native(registry, rms_norm).fn(x, w1, 1e-6), rms_norm.reference(x, w1, 1e-6))
    with pytest.raises(RuntimeError):
        native(registry, fused_add_rms_norm).fn(x, torch.randn(2, 64, generator=gen), w, 1e-6)


def test_doctor_shows_the_isa_in_use():
    from tests.plugin_helpers import doctor_json

    cpu = {"ENGINE_PLATFORM": "cpu"}  # doctor describes the selected platform: cuda on a GPU machine
    device = doctor_json(env=cpu)["device"]
    assert device["native_isa"].startswith(ISAS[0] + " (") and all(i in device["native_isa"] for i in ISAS)
    assert device["native_threads"].startswith(str(_native.num_threads()))
    if "avx2" in ISAS:  # forced lower: doctor reports what runs, not what the CPU could do
        forced = doctor_json(env=cpu | {"ENGINE_CPU_ISA": "avx2"})["device"]
        assert forced["native_isa"].startswith("avx2 (") and forced["native_int8_dot"] == "avx2"
