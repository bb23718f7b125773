"""GGUF K-quant linears on the cpu platform (Q4_K, Q5_K, Q6_K kept in their super-blocks, issue 27): the native
``gguf_linear`` as the engine dispatches it, against the same op on a Q4_0 weight of the same shape (the tuned
32-element path: a decode GEMV in registers, packed rows) and against torch ``F.linear`` on the fp32 weight
dequantized beforehand (what a dequantize-at-load engine runs, 4-8x the bytes), in one run. Per shape and rows of x
it prints the median time per call, the ratios, and the GGUF bytes streamed per second.

    python benchmarks/bench_cpu_kquant.py [--threads N] [--m 1 8 64]

``run(tiny=True)`` runs one small shape (what CI runs, tests/benchmarks: the numbers mean nothing)."""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_timing import median_seconds  # noqa: E402

from engine.core.ops.gguf_kquants import K_QTYPES  # noqa: E402
from engine.core.ops.gguf_quant import Q4_0, gguf_dequantize, gguf_linear, random_gguf_weight  # noqa: E402
from engine.core.ops.registry import active_registry  # noqa: E402

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336))  # (N, K) of an 8B layer: o_proj, gate/up, down
TINY = ((64, 512),)


def _row(name, impl, n, k, m, t, t_q40, t_torch, raw) -> dict:
    return {"qtype": name, "n": n, "k": k, "m": m, "impl": impl.qualname, "us": t * 1e6, "q4_0_us": t_q40 * 1e6,
            "torch_fp32_us": t_torch * 1e6, "vs_q4_0": t_q40 / t, "vs_torch_fp32": t_torch / t,
            "gguf_GBps": raw.numel() / t / 1e9}


def run(tiny: bool = False, ms=(1, 8, 64)) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    min_time = 0.05 if tiny else 0.3
    rows = []
    for n, k in TINY if tiny else SHAPES:
        weights = {q: random_gguf_weight(n, k, q, "cpu", gen, scale=k ** -0.5) for q in (Q4_0, *K_QTYPES)}
        dense = gguf_dequantize(weights[Q4_0], Q4_0, k, torch.float32)
        for m in (1,) if tiny else ms:
            x = torch.randn(m, k, generator=gen)

            def timed(q, x=x, weights=weights, k=k):
                return median_seconds(lambda: gguf_linear(x, weights[q], q, k), min_time=min_time)

            t_q40 = timed(Q4_0)
            t_torch = median_seconds(lambda x=x, dense=dense: F.linear(x, dense), min_time=min_time)
            for q, (name, _) in K_QTYPES.items():
                impl = active_registry().select(gguf_linear, (x, weights[q], q, k))
                torch.testing.assert_close(gguf_linear(x, weights[q], q, k), gguf_linear.reference(x, weights[q], q, k),
                                           atol=1e-3, rtol=1e-3)
                rows.append(_row(name, impl, n, k, m, timed(q), t_q40, t_torch, weights[q]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 8, 64])
    a = ap.parse_args()
    if a.threads:
        from engine.platforms.cpu import _native

        _native.set_num_threads(a.threads)
        torch.set_num_threads(a.threads)
    print(f"{'qtype':>5} {'N':>6} {'K':>6} {'M':>3} | {'us':>9} {'Q4_0 us':>9} {'torch us':>9} | {'vs Q4_0':>7} "
          f"{'vs torch':>8} | {'GB/s':>6}  impl")
    for r in run(ms=tuple(a.m)):
        print(f"{r['qtype']:>5} {r['n']:>6} {r['k']:>6} {r['m']:>3} | {r['us']:>9.1f} {r['q4_0_us']:>9.1f} "
              f"{r['torch_fp32_us']:>9.1f} | {r['vs_q4_0']:>7.2f} {r['vs_torch_fp32']:>8.2f} | "
              f"{r['gguf_GBps']:>6.2f}  {r['impl']}")


if __name__ == "__main__":
    main()
