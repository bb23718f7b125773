"""Kernel contracts: every op the models call, with its reference implementation.

``from engine.core import ops; ops.rms_norm(x, w, eps)`` dispatches to the selected platform's
best implementation (see :mod:`engine.core.ops.registry`).
"""

from .norm import fused_add_rms_norm, rms_norm
from .registry import OPS, Case, KernelRegistry, OpDef, Tolerance, active_registry

__all__ = [
    "OPS", "Case", "KernelRegistry", "OpDef", "Tolerance", "active_registry",
    "fused_add_rms_norm", "rms_norm",
]
