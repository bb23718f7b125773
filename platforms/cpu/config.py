"""The cpu platform's environment settings, checked before anything runs: ENGINE_CPU_ISA and ENGINE_NUM_THREADS.

A bad value is a :class:`CpuConfigError` (a ValueError, so the CLI prints it as one line and exits 2) instead of
the native kernels quietly failing to load and every op falling back to its plain-torch reference. Cheap: no
torch, no native import (the native module checks the same values again at import; ``check_native`` turns its
failure into the same error).
"""

from __future__ import annotations

import logging
import os

ISA_VAR, THREADS_VAR = "ENGINE_CPU_ISA", "ENGINE_NUM_THREADS"
ISA_NAMES = ("avx512", "avx2", "neon", "vsx", "rvv", "scalar")

log = logging.getLogger("engine")


class CpuConfigError(ValueError):
    """ENGINE_CPU_ISA or ENGINE_NUM_THREADS holds a value the cpu platform cannot honour."""


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def requested_threads(environ=os.environ) -> int | None:
    """ENGINE_NUM_THREADS as an int >= 1, None when unset; raises CpuConfigError otherwise."""
    raw = environ.get(THREADS_VAR)
    if raw is None:
        return None
    text = raw.strip()
    if not text.isdigit() or int(text) < 1:
        raise CpuConfigError(f"{THREADS_VAR} must be a whole number >= 1 (this machine has {usable_cpus()} "
                             f"usable CPUs), got {raw!r}; unset it to use them all")
    return int(text)


def requested_isa(environ=os.environ) -> str | None:
    """ENGINE_CPU_ISA when set to a known name, None when unset or empty; raises CpuConfigError otherwise.
    Whether this CPU runs it is the native module's check (see check_native)."""
    raw = environ.get(ISA_VAR)
    if not raw:
        return None
    if raw not in ISA_NAMES:
        raise CpuConfigError(f"{ISA_VAR}={raw!r} is not a CPU ISA the engine knows; use one of "
                             f"{', '.join(ISA_NAMES)}, or unset it to use the best this CPU runs")
    return raw


def check_env(environ=os.environ) -> list[str]:
    """Validate both variables; return warnings (more threads than usable CPUs), raise CpuConfigError on errors."""
    requested_isa(environ)
    threads = requested_threads(environ)
    cpus = usable_cpus()
    if threads is not None and threads > cpus:
        return [f"{THREADS_VAR}={threads} is more than the {cpus} CPUs this process may use; the extra threads "
                "compete for the same cores and slow every kernel down"]
    return []


def check_native() -> str | None:
    """Import the native kernels. Returns None when they load, else why not (not built, say); raises
    CpuConfigError when they refuse because of ENGINE_CPU_ISA / ENGINE_NUM_THREADS (an ISA this CPU lacks)."""
    try:
        from . import _native  # noqa: F401
    except Exception as exc:
        msg = str(exc)
        for var in (ISA_VAR, THREADS_VAR):
            if var in msg:
                raise CpuConfigError(f"{msg.rstrip('.')}; unset {var} or pick one of the values it lists") from exc
        return f"engine.platforms.cpu._native unavailable: {type(exc).__name__}: {exc}"
    return None


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Tell the user ``message`` on the "engine" logger (stderr when logging is not configured), once a process."""
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("engine: warning: %s", message)
