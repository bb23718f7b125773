"""Timing and the measured hardware ceilings shared by the GPU benchmarks (``bench_gpu.py`` and ``gpu/*.py``).

Ceilings are measured in the same run as the numbers compared with them (FACTS.md's figures come from other
days): device-to-device copy bandwidth counted as bytes read + written, and the bf16 GEMM rate at 8192^3 on
random data.
"""

from __future__ import annotations

import torch


def bench_us(fn, warmup: int = 25, rep: int = 200) -> float:
    """Median time of ``fn`` in microseconds (``triton.testing.do_bench``: events, L2 flushed between calls;
    ``warmup`` and ``rep`` are milliseconds)."""
    import triton.testing as tt

    return tt.do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3


def copy_bandwidth(device: str = "cuda", nbytes: int = 1 << 30) -> float:
    """Device-to-device copy of ``nbytes``: bytes read + written per second."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    b = torch.empty_like(a)
    return 2 * nbytes / (bench_us(lambda: b.copy_(a), warmup=50, rep=300) * 1e-6)


def bf16_gemm_rate(device: str = "cuda", n: int = 8192) -> float:
    """FLOP/s of a bf16 ``n`` x ``n`` x ``n`` torch matmul on random data."""
    x = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return 2 * n ** 3 / (bench_us(lambda: x @ y, warmup=50, rep=300) * 1e-6)
