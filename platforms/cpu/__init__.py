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


def cpu_model_name(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "cpu", "uarch", "Model") and value.strip():
            return value.strip()
    return _pyplatform.processor() or _pyplatform.machine()


def probe() -> tuple[bool, str]:
    return True, f"host CPU ({_pyplatform.machine()}) is always usable"
