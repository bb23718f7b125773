"""Every CPU ISA path the kernels have, one test each: where /proc/cpuinfo says the CPU has the features, the native
kernels must really take the path; where it does not, the test is a skip that names the path and the missing
features (so the report of a green run lists what this host could not exercise)."""

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.moe import fused_moe
from engine.platforms.cpu import _native, read_cpuinfo
from engine.platforms.cpu.kernels import register
from tests.isa_paths import PATHS, cpu_features, host, marks_for, why_not


def _params():
    machine, features = host()
    out = []
    for p in PATHS.values():
        runnable = machine == p.arch and set(p.needs) <= features
        out.append(pytest.param(p.name, id=p.name, marks=marks_for(p.name, None if runnable else
                                                                   why_not(p, machine, set(features)))))
    return out


@pytest.fixture
def restore_isa():
    before = _native.isa()
    yield
    _native.set_isa(before)


@pytest.mark.parametrize("path", _params())
def test_cpu_with_the_features_runs_the_path(path, restore_isa):
    isas = _native.supported_isas()
    if PATHS[path].kernel_isa:
        assert path in isas, f"this CPU has {PATHS[path].needs} but the native build runs only {isas}"
        _native.set_isa(path)
        assert _native.isa() == path
    elif path in ("avx512_vnni", "neon_dotprod"):
        _native.set_isa(path.split("_")[0])
        assert _native.gguf_q8act_variant() == path
    elif path == "amx_bf16":
        reg = KernelRegistry("cpu")
        register(reg)
        e, hidden, inter, t = 4, 64, 32, 64
        args = (torch.randn(t, hidden).bfloat16(), torch.randn(e, 2 * inter, hidden).bfloat16(),
                torch.randn(e, hidden, inter).bfloat16(), torch.randn(t, e), 2, True)
        assert reg.select(fused_moe, args).name == "bf16_amx_experts", reg.explain(fused_moe, args)
    else:
        pytest.fail(f"no check for ISA path {path!r}: add one here")


def test_skip_reasons_name_the_path_and_what_is_missing():
    avx2_only = "processor : 0\nflags : fpu sse2 avx avx2 fma f16c\n"
    feats = cpu_features(avx2_only, "x86_64")
    assert why_not(PATHS["avx512"], "x86_64", feats) == \
        "avx512 path not run: this CPU lacks avx512f, avx512bw, avx512vl, avx512dq"
    assert why_not(PATHS["amx_bf16"], "x86_64", feats) == "amx_bf16 path not run: this CPU lacks amx_bf16, amx_tile"
    assert why_not(PATHS["avx512_vnni"], "x86_64", cpu_features(avx2_only.replace(
        "f16c", "f16c avx512f avx512bw avx512vl avx512dq"), "x86_64")).endswith("this CPU lacks avx512_vnni")
    assert why_not(PATHS["neon_dotprod"], "x86_64", feats).startswith(
        "neon_dotprod path not run: this host is x86_64, not aarch64")
    arm = cpu_features("processor : 0\nFeatures : fp asimd evtstrm aes crc32\n", "aarch64")
    assert why_not(PATHS["neon_dotprod"], "aarch64", arm) == "neon_dotprod path not run: this CPU lacks asimddp"
    assert "v" in cpu_features("hart : 0\nisa : rv64imafdcv_zicsr_zvl256b\n", "riscv64")
    assert "v" not in cpu_features("hart : 0\nisa : rv64imafdc_zicsr\n", "riscv64")
    assert cpu_features(read_cpuinfo(), host()[0]) == set(host()[1])
