"""The riscv platform: RISC-V 64 with the V (RVV 1.0) extension; extends cpu with RVV kernels.

Only cheap, import-free probe logic lives here; the Platform subclass is in ``platform.py``.
"""

from __future__ import annotations

import platform as _pyplatform
import re
import struct

AT_HWCAP = 16
HWCAP_V_BIT = ord("V") - ord("A")  # the kernel sets bit (letter - 'A') for each single-letter extension


def isa_has_vector(isa: str) -> bool:
    """True if a /proc/cpuinfo ``isa`` string (e.g. 'rv64imafdcv_zicsr_zvl256b') names the V extension."""
    m = re.match(r"rv(?:32|64)([a-z]*)", isa.strip().lower())
    return bool(m) and "v" in m.group(1)


def cpuinfo_isa(cpuinfo: str) -> str | None:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "isa":
            return value.strip()
    return None


def auxv_hwcap(auxv: bytes) -> int | None:
    """AT_HWCAP from the bytes of /proc/self/auxv (pairs of native unsigned longs)."""
    for i in range(0, len(auxv) - 15, 16):
        key, value = struct.unpack_from("=QQ", auxv, i)
        if key == AT_HWCAP:
            return value
    return None


def probe_reason(machine: str, isa: str | None, hwcap: int | None) -> tuple[bool, str]:
    if machine != "riscv64":
        return False, f"this machine is {machine}, not riscv64"
    if isa is not None and isa_has_vector(isa):
        return True, f"riscv64 with the V extension (isa {isa})"
    if hwcap is not None and hwcap >> HWCAP_V_BIT & 1:
        return True, "riscv64 with the V extension (AT_HWCAP)"
    return False, f"riscv64 without the V (RVV 1.0) extension (isa {isa or 'unknown'}); the cpu platform serves it"


def probe() -> tuple[bool, str]:
    from engine.platforms.cpu import read_cpuinfo

    machine = _pyplatform.machine()
    if machine != "riscv64":
        return probe_reason(machine, None, None)
    try:
        with open("/proc/self/auxv", "rb") as f:
            hwcap = auxv_hwcap(f.read())
    except OSError:
        hwcap = None
    return probe_reason(machine, cpuinfo_isa(read_cpuinfo()), hwcap)
