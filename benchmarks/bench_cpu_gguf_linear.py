"""GGUF quantized linear on the cpu platform: the fused native kernel vs torch on the dequantized weight.

Runs the linear layers of one SmolLM2-135M step (30 layers of Q4_1 projections, then the tied Q8_0 LM
head) with distinct weights per layer, as a model does, so that weights come from memory rather than
from a cache warmed by the previous call. For M = 1 (one decode step) and M = 32 (a decode batch) it
prints, per shape, the median time per call of

* fused:  the registered cpu ``gguf_linear`` implementation (the fused kernel), through its wrapper;
* q8act:  the cpu ``gguf_linear_q8act`` kernel (x rounded to Q8 blocks, integer block dots: VNNI/AVX2);
* torch:  ``F.linear`` in fp32 on the weight dequantized beforehand (what a dequantize-at-load engine
          does, 4x the bytes; the issue's goal is the fused INT4 GEMV >= 4x faster than this at M = 1);

the fused kernel's effective bandwidth (GGUF bytes / time), and the whole step. The previous
implementation (dequantize every call, then torch matmul) is timed on one layer for reference.
Run: ``python benchmarks/bench_cpu_gguf_linear.py [--threads N] [--isa NAME] [--m 1 32] [--steps 10]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from engine.core.ops import KernelRegistry
from engine.core.ops.gguf_q8act import gguf_linear_q8act
from engine.core.ops.gguf_quant import GGUF_QTYPES, Q4_1, Q8_0, gguf_linear
from engine.platforms.cpu import _native
from engine.platforms.cpu.kernels import register
from engine.platforms.cpu.kernels.gguf import _dequant as native_dequant

LAYERS = 30
# (name, qtype, K, N, calls per layer); the LM head runs once per step
SHAPES = [("attn q/o", Q4_1, 576, 576, 2), ("attn k/v", Q4_1, 576, 192, 2), ("mlp gate+up", Q4_1, 576, 3072, 1),
          ("mlp down", Q4_1, 1536, 576, 1), ("lm head", Q8_0, 576, 49152, 0)]


def random_raw(n: int, k: int, qtype: int, gen: torch.Generator) -> torch.Tensor:
    """Random GGUF bytes with sane fp16 scales (quantizing ~100M weights with the gguf package is slow)."""
    bb = GGUF_QTYPES[qtype][1]
    raw = torch.randint(0, 256, (n, k // 32, bb), dtype=torch.uint8, generator=gen)
    d = (torch.rand(n, k // 32, generator=gen) * 0.02 + 0.001).half()
    raw[..., 0:2] = d.unsqueeze(-1).view(torch.uint8)
    if qtype == Q4_1:
        raw[..., 2:4] = (-8 * d).unsqueeze(-1).view(torch.uint8)
    return raw.reshape(n, -1)


def timed(fn, log: list) -> None:
    t = time.perf_counter()
    fn()
    log.append(time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="native and torch threads (default: all)")
    ap.add_argument("--isa", default=None, help="force a native ISA variant (avx512, avx2, scalar)")
    ap.add_argument("--m", type=int, nargs="*", default=[1, 32])
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    if args.threads:
        _native.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    if args.isa:
        _native.set_isa(args.isa)
    reg = KernelRegistry("cpu")
    register(reg)
    impls = {i.name: i.fn for i in reg.implementations(gguf_linear)}
    fused, old = impls["fused"], impls["dequant_matmul"]
    q8act = next(i.fn for i in reg.implementations(gguf_linear_q8act) if i.name == "native")
    kernels = {"fused": fused, "q8act": q8act}
    gen = torch.Generator().manual_seed(0)
    print(f"isa {_native.isa()}, native threads {_native.num_threads()}, torch threads {torch.get_num_threads()}")
    weights = {}  # name -> list of (raw, fp32 weight), one per layer (one for the head)
    for name, qtype, k, n, per_layer in SHAPES:
        copies = LAYERS * per_layer or 1
        raws = [random_raw(n, k, qtype, gen) for _ in range(copies)]
        weights[name] = [(r, native_dequant(r, qtype, k, torch.float32)) for r in raws]
    for m in args.m:
        xs = {k: torch.randn(m, k, generator=gen) for k in {s[2] for s in SHAPES}}
        for name, qtype, k, _, _ in SHAPES:  # correctness of what is timed
            raw, w = weights[name][0]
            torch.testing.assert_close(fused(xs[k], raw, qtype, k), F.linear(xs[k], w), atol=1e-3, rtol=1e-3)
            torch.testing.assert_close(q8act(xs[k], raw, qtype, k), gguf_linear_q8act.reference(xs[k], raw, qtype, k),
                                       atol=1e-3, rtol=1e-3)
        logs = {(name, which): [] for name, *_ in SHAPES for which in ("fused", "q8act", "torch")}
        steps = {"fused": [], "q8act": [], "torch": []}
        for step in range(args.steps + 1):
            for which in ("fused", "q8act", "torch"):
                t0 = time.perf_counter()
                for layer in range(LAYERS):
                    for name, qtype, k, _, per_layer in SHAPES:
                        for c in range(per_layer):
                            raw, w = weights[name][layer * per_layer + c]
                            x = xs[k]
                            timed((lambda: kernels[which](x, raw, qtype, k)) if which != "torch"  # noqa: B023
                                  else (lambda: F.linear(x, w)), logs[name, which])  # noqa: B023
                raw, w = weights["lm head"][0]
                x = xs[576]
                timed((lambda: kernels[which](x, raw, Q8_0, 576)) if which != "torch"  # noqa: B023
                      else (lambda: F.linear(x, w)), logs["lm head", which])  # noqa: B023
                if step:  # step 0 warms up
                    steps[which].append(time.perf_counter() - t0)
        print(f"{'shape':<12} {'qtype':<5} {'M':>3} {'K':>5} {'N':>6} {'fused us':>9} {'GB/s':>6} {'q8act us':>9} "
              f"{'torch us':>9} {'torch/fused':>11} {'torch/q8act':>11} {'old us':>9}")
        for name, qtype, k, n, _ in SHAPES:
            raw, _ = weights[name][0]
            t_f, t_t = statistics.median(logs[name, "fused"]), statistics.median(logs[name, "torch"])
            t_q = statistics.median(logs[name, "q8act"])
            old_log = []
            for _ in range(3):
                timed(lambda: old(xs[k], raw, qtype, k), old_log)  # noqa: B023
            print(f"{name:<12} {GGUF_QTYPES[qtype][0]:<5} {m:>3} {k:>5} {n:>6} {t_f * 1e6:>9.1f} "
                  f"{raw.numel() / t_f / 1e9:>6.1f} {t_q * 1e6:>9.1f} {t_t * 1e6:>9.1f} {t_t / t_f:>10.2f}x "
                  f"{t_t / t_q:>10.2f}x {min(old_log) * 1e6:>9.1f}")
        s_f, s_q, s_t = (statistics.median(steps[w]) for w in ("fused", "q8act", "torch"))
        print(f"one step of all linear layers, M={m}: fused {s_f * 1e3:.2f} ms, q8act {s_q * 1e3:.2f} ms, "
              f"torch fp32 {s_t * 1e3:.2f} ms (torch/fused {s_t / s_f:.2f}x, torch/q8act {s_t / s_q:.2f}x)\n")

if __name__ == "__main__":
    main()
