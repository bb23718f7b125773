"""GGUF quantized linear on the cpu platform: the fused native kernel vs torch on the dequantized weight.

Runs the linear layers of one SmolLM2-135M step as the engine calls them (30 layers of Q4_1 projections,
q/k/v stacked into one N = 960 call and gate/up into one N = 3072 call, then the tied Q8_0 LM head: 121 calls)
with distinct weights per layer, as a model does. Each kernel runs its steps back to back (a warm-up step
first), so its weights sit where a decode step finds them (96 MB: in the last-level cache of a CPU whose
cache holds them, as in the engine). Timing torch's fp32 weights (520 MB) between two steps of the fused
kernel, as this script did before issue 11, evicted them: the fused step then read from DRAM (8-12 GB/s on
the 2-core VM of BENCHMARKS.md) and took ~2x the engine's time. For M = 1 (one decode step) and M = 32 (a
decode batch) it prints, per shape, the median time per call of

* fused:  the native ``gguf_linear`` kernel on the raw GGUF rows (fp32 x), called as the engine's CPU decode
          graphs call it (the ``_native`` function on preallocated outputs; the registered wrapper adds ~6 us and an
          allocation a call, which eager mode pays and a decode step does not); checked against the registered
          implementation;
* q8act:  the native ``gguf_linear_q8act`` kernel, called the same way (x rounded to Q8 blocks, integer block dots);
* packed: the same op on the row-interleaved copy of the weights (``gguf_linear_q8act_packed``, csrc/gguf_packed.h,
          what the registered ``gguf_linear_q8act`` uses on x86), the copies made beforehand as the plugin makes
          them (on huge pages; time printed);
* pf32:   the fp32-activation ``gguf_linear`` on the same packed copies (``gguf_linear_packed``,
          csrc/gguf_packed_f32_impl.h, what the registered ``gguf_linear`` uses on x86), called the same way;
* torch:  ``F.linear`` in fp32 on the weight dequantized beforehand (what a dequantize-at-load engine
          does, 4x the bytes; the issue's goal is the fused INT4 GEMV >= 4x faster than this at M = 1);

each kernel's effective bandwidth (GGUF bytes / time; at M = 1 also as % of the streaming read bandwidth), and
the whole step. The previous
implementation (dequantize every call, then torch matmul) is timed on one layer for reference.
Run: ``python benchmarks/bench_cpu_gguf_linear.py [--threads N] [--isa NAME] [--m 1 32] [--steps 10]``.

Same-run comparison of builds (a kernel change's before/after, BENCHMARKS.md):
``python benchmarks/bench_cpu_gguf_linear.py --builds BEFORE.so [AFTER.so ...] --isa avx2 --m 1 4 16 32``
loads each given ``_native*.so`` into this process (the first is the base of the ratios) and times every
build's fused ``gguf_linear`` on the same weights, builds alternating step by step (so load from other
processes hits them alike), against torch fp32 ``F.linear`` on the dequantized weight; it first measures
the streaming read bandwidth (a plain fp32 sum over as many bytes as one step's weights, same threads) and
prints the last build's M = 1 bandwidth as a percentage of it.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.core.ops import KernelRegistry
from engine.core.ops.gguf_q8act import gguf_linear_q8act
from engine.core.ops.gguf_quant import GGUF_QTYPES, Q4_1, Q8_0, gguf_linear
from engine.platforms.cpu import _native
from engine.platforms.cpu.kernels import register
from engine.platforms.cpu.kernels.gguf import _dequant as native_dequant
from engine.platforms.cpu.kernels.gguf import _packed_weight as packed_weight

LAYERS = 30
# (name, qtype, K, N, calls per layer); the LM head runs once per step
SHAPES = [("attn qkv", Q4_1, 576, 960, 1), ("attn o", Q4_1, 576, 576, 1), ("mlp gate+up", Q4_1, 576, 3072, 1),
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


def read_bandwidth(nbytes: int) -> float:
    """Bytes per second of a plain streaming read (torch's fp32 sum, its threads) of a buffer of nbytes, best of 5.
    Sized like one step's weights, so it streams from where they do (on a CPU whose last-level cache holds them,
    that cache, as for the kernels)."""
    big = torch.ones(nbytes // 4)
    best = float("inf")
    for _ in range(6):
        t = time.perf_counter()
        big.sum()
        best = min(best, time.perf_counter() - t)
    return big.numel() * 4 / best


def load_build(path: str):
    """A _native extension module from a file, under its own name (several builds live side by side)."""
    spec = importlib.util.spec_from_file_location(f"build{abs(hash(path))}._native", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compare_builds(args, gen: torch.Generator) -> None:
    builds = {}
    for p in args.builds:
        builds[Path(p).stem if Path(p).stem not in builds else p] = load_build(p)
    for mod in builds.values():
        if args.threads:
            mod.set_num_threads(args.threads)
        if args.isa:
            mod.set_isa(args.isa)
    labels = list(builds)
    first = builds[labels[0]]
    print(f"isa {first.isa()}, native threads {first.num_threads()}, torch threads {torch.get_num_threads()}; "
          f"builds: {', '.join(f'{k}={v.__file__}' for k, v in builds.items())}")
    weights = {}
    for name, qtype, k, n, per_layer in SHAPES:
        raws = [random_raw(n, k, qtype, gen) for _ in range(LAYERS * per_layer or 1)]
        weights[name] = [(r, native_dequant(r, qtype, k, torch.float32)) for r in raws]
    step_bytes = sum(weights[name][0][0].numel() * (per_layer * LAYERS or 1) for name, _, _, _, per_layer in SHAPES)
    bw = read_bandwidth(step_bytes)
    print(f"streaming read bandwidth (fp32 sum over {step_bytes / 1e6:.0f} MB, one step's GGUF bytes): "
          f"{bw / 1e9:.1f} GB/s")

    def call(mod, x, raw, qtype, k, y):
        mod.gguf_linear(qtype, x.data_ptr(), k, x.shape[0], k, raw.data_ptr(), raw.stride(0), raw.shape[0],
                        y.data_ptr(), y.shape[1], 0)

    for m in args.m:
        xs = {k: torch.randn(m, k, generator=gen) for k in {s[2] for s in SHAPES}}
        ys = {name: torch.empty(m, n) for name, _, _, n, _ in SHAPES}
        for name, qtype, k, _, _ in SHAPES:  # every build is correct on what is timed
            raw, w = weights[name][0]
            for label, mod in builds.items():
                call(mod, xs[k], raw, qtype, k, ys[name])
                torch.testing.assert_close(ys[name], F.linear(xs[k], w), atol=1e-3, rtol=1e-3, msg=label)
        logs = {(name, b): [] for name, *_ in SHAPES for b in [*labels, "torch"]}
        steps = {b: [] for b in [*labels, "torch"]}
        # Builds alternate step by step (same GGUF bytes, so each finds them where the other left them); torch
        # runs after them, on its own (its fp32 weights are 5x the bytes and would evict the GGUF ones).
        order = [(b, s) for s in range(args.steps + 1) for b in labels] + [("torch", s) for s in range(args.steps + 1)]
        for b, step in order:
            time.sleep(0.005)  # the previous build's pool workers stop spinning
            t0 = time.perf_counter()
            for layer in range(LAYERS):
                for name, qtype, k, _, per_layer in SHAPES:
                    for c in range(per_layer or (1 if layer == LAYERS - 1 else 0)):
                        raw, w = weights[name][layer * per_layer + c]
                        x, y = xs[k], ys[name]
                        t = time.perf_counter()
                        if b == "torch":
                            F.linear(x, w)
                        else:
                            call(builds[b], x, raw, qtype, k, y)
                        logs[name, b].append(time.perf_counter() - t)
            if step:
                steps[b].append(time.perf_counter() - t0)
        head = "".join(f" {b[:14]:>14}" for b in labels)
        print(f"\nM={m}: median us per call (GB/s of GGUF bytes; at M = 1 % of the read bandwidth)")
        print(f"{'shape':<12} {'qtype':<5} {'K':>5} {'N':>6}{head} {'torch fp32':>10} "
              + " ".join(f"{b[:8]}/{labels[0][:8]}" for b in labels[1:]) + f" torch/{labels[-1][:8]}")
        for name, qtype, k, n, _ in SHAPES:
            raw, _ = weights[name][0]
            med = {b: statistics.median(logs[name, b]) for b in [*labels, "torch"]}
            cells = "".join(f" {med[b] * 1e6:>8.1f} {raw.numel() / med[b] / 1e9:>4.1f}" for b in labels)
            pct = f" ({raw.numel() / med[labels[-1]] / bw * 100:.0f}% bw)" if m == 1 else ""
            print(f"{name:<12} {GGUF_QTYPES[qtype][0]:<5} {k:>5} {n:>6}{cells} {med['torch'] * 1e6:>10.1f} "
                  + " ".join(f"{med[labels[0]] / med[b]:>16.2f}x" for b in labels[1:])
                  + f" {med['torch'] / med[labels[-1]]:>12.2f}x{pct}")
        st = {b: statistics.median(steps[b]) for b in steps}
        print(f"one step, M={m}: " + ", ".join(f"{b} {st[b] * 1e3:.2f} ms" for b in steps)
              + f"; {labels[-1]}: {step_bytes / st[labels[-1]] / 1e9:.1f} GB/s"
              + (f" = {step_bytes / st[labels[-1]] / bw * 100:.0f}% of the read bandwidth" if m == 1 else "")
              + f", torch/{labels[-1]} {st['torch'] / st[labels[-1]]:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="native and torch threads (default: all)")
    ap.add_argument("--isa", default=None, help="force a native ISA variant (avx512, avx2, scalar)")
    ap.add_argument("--m", type=int, nargs="*", default=[1, 32])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--builds", nargs="*", default=[], help="_native*.so builds to time side by side (first = base)")
    args = ap.parse_args()
    if args.threads:
        _native.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    if args.isa:
        _native.set_isa(args.isa)
    if args.builds:
        return compare_builds(args, torch.Generator().manual_seed(0))
    reg = KernelRegistry("cpu")
    register(reg)
    impls = {i.name: i.fn for i in reg.implementations(gguf_linear)}
    fused, old = impls["fused"], impls["dequant_matmul"]
    q8act = next(i.fn for i in reg.implementations(gguf_linear_q8act) if i.name == "native")
    outs: dict = {}

    packs: dict = {}  # id(raw) -> the packed copy

    def native(fn, packed=False):
        def call(x, raw, qtype, k):
            n = raw.shape[0]
            y = outs.get((x.shape[0], n))
            if y is None:
                y = outs[x.shape[0], n] = torch.empty(x.shape[0], n)
            fn(qtype, x.data_ptr(), k, x.shape[0], k, raw.data_ptr(), raw.stride(0), n, y.data_ptr(), n, 0,
               *((packs[id(raw)].data_ptr(),) if packed else ()))
            return y
        return call

    packed_call = native(_native.gguf_linear_q8act_packed, packed=True)
    pf32_call = native(_native.gguf_linear_packed, packed=True)

    kernels = {"fused": native(_native.gguf_linear), "q8act": native(_native.gguf_linear_q8act),
               "packed": packed_call, "pf32": pf32_call}
    gen = torch.Generator().manual_seed(0)
    print(f"isa {_native.isa()}, native threads {_native.num_threads()}, torch threads {torch.get_num_threads()}")
    weights = {}  # name -> list of (raw, fp32 weight), one per layer (one for the head)
    for name, qtype, k, n, per_layer in SHAPES:
        copies = LAYERS * per_layer or 1
        raws = [random_raw(n, k, qtype, gen) for _ in range(copies)]
        weights[name] = [(r, native_dequant(r, qtype, k, torch.float32)) for r in raws]
    step_bytes = sum(weights[name][0][0].numel() * (per_layer * LAYERS or 1) for name, _, _, _, per_layer in SHAPES)
    t = time.perf_counter()
    for name, qtype, k, _, _ in SHAPES:
        for raw, _ in weights[name]:
            packs[id(raw)] = packed_weight(raw, qtype, k)  # as the engine makes them (huge-page arenas)
    t_pack = time.perf_counter() - t
    time.sleep(0.1)  # the native pool's workers stop spinning (else they halve torch's read below)
    bw = read_bandwidth(step_bytes)
    print(f"streaming read bandwidth (fp32 sum over {step_bytes / 1e6:.0f} MB, one step's GGUF bytes): "
          f"{bw / 1e9:.1f} GB/s; GB/s below: GGUF bytes / median time per call; packing all weights "
          f"({sum(p.numel() for p in packs.values()) / 1e6:.1f} MB, variants {_native.gguf_packed_variant()} / "
          f"{_native.gguf_packed_f32_variant()}): "
          f"{t_pack * 1e3:.0f} ms")
    for m in args.m:
        xs = {k: torch.randn(m, k, generator=gen) for k in {s[2] for s in SHAPES}}
        for name, qtype, k, _, _ in SHAPES:  # correctness of what is timed
            raw, w = weights[name][0]
            torch.testing.assert_close(fused(xs[k], raw, qtype, k), F.linear(xs[k], w), atol=1e-3, rtol=1e-3)
            torch.testing.assert_close(kernels["fused"](xs[k], raw, qtype, k), F.linear(xs[k], w), atol=1e-3,
                                       rtol=1e-3)
            torch.testing.assert_close(kernels["q8act"](xs[k], raw, qtype, k).clone(),
                                       gguf_linear_q8act.reference(xs[k], raw, qtype, k), atol=1e-3, rtol=1e-3)
            torch.testing.assert_close(q8act(xs[k], raw, qtype, k), gguf_linear_q8act.reference(xs[k], raw, qtype, k),
                                       atol=1e-3, rtol=1e-3)
            torch.testing.assert_close(kernels["packed"](xs[k], raw, qtype, k).clone(),
                                       gguf_linear_q8act.reference(xs[k], raw, qtype, k), atol=1e-3, rtol=1e-3)
            torch.testing.assert_close(kernels["pf32"](xs[k], raw, qtype, k).clone(), F.linear(xs[k], w), atol=1e-3,
                                       rtol=1e-3)
        which_all = ("fused", "pf32", "q8act", "packed", "torch")
        logs = {(name, which): [] for name, *_ in SHAPES for which in which_all}
        steps = {which: [] for which in which_all}
        for which in which_all:  # each kernel's steps back to back (see the module docstring)
            for step in range(args.steps + 1):
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
              f"{'GB/s':>6} {'packed us':>9} {'GB/s':>6} {'q8act/packed':>12} {'pf32 us':>9} {'GB/s':>6} "
              f"{'fused/pf32':>10} "
              f"{'torch us':>9} {'torch/fused':>11} {'torch/q8act':>11} {'old us':>9}")
        for name, qtype, k, n, _ in SHAPES:
            raw, _ = weights[name][0]
            t_f, t_t = statistics.median(logs[name, "fused"]), statistics.median(logs[name, "torch"])
            t_q, t_p = statistics.median(logs[name, "q8act"]), statistics.median(logs[name, "packed"])
            t_pf = statistics.median(logs[name, "pf32"])
            old_log = []
            for _ in range(3):
                timed(lambda: old(xs[k], raw, qtype, k), old_log)  # noqa: B023
            print(f"{name:<12} {GGUF_QTYPES[qtype][0]:<5} {m:>3} {k:>5} {n:>6} {t_f * 1e6:>9.1f} "
                  f"{raw.numel() / t_f / 1e9:>6.1f} {t_q * 1e6:>9.1f} {raw.numel() / t_q / 1e9:>6.1f} "
                  f"{t_p * 1e6:>9.1f} {raw.numel() / t_p / 1e9:>6.1f} {t_q / t_p:>11.2f}x "
                  f"{t_pf * 1e6:>9.1f} {raw.numel() / t_pf / 1e9:>6.1f} {t_f / t_pf:>9.2f}x "
                  f"{t_t * 1e6:>9.1f} "
                  f"{t_t / t_f:>10.2f}x "
                  f"{t_t / t_q:>10.2f}x {min(old_log) * 1e6:>9.1f}")
        s_f, s_pf, s_q, s_p, s_t = (statistics.median(steps[w]) for w in which_all)
        pct = (f" ({step_bytes / s_f / bw * 100:.0f}% / {step_bytes / s_pf / bw * 100:.0f}% / "
               f"{step_bytes / s_q / bw * 100:.0f}% / {step_bytes / s_p / bw * 100:.0f}% of the read bandwidth)"
               if m == 1 else "")
        print(f"one step of all linear layers, M={m}: fused {s_f * 1e3:.2f} ms, pf32 {s_pf * 1e3:.2f} ms "
              f"(fused/pf32 {s_f / s_pf:.2f}x), q8act {s_q * 1e3:.2f} ms, packed {s_p * 1e3:.2f} ms{pct}, "
              f"torch fp32 {s_t * 1e3:.2f} ms (torch/fused {s_t / s_f:.2f}x, torch/q8act "
              f"{s_t / s_q:.2f}x, q8act/packed {s_q / s_p:.2f}x)\n")

if __name__ == "__main__":
    main()
