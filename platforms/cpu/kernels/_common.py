"""Shared helpers for the native CPU kernel wrappers."""

from __future__ import annotations

import torch

from engine.platforms.cpu import _native

# The activation dtypes of every native kernel (the GGUF and MoE kernels take only these) ...
DTYPE_CODE = {torch.float32: _native.DTYPE_F32, torch.bfloat16: _native.DTYPE_BF16}
# ... and of the kernels that also take fp16 storage (RMSNorm, paged attention, rotary, SiLU-and-mul: fp32 math,
# one rounding per stored value; the ppc platform's fp16 path, the same source on every ISA).
STORAGE_CODE = {**DTYPE_CODE, torch.float16: _native.DTYPE_F16}
STORAGE_NAMES = "fp32, bf16, fp16"
PRIORITY = 10


def isa_note() -> str:
    return f"native C++, ISA chosen at run time ({_native.isa()} at registration; ENGINE_CPU_ISA forces one)"


def rows_of(t: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(tensor, rows, row stride in elements) viewing ``t`` as [rows, t.shape[-1]] with unit last stride.

    Copies only when no such view exists: the registry caches its choice without looking at
    strides, so a kernel chosen for a contiguous call must still be correct for a strided one.
    """
    h = t.shape[-1]
    if t.is_contiguous():
        return t, t.numel() // h if h else 0, h
    if t.dim() == 2 and t.stride(1) == 1:
        return t, t.shape[0], t.stride(0)
    t = t.contiguous()
    return t, t.numel() // h if h else 0, h


def empty_rows(t: torch.Tensor) -> torch.Tensor:
    """A contiguous output of t's shape and dtype (the cheapest allocation torch offers here)."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def row_layout_ok(t: torch.Tensor) -> bool:
    """True when ``rows_of`` would not copy."""
    return t.is_contiguous() or (t.dim() == 2 and t.stride(1) == 1)
