"""The ppc platform: POWER9 or newer (ppc64le) with VSX; extends cpu with VSX fp16 kernels.

Only cheap, import-free probe logic lives here; the Platform subclass is in ``platform.py``.
"""

from __future__ import annotations

import platform as _pyplatform
import re

MIN_POWER = 9


def power_generation(cpuinfo: str) -> int | None:
    """The N of 'POWERN' in /proc/cpuinfo's cpu line (e.g. 'POWER9 (raw), altivec supported')."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu":
            m = re.search(r"POWER(\d+)", value, re.IGNORECASE)
            if m:
                return int(m.group(1))
    return None


def probe_reason(machine: str, generation: int | None) -> tuple[bool, str]:
    if machine != "ppc64le":
        return False, f"this machine is {machine}, not ppc64le"
    if generation is None:
        return False, "ppc64le, but /proc/cpuinfo names no POWER generation; the cpu platform serves it"
    if generation < MIN_POWER:
        return False, (f"POWER{generation} is older than POWER{MIN_POWER} (no fp16 VSX conversions); "
                       "the cpu platform serves it")
    return True, f"POWER{generation} with VSX"


def probe() -> tuple[bool, str]:
    from engine.platforms.cpu import read_cpuinfo

    machine = _pyplatform.machine()
    return probe_reason(machine, power_generation(read_cpuinfo()) if machine == "ppc64le" else None)
