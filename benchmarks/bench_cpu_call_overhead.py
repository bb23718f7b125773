"""Per-call cost around the native CPU kernels (issue 11, item 1): what one op call costs beyond its kernel.

Rows, each the median over rounds of the mean of many back-to-back calls, in microseconds:
- pybind null call (``_native.num_threads()``): the floor of any native call;
- the raw ``_native.gguf_linear`` on a k=32 n=32 M=1 problem (serial: below the pool's grain), output preallocated;
- the same through the platform wrapper (checks, ``torch.empty``, pointer marshalling) and through a model
  ``CallSite`` (one dict lookup more), and replayed from a CPU decode graph (platforms/cpu/graph.py: the recorded
  native call, no wrapper);
- the thread pool hand-off: a tiny ``silu_and_mul`` just large enough to split over 2 threads, with the pool at
  2 threads vs at 1 (the difference is what waking the worker, claiming chunks and waiting for it cost);
- each GGUF linear shape of a SmolLM2-135M decode step at 1 and 2 threads, raw (the kernel) vs the wrapper;
- a whole step's GGUF linears back to back, with and without 30 us of Python between calls (thread hand-off).

    python benchmarks/bench_cpu_call_overhead.py [--calls 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.core.ops.gguf_quant import GGUF_QTYPES, gguf_linear
from engine.core.ops.registry import CallSite
from engine.platforms.cpu import _native
from engine.platforms.cpu.graph import capture
from engine.platforms.cpu.kernels import gguf, small_ops


def _us(fn, calls: int, rounds: int) -> float:
    fn()
    per = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append(1e6 * (time.perf_counter() - t) / calls)
    return statistics.median(per)


def _raw_weight(n: int, k: int, qtype: int = 3) -> torch.Tensor:
    return torch.randint(0, 256, (n, k // 32 * GGUF_QTYPES[qtype][1]), dtype=torch.uint8)


def _fix_scales(raw: torch.Tensor, qtype: int = 3) -> torch.Tensor:
    # Q4_1 blocks start with fp16 d and m: small finite values so the sums stay finite.
    blk = GGUF_QTYPES[qtype][1]
    v = raw.view(raw.shape[0], -1, blk)
    v[:, :, :4] = torch.tensor([0.01, 0.0], dtype=torch.float16).view(torch.uint8)
    return raw


def _shape_row(name: str, n: int, k: int, layers: int, threads: int, c: int, r: int) -> None:
    """One decode-step GGUF shape at 1 and ``threads`` threads: the raw kernel vs the platform wrapper, rotating over
    ``layers`` distinct weights."""
    ws = [_fix_scales(_raw_weight(n, k)) for _ in range(layers)]
    x = torch.randn(1, k)
    y = torch.empty(1, n)
    it = iter(range(1 << 62))

    def raw_call():
        w = ws[next(it) % layers]
        _native.gguf_linear(3, x.data_ptr(), k, 1, k, w.data_ptr(), w.stride(0), n, y.data_ptr(), n, 0)

    def wrapped():
        gguf._fused_linear(x, ws[next(it) % layers], 3, k)

    calls = max(20, min(c, 200 * layers))
    for t in sorted({1, threads}):
        _native.set_num_threads(t)
        a, b = _us(raw_call, calls, r), _us(wrapped, calls, r)
        print(f"{name:20s} {t} thr: raw {a:8.2f} us ({ws[0].numel() / a / 1e3:5.1f} GB/s), wrapper {b:8.2f} us "
              f"(+{b - a:5.2f})")


def _step_row(threads: int, rounds: int, gap_us: float) -> None:
    """A decode step's GGUF linears (30 layers of SmolLM2-135M plus lm_head, ~84 MB of distinct Q4_1 weights) back
    to back, with ``gap_us`` of busy Python between calls (what the norms, rotary and attention put there in a real
    step): ms per step at 1 and ``threads`` threads. With a gap, a worker that sleeps between calls shows up as
    2 threads no faster than 1."""
    layer = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
    ws = [(_fix_scales(_raw_weight(n, k)), n, k) for _ in range(30) for n, k in layer]
    ws.append((_fix_scales(_raw_weight(49152, 576)), 49152, 576))
    xs = {k: torch.randn(1, k) for k in (576, 1536)}
    for t in sorted({1, threads}):
        _native.set_num_threads(t)
        per = []
        for _ in range(3 * rounds):
            t0 = time.perf_counter()
            for w, _n, k in ws:
                gguf._fused_linear(xs[k], w, 3, k)
                end = time.perf_counter() + gap_us * 1e-6
                while time.perf_counter() < end:
                    pass
            per.append(1e3 * (time.perf_counter() - t0) - len(ws) * gap_us * 1e-3)
        print(f"step's GGUF linears, {gap_us:3.0f} us gaps, {t} thr: {statistics.median(per):6.2f} ms "
              f"(min {min(per):6.2f}; gaps not counted)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    c, r = args.calls, args.rounds
    threads = _native.num_threads()
    print(f"isa {_native.isa()}, threads {threads}")

    print(f"pybind null call                         {_us(_native.num_threads, c, r):7.2f} us")
    k = n = 32
    x = torch.randn(1, k)
    raw = _fix_scales(_raw_weight(n, k))
    y = torch.empty(1, n)
    xp, rp, yp = x.data_ptr(), raw.data_ptr(), y.data_ptr()
    print(f"gguf_linear k=n=32 raw (preallocated y)  "
          f"{_us(lambda: _native.gguf_linear(3, xp, k, 1, k, rp, raw.stride(0), n, yp, n, 0), c, r):7.2f} us")
    print(f"  same, torch.empty(1, 32) alone         {_us(lambda: torch.empty(1, n), c, r):7.2f} us")
    print(f"  same through the wrapper               {_us(lambda: gguf._fused_linear(x, raw, 3, k), c, r):7.2f} us")
    site = CallSite(gguf_linear)
    print(f"  same through a CallSite                {_us(lambda: site(1, x, raw, 3, k), c, r):7.2f} us")
    replay, _ = capture(lambda: gguf._fused_linear(x, raw, 3, k))
    print(f"  same replayed from a CPU graph         {_us(replay, c, r):7.2f} us")

    d = 2048  # silu_and_mul's grain is 16384 // d = 8 rows: 16 rows make 2 chunks
    xs = torch.randn(16, 2 * d)
    for t in sorted({1, threads}):
        _native.set_num_threads(t)
        print(f"silu_and_mul 16x{2 * d} at {t} thread(s)        "
              f"{_us(lambda: small_ops._silu_and_mul(xs), c, r):7.2f} us")
    _native.set_num_threads(threads)

    # SmolLM2-135M decode step shapes (qkv, o, gate+up, down, lm_head), 30 layers' worth of distinct weights so
    # the weights stream from memory as in a real step, not from cache.
    shapes = {"qkv 576->960": (960, 576, 30), "o 576->576": (576, 576, 30), "gate_up 576->3072": (3072, 576, 30),
              "down 1536->576": (576, 1536, 30), "lm_head 576->49152": (49152, 576, 1)}
    for name, (n, k, layers) in shapes.items():
        _shape_row(name, n, k, layers, threads, c, r)
    for gap in (0, 30):
        _step_row(threads, r, gap)
    _native.set_num_threads(threads)


if __name__ == "__main__":
    main()
