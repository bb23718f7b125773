"""Portable Triton kernels shared by the GPU platforms (cuda, rocm, xpu).

This package is not a platform: it has no entry point and no probe. A GPU platform calls
:func:`register` from its ``register_kernels`` with its torch device type and compute capability, and
gets every kernel whose Triton backend runs there, next to its own vendor paths. No platform imports
another platform's internals; they all import this shared module.

Each kernel module exposes ``register(registry, device_type, capability)``: it registers op
implementations whose ``supports`` accepts only tensors on ``device_type`` (``"cpu"`` under
``TRITON_INTERPRET=1``, which is how CI runs them) and the dtypes and shapes the kernel handles.
"""

from __future__ import annotations

import functools
import importlib
import os

# kernel module -> the ops it implements (named here so a missing Triton can be reported per op)
KERNEL_MODULES = {
    "attention": ("paged_attention_decode", "paged_attention_prefill"),
    "kv_cache": ("write_kv_cache",),
    "linear": ("linear",),
    "gguf_linear": ("gguf_linear", "gguf_dequantize"),
    "gguf_kquant": ("gguf_linear", "gguf_dequantize"),
    "norm": ("rms_norm", "fused_add_rms_norm"),
    "activation": ("silu_and_mul",),
    "rotary": ("rotary_embedding", "rotary_write_kv"),
    "fused_moe": ("fused_moe", "fused_moe_fp8"),
    "fused_moe_gguf": ("fused_moe_gguf",),
    "fused_moe_nvfp4": ("fused_moe_nvfp4",),
    "fp8_linear": ("fp8_linear", "fp8_quantize_per_token"),
    "fp8_gemv": ("fp8_linear",),
    "nvfp4": ("nvfp4_quantize", "nvfp4_linear", "nvfp4_linear_w4a4"),
    "int4_linear": ("int4_linear",),
    "int8_linear": ("int8_linear",),
    "mla": ("mla_decode",),
}


def interpreting() -> bool:
    """True under the Triton interpreter (``TRITON_INTERPRET=1``): kernels run on CPU tensors, slowly."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def sm_count(device, interpreter_sms: int) -> int:
    """Multiprocessors of ``device`` (what grids are sized by); ``interpreter_sms`` stands in off a GPU, under the
    interpreter, where a module picks a count that makes its multi-program paths run in CI."""
    import torch

    if device.type == "cuda" and torch.cuda.is_available():
        return _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())
    return interpreter_sms


@functools.cache
def _multiprocessors(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def register(registry, device_type: str, capability: tuple[int, int] | None = None) -> None:
    """Register every portable Triton kernel for tensors on ``device_type``.

    When Triton itself cannot be imported, each kernel module's ops are recorded as skipped with the
    reason (``engine doctor`` shows it) and the ops run their references."""
    try:
        import triton  # noqa: F401
    except Exception as exc:
        why = (f"triton unavailable: {type(exc).__name__}: {exc} (install your platform's extra: "
               """pip install -e ".[cuda]", ".[rocm]" or ".[xpu]")""")
        for module, ops in KERNEL_MODULES.items():
            for op in ops:
                registry.skip(op, f"triton_{module}", why)
        return
    for name in KERNEL_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(registry, device_type, capability)
