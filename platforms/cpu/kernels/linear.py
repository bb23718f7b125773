"""Dense ``linear`` on the CPU: fp16 through the native fp16 kernel (csrc/fp16_linear*.cpp) for the row counts where
it was measured faster than torch's fp16 GEMM, everything else through torch's ``F.linear`` (``torch_blas``: MKL,
oneDNN or OpenBLAS), which is what the models ran before this op had CPU kernels.

How many rows of x (M) the native kernel takes comes from one measurement (Intel Xeon with AVX-512, AVX512-FP16 and
VNNI, 2 threads, torch 2.13, 2026-12-01; fp16 W of 1536x576 and 576x1536; figures are torch's time / native's):

* torch's oneDNN fp16 GEMM (it needs AVX512-FP16): native 1.2-1.3x at M = 1-2, 0.88x at 3, 0.68x at 4, 0.31x at 64.
* oneDNN capped below AVX512-FP16 (``ONEDNN_MAX_CPU_ISA=AVX2`` or ``AVX512_CORE_BF16``: the stand-in for x86 CPUs
  without it): native 1.0-1.2x at M = 1, 1.2-1.7x at 2-8, 2.2-3.1x at 64.
* torch with oneDNN off (its generic vectorized fp16 GEMM: the stand-in for torch on POWER, which could not be
  measured here): native 1.0-1.1x at M = 1, 1.2-1.6x at 4, 2.6-3.2x from M = 64 to 256.
* the scalar ISA (``ENGINE_CPU_ISA=scalar``): native 0.01-0.12x, never worth it.

Hence ``cpu_fp16_max_m`` and ``ppc_fp16_max_m``, which each platform's ``fp16_linear_max_m`` returns. NEON and
RVV were not measured: fp16 stays on torch there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.core.ops.linear import linear
from engine.platforms.cpu import _native, cpu_flags

from ._common import PRIORITY, isa_note, rows_of

EVERY_M = None  # a max_m that takes every row count
X86_AVX512FP16_MAX_M = 2  # above this torch's oneDNN fp16 GEMM wins (see the module docstring)


def cpu_fp16_max_m(isa: str, cpuinfo: str) -> int | None:
    """Rows up to which the cpu platform routes fp16 ``linear`` to the native kernel (0: never, None: always)."""
    if isa not in ("avx2", "avx512"):
        return 0  # scalar: far slower than torch; NEON, RVV: not measured
    return X86_AVX512FP16_MAX_M if "avx512_fp16" in cpu_flags(cpuinfo) else EVERY_M


def ppc_fp16_max_m(isa: str, cpuinfo: str = "") -> int | None:
    """The same for the ppc platform: every M on a vector ISA (VSX on POWER9+; x86's when tests run the ppc
    platform's registrations here), never on the scalar one."""
    return 0 if isa == "scalar" else EVERY_M



def _supports_native_fp16(max_m, x, weight, bias):
    ts = (x, weight) if bias is None else (x, weight, bias)
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in ts):
        return "x, weight (and bias) must be cpu tensors"
    if any(t.dtype != torch.float16 for t in ts):
        return "fp16 only (x, weight and bias); other dtypes run torch_blas"
    if x.dim() < 1 or weight.dim() != 2 or weight.shape[1] != x.shape[-1] or x.shape[-1] == 0:
        return "x must be [..., K] and weight [N, K] with K > 0"
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        return "bias must be [N]"
    if max_m is not None and x.numel() // x.shape[-1] > max_m:
        return (f"M = {x.numel() // x.shape[-1]} rows: above {max_m} torch's fp16 GEMM is faster on this CPU "
                "(measured; torch_blas runs it)")
    return True


def native_fp16_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``linear`` in fp16: fp32 products and sums, the bias added in fp32, y rounded to fp16 once."""
    n, k = weight.shape
    x2, m, xs = rows_of(x)
    if weight.stride(1) != 1:  # strides are not in the dispatch cache key: copy rather than misread
        weight = weight.contiguous()
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()  # kept referenced until the call returns
    y = torch.empty((*x.shape[:-1], n), dtype=torch.float16)
    _native.fp16_linear(x2.data_ptr(), xs, weight.data_ptr(), weight.stride(0), y.data_ptr(), n, m, n, k,
                        0 if bias is None else bias.data_ptr())
    return y


def _supports_blas(x, weight, bias):
    ts = (x, weight) if bias is None else (x, weight, bias)
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in ts):
        return "x, weight (and bias) must be cpu tensors"
    return True


def register(registry, fp16_max_m: int | None) -> None:
    """``native_fp16`` for fp16 up to ``fp16_max_m`` rows (0: not registered; None: every M), above it
    ``torch_blas`` for every dtype (so an fp32/bf16 call, which the native kernel declines, is not reported as
    running on the reference: it runs exactly what it ran before)."""
    if fp16_max_m != 0:
        rows = "every M" if fp16_max_m is None else f"M <= {fp16_max_m}"
        registry.register(linear, native_fp16_linear, name="native_fp16", priority=PRIORITY,
                          supports=lambda *args: _supports_native_fp16(fp16_max_m, *args), dtypes=(torch.float16,),
                          note=f"fp16 x/W/bias, fp32 sums ({rows}; measured faster than torch's fp16 GEMM there); "
                          + isa_note())
    # fp16 named explicitly: the platform's own dtypes (fp32, bf16) would leave torch_blas claiming no fp16, and then
    # the rows native_fp16 declines on an AVX512-FP16 CPU (M > 2) had no kernel in the kit's coverage (a Xeon with
    # AVX512-FP16 failed it, session 19).
    registry.register(linear, F.linear, name="torch_blas", priority=0, supports=_supports_blas,
                      dtypes=(torch.float32, torch.bfloat16, torch.float16),
                      note="torch's F.linear (MKL/oneDNN/OpenBLAS): fp32, bf16, and fp16 where native_fp16 declines")
