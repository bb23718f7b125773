"""Timing and the measured hardware ceilings shared by the GPU benchmarks (``bench_gpu.py`` and ``gpu/*.py``).

Ceilings are measured in the same run as the numbers compared with them (FACTS.md's figures come from other
days): device-to-device copy bandwidth counted as bytes read + written, and the bf16 GEMM rate at 8192^3 on
random data.

Off a GPU (CPU tensors under the Triton interpreter: how CI runs every benchmark at its tiny size, so that a rename
cannot break one unnoticed) the timers run the call once and return its wall time, ``capture`` replays by calling
again, and ``l2_bytes`` is 0: the benchmark's code path runs end to end, its numbers mean nothing.
"""

from __future__ import annotations

import time

import torch


def on_gpu() -> bool:
    return torch.cuda.is_available()


def once_us(fn) -> float:
    """Wall time of one call of ``fn`` in microseconds (the timers' stand-in off a GPU)."""
    t = time.perf_counter()
    fn()
    if on_gpu():
        torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e6


def bench_us(fn, warmup: int = 25, rep: int = 200) -> float:
    """Median time of ``fn`` in microseconds (``triton.testing.do_bench``: events, L2 flushed between calls;
    ``warmup`` and ``rep`` are milliseconds). Off a GPU: one call's wall time."""
    if not on_gpu():
        return once_us(fn)
    import triton.testing as tt

    return tt.do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3


def graph_us(fn, rep: int = 100) -> float:
    """Median time of ``fn`` captured in a CUDA graph, in microseconds (``triton.testing.do_bench_cudagraph``: no
    host launch cost; one call first compiles outside the capture). Off a GPU: one call's wall time."""
    if not on_gpu():
        return once_us(fn)
    import triton.testing as tt

    fn()
    return tt.do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3


def capture(fn):
    """``(replay, out)``: ``fn`` captured once into a CUDA graph (after two calls on a side stream, which compile
    and allocate), and the output tensor the capture wrote, which each ``replay()`` rewrites. Off a GPU there are
    no graphs: ``replay()`` calls ``fn`` again and copies its result into ``out``."""
    if not on_gpu():
        out = fn()
        return (lambda: out.copy_(fn())), out
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def l2_bytes(device="cuda") -> int:
    """The L2 size of ``device`` (what rotating input copies must exceed); 0 off a GPU (one copy is enough)."""
    device = torch.device(device)
    if device.type != "cuda" or not on_gpu():
        return 0
    return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 50 << 20


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
