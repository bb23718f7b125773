"""The ppc platform: POWER9 or newer (ppc64le) with VSX; extends cpu with VSX fp16 kernels.

Only cheap, import-free probe logic lives here; the Platform subclass is in ``platform.py``.
"""

from __future__ import annotations

import platform as _pyplatform
import re
import struct

MIN_POWER = 9
AT_HWCAP2 = 26
PPC_FEATURE2_ARCH_3_00 = 0x00800000  # POWER ISA 3.0 (POWER9): what the native VSX kernels are built for


def power_generation(cpuinfo: str) -> int | None:
    """The N of 'POWERN' in /proc/cpuinfo's cpu line (e.g. 'POWER9 (raw), altivec supported')."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu":
            m = re.search(r"POWER(\d+)", value, re.IGNORECASE)
            if m:
                return int(m.group(1))
    return None


def auxv_hwcap2(auxv: bytes) -> int | None:
    """AT_HWCAP2 from the bytes of /proc/self/auxv (pairs of native unsigned longs)."""
    for i in range(0, len(auxv) - 15, 16):
        key, value = struct.unpack_from("=QQ", auxv, i)
        if key == AT_HWCAP2:
            return value
    return None


def probe_reason(machine: str, generation: int | None, hwcap2: int | None = None) -> tuple[bool, str]:
    """The hardware capability bits decide when known (the native module's own check, isa.cpp), else the
    POWER generation /proc/cpuinfo names."""
    if machine != "ppc64le":
        return False, f"this machine is {machine}, not ppc64le"
    name = f"POWER{generation}" if generation is not None else "this POWER CPU"
    if hwcap2 is not None:
        if hwcap2 & PPC_FEATURE2_ARCH_3_00:
            return True, f"{name} with VSX and POWER ISA 3.0 (AT_HWCAP2)"
        return False, (f"{name} lacks POWER ISA 3.0 (AT_HWCAP2 has no PPC_FEATURE2_ARCH_3_00: no fp16 VSX "
                       f"conversions, the native VSX kernels are built for POWER9); the cpu platform serves it")
    if generation is None:
        return False, "ppc64le, but /proc/cpuinfo names no POWER generation; the cpu platform serves it"
    if generation < MIN_POWER:
        return False, (f"POWER{generation} is older than POWER{MIN_POWER} (no fp16 VSX conversions); "
                       "the cpu platform serves it")
    return True, f"POWER{generation} with VSX"


def probe() -> tuple[bool, str]:
    from engine.platforms.cpu import read_cpuinfo

    machine = _pyplatform.machine()
    if machine != "ppc64le":
        return probe_reason(machine, None)
    try:
        with open("/proc/self/auxv", "rb") as f:
            hwcap2 = auxv_hwcap2(f.read())
    except OSError:
        hwcap2 = None
    return probe_reason(machine, power_generation(read_cpuinfo()), hwcap2)
