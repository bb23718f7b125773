"""The cpu platform: always available; native kernels picked at run time by the CPU's ISA.

Only cheap, import-free helpers live here; the Platform subclass is in ``platform.py``.
"""

from __future__ import annotations

import platform as _pyplatform


def read_cpuinfo() -> str:
    """The text of /proc/cpuinfo, or '' where there is none (macOS, Windows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first CPU in /proc/cpuinfo text (x86's ``flags`` line; empty where it has none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()

def cpu_model_name(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "cpu", "uarch", "Model") and value.strip():
            return value.strip()
    return _pyplatform.processor() or _pyplatform.machine()


def probe() -> tuple[bool, str]:
    return True, f"host CPU ({_pyplatform.machine()}) is always usable"
