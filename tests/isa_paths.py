"""The CPU ISA paths the kernels have, and why this host cannot exercise one: test parameters that skip by name.

A kernel ISA is a variant ``_native.set_isa`` selects (avx512, avx2, neon, vsx, rvv, scalar); a sub-path is a
variant chosen inside one (the Q8-activation GEMV's avx512_vnni and neon_dotprod, the bf16 MoE's AMX path). A path
this host cannot run is a skip whose reason names it and the CPU feature it lacks, for example
``avx512 path not run: this CPU lacks avx512f, avx512bw``, so a green run never hides an untested path; the
CI matrix (tests/ci_matrix.py) reports the same reasons per cell.

Whether a path runs is the native module's answer (what the build and the OS allow); /proc/cpuinfo only names
what is missing. tests/platforms/cpu/test_native_kernels.py checks the two readings agree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

import pytest


@dataclass(frozen=True)
class IsaPath:
    name: str
    arch: str                   # os.uname().machine of the CPUs that have it
    needs: tuple[str, ...]      # CPU features it needs, as cpu_features() spells them
    kernel_isa: bool            # a variant set_isa selects (else a sub-path inside one)


_AVX2 = ("avx2", "fma", "f16c")
_AVX512 = _AVX2 + ("avx512f", "avx512bw", "avx512vl", "avx512dq")
PATHS = {p.name: p for p in (
    IsaPath("avx512", "x86_64", _AVX512, True),
    IsaPath("avx2", "x86_64", _AVX2, True),
    IsaPath("avx512_vnni", "x86_64", _AVX512 + ("avx512_vnni",), False),   # gguf_linear_q8act
    IsaPath("amx_bf16", "x86_64", ("amx_bf16", "amx_tile"), False),        # fused_moe, bf16 prefill
    IsaPath("neon", "aarch64", ("asimd",), True),
    IsaPath("neon_dotprod", "aarch64", ("asimd", "asimddp"), False),       # gguf_linear_q8act
    IsaPath("vsx", "ppc64le", ("vsx",), True),
    IsaPath("rvv", "riscv64", ("v",), True),
)}
SCALAR = "scalar"


def cpu_features(cpuinfo: str, machine: str) -> set[str]:
    """The feature names /proc/cpuinfo lists: x86 'flags', AArch64 'Features', RISC-V the 'isa' string's
    single-letter extensions, POWER 'vsx' when the cpu line says altivec (every ppc64le ABI CPU has VSX)."""
    out: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features"):
            out |= set(value.split())
        elif key == "isa" and value.strip().startswith("rv"):
            out |= set(value.strip()[4:].split("_")[0])  # rv64imafdcv_zicsr -> i m a f d c v
        elif key == "cpu" and "altivec" in value:
            out.add("vsx")
    return out


def why_not(path: IsaPath, machine: str, features: set[str]) -> str:
    """The skip reason for a path this host does not run: the architecture, or the features it lacks."""
    if machine != path.arch:
        where = "the C++ kernel tests run it under qemu-user" if path.arch != "x86_64" else "an x86-64 runner runs it"
        return f"{path.name} path not run: this host is {machine}, not {path.arch} ({where})"
    missing = [f for f in path.needs if f not in features]
    if missing:
        return f"{path.name} path not run: this CPU lacks {', '.join(missing)}"
    return f"{path.name} path not run: this CPU lists {', '.join(path.needs)} but this build or OS cannot run it"


@cache
def host() -> tuple[str, frozenset[str]]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    machine = os.uname().machine
    return machine, frozenset(cpu_features(text, machine))




def marks_for(name: str, reason: str | None) -> list:
    """The markers an ISA parameter carries: ``isa``, ``isa_<name>`` (the CI matrix's cells select on them) and,
    when this host cannot run it, a skip that names the path."""
    marks = [pytest.mark.isa, getattr(pytest.mark, f"isa_{name}")]
    if reason:
        marks.append(pytest.mark.skip(reason=reason))
    return marks


def kernel_isa_params(supported: list[str], machine: str | None = None, features: set[str] | None = None) -> list:
    """pytest params for the ``isa`` fixture: every kernel ISA of this architecture (and any the build reports),
    the ones ``supported`` (``_native.supported_isas()``) lacks skipped by name. ``machine`` and ``features``
    default to this host's."""
    if machine is None or features is None:
        machine, features = host()
    names = [p.name for p in PATHS.values() if p.kernel_isa and p.arch == machine]
    names += [n for n in supported if n not in names and n != SCALAR] + [SCALAR]
    return [pytest.param(n, id=n, marks=marks_for(n, None if n in supported else
                                                  why_not(PATHS[n], machine, set(features))))
            for n in names]
