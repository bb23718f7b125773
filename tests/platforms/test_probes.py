"""The in-tree plugins' availability gates, on facts of machines we do not have (pure probe functions)."""

from __future__ import annotations

import struct

from engine.platforms import cuda, ppc, riscv, rocm, xpu


def test_cuda_gate():
    assert cuda.probe_reason(True, None, "2.11.0+cu130", 1) == (True, "1 CUDA device(s) visible")
    ok, why = cuda.probe_reason(False, None, "2.13.0+cpu", 0)
    assert not ok and "built without CUDA" in why
    ok, why = cuda.probe_reason(True, "6.2", "2.5.0+rocm6.2", 1)
    assert not ok and "rocm platform" in why
    ok, why = cuda.probe_reason(True, None, "2.11.0+cu130", 0)
    assert not ok and "CUDA_VISIBLE_DEVICES" in why


def test_rocm_gate_and_fp8_flavour():
    assert rocm.probe_reason("6.2", "2.5.0+rocm6.2", 8)[0]
    assert not rocm.probe_reason(None, "2.13.0+cpu", 0)[0]
    assert "no AMD GPU" in rocm.probe_reason("6.2", "2.5.0+rocm6.2", 0)[1]
    assert rocm.fp8_is_fnuz("gfx942:sramecc+:xnack-")
    assert not rocm.fp8_is_fnuz("gfx950")


def test_xpu_gate():
    assert xpu.probe_reason(True, "2.8.0+xpu", 2)[0]
    assert not xpu.probe_reason(False, "2.3.0", 0)[0]
    assert "Intel GPU" in xpu.probe_reason(True, "2.13.0+cpu", 0)[1]


def test_riscv_gate():
    assert riscv.isa_has_vector("rv64imafdcv_zicsr_zifencei_zba_zbb_zvl256b")
    assert not riscv.isa_has_vector("rv64imafdc_zicsr_zifencei")
    assert not riscv.isa_has_vector("rv64imafdc_zve32x")  # 'v' only inside a multi-letter extension
    assert riscv.probe_reason("riscv64", "rv64imafdcv", None)[0]
    assert not riscv.probe_reason("riscv64", "rv64imafdc", 0)[0]
    assert riscv.probe_reason("riscv64", None, 1 << riscv.HWCAP_V_BIT)[0]
    assert "not riscv64" in riscv.probe_reason("x86_64", None, None)[1]
    auxv = struct.pack("=QQQQQQ", 6, 4096, riscv.AT_HWCAP, 1 << riscv.HWCAP_V_BIT | 1, 0, 0)
    assert riscv.auxv_hwcap(auxv) == 1 << riscv.HWCAP_V_BIT | 1
    assert riscv.cpuinfo_isa("processor\t: 0\nhart\t: 0\nisa\t\t: rv64imafdcv\n") == "rv64imafdcv"


def test_ppc_gate():
    assert ppc.power_generation("processor\t: 0\ncpu\t\t: POWER9 (raw), altivec supported\n") == 9
    assert ppc.power_generation("cpu\t\t: POWER10 (architected), altivec supported") == 10
    assert ppc.probe_reason("ppc64le", 10)[0]
    ok, why = ppc.probe_reason("ppc64le", 8)
    assert not ok and "POWER8 is older than POWER9" in why
    assert not ppc.probe_reason("ppc64le", None)[0]
    assert not ppc.probe_reason("x86_64", None)[0]


def test_probes_here_are_honest():
    """Every probe answers for this machine, with a reason either way: cuda yes only where torch sees an NVIDIA GPU
    (the H200 machine), rocm only under a ROCm torch, riscv / ppc only on their CPUs (never on x86-64)."""
    import platform

    import torch

    nvidia = torch.cuda.is_available() and torch.version.hip is None
    amd = torch.cuda.is_available() and torch.version.hip is not None
    machine = platform.machine()
    for mod, expected in ((cuda, nvidia), (rocm, amd), (riscv, machine == "riscv64" and None),
                          (ppc, machine == "ppc64le" and None)):
        ok, why = mod.probe()
        assert why, mod.__name__
        if expected is not None:  # None: a riscv64 / ppc64le CPU, where the answer also depends on its extensions
            assert ok is expected, (mod.__name__, why)
