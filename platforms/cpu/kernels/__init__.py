"""The cpu platform's op implementations (native C++ through pybind11).

The native module ``engine.platforms.cpu._native`` takes raw addresses, sizes and strides; the
modules here validate tensors (``supports``), allocate outputs and wrap the calls as op
implementations. When the native module cannot be imported (not built) every kernel is recorded as
skipped with the reason, and the ops fall back to their references (the platform has warned); an
ENGINE_CPU_ISA / ENGINE_NUM_THREADS the native module refuses is a CpuConfigError instead.
"""

from __future__ import annotations

NATIVE_OPS = ("gguf_dequantize", "gguf_linear", "gguf_linear_q8act", "rms_norm", "fused_add_rms_norm",
              "paged_attention_decode", "paged_attention_prefill", "write_kv_cache", "silu_and_mul", "rotary_embedding",
              "rotary_write_kv", "fused_moe", "mla_decode", "fused_moe_gguf", "all_reduce", "all_gather", "broadcast")


def register(registry, fp16_max_m=None) -> None:
    """Register every native CPU kernel into ``registry``. ``fp16_max_m(isa, cpuinfo)`` is the platform's measured
    rule for up to how many rows fp16 ``linear`` runs the native kernel (default: the cpu platform's,
    linear.cpu_fp16_max_m)."""
    from engine.platforms.cpu import config, read_cpuinfo

    why = config.check_native()  # a bad ENGINE_CPU_ISA raises; a missing build is recorded for `engine doctor`
    if why is not None:
        for op in NATIVE_OPS:
            registry.skip(op, "native", why)
        return

    from engine.platforms.cpu import _native

    from . import attention, comm, gguf, linear, mla, moe, moe_bf16_amx, moe_gguf, norm, small_ops

    gguf.register(registry)
    linear.register(registry, (fp16_max_m or linear.cpu_fp16_max_m)(_native.isa(), read_cpuinfo()))
    norm.register(registry)
    attention.register(registry)
    mla.register(registry)
    small_ops.register(registry)
    moe.register(registry)
    moe_gguf.register(registry)
    moe_bf16_amx.register(registry, read_cpuinfo())
    comm.register(registry)
