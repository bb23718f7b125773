"""GPU benchmark of the quantized linear kernels against cuBLAS bf16 (``torch.nn.functional.linear``).

* NVFP4 W4A16 (platforms/triton_kernels/nvfp4.py) at M = 1, 4, 16 on weights [4096, 14336] and [14336, 4096]:
  goal ratio >= 3.5 over cuBLAS bf16 (the weights are 4.5 bits per value against 16).
* GGUF Q4_0 and Q8_0 (platforms/triton_kernels/gguf_linear.py) at M = 1 on the same shapes: weight bytes per second
  against the device-to-device copy bandwidth measured in the same run (goal: half of it), and cuBLAS bf16 beside.

Timing: ``triton.testing.do_bench`` medians (it also flushes L2 before each call), and every timed call rotates over
several weight buffers whose total is over three times the L2 size. Every kernel's output is checked against the op's
reference first (relative error); a wrong kernel raises instead of being timed.

``run()`` returns a list of dicts {"bench", "shape", "us", "gbps" or "tflops", "peer", "peer_us", "ratio", "goal",
"met"}. Besides the goal rows it times the non-default kernel at each M (goal "info") and, with ``tune=True``, a small
sweep of block configurations (the best per shape and M, goal "info: tuning"), so one run is enough to retune the
defaults (GEMV_MAX_M, GEMV_*/DOT_* in the kernel modules).

    python benchmarks/gpu/quant.py            # default rows only (well under a minute); --json out.json to save
    ENGINE_BENCH_SWEEP=1 python benchmarks/gpu/quant.py   # plus the sweeps (GEMV_SWEEP, DOT_SWEEP, GGUF_SWEEP)
    ENGINE_BENCH_SWEEP=wide python benchmarks/gpu/quant.py  # the M = 64 sweeps only (DOT_WIDE_SWEEP, GGUF_DOT_SWEEP)

Timing: CUDA-graph replays of one call per rotating weight buffer (ENGINE_BENCH_GRAPHS=0 times eager calls).

``run(tiny=True)`` (``--tiny``) runs every row, and the first configuration of each sweep when tuning, at ``TINY``:
on the CPU under the Triton interpreter where there is no GPU (what CI runs: the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu import ceilings  # noqa: E402

SHAPES = ((4096, 14336), (14336, 4096))  # weight [N, K]
NVFP4_MS = (1, 4, 16, 64)  # M = 64: a decode step of 64 requests (the tensor-core kernels)
GGUF_WIDE_M = 64  # GGUF Q4_0 (GPTQ checkpoints load as it) also at this M, on the tensor-core kernel
# the same rows on small weights: M = 1 runs the NVFP4 GEMV and the dot beside it (and the GEMV sweep), M = 5 the
# dot alone (and its sweep); the sweeps' first configuration only
TINY = {"shapes": ((16, 256),), "ms": (1, 5, GGUF_WIDE_M), "copy_numel": 2**16, "sweep_first": 1}
GGUF_QTYPES = ((2, "Q4_0"), (8, "Q8_0"))
GOAL_RATIO = 3.5
GGUF_GOAL_FRACTION = 0.5  # of the copy bandwidth

# Sweeps (ENGINE_BENCH_SWEEP=1): a tile grid at the planned split-K, then split-K alone at the default tile
# ("splits" overrides the plan; the default rows show what the plan picks). Each config: ~40 ms of timing + compile.
GEMV_SWEEP = ([dict(block_n=bn, block_b=bb, num_warps=wp, prefetch=pf)
               for bn in (4, 8, 16) for bb in (128, 256) for wp in (4, 8) for pf in (True, False)]
              + [dict(splits=sp) for sp in (1, 2, 4, 8)]
              + [dict(block_b=128, splits=sp) for sp in (2, 4)])
DOT_SWEEP = ([dict(block_n=bn, block_t=bt, num_warps=wp, num_stages=st)
              for bn in (64, 128) for bt in (16, 32) for wp in (4, 8) for st in (2, 3, 4)]
             + [dict(splits=sp) for sp in (1, 4, 8, 16, 32)]
             + [dict(block_n=64, num_warps=4, splits=sp) for sp in (4, 8, 16)])
# ENGINE_BENCH_SWEEP=wide: only these, at M = 64 (NVFP4: the K-ordered, PTX-decoded tile of M <= 16 widened, against
# the plane-wise default; GGUF: tiles and K splits of the tensor-core kernel)
DOT_WIDE_SWEEP = ([dict(block_m=bm, block_n=bn, block_t=bt, num_warps=wp, num_stages=3, korder=True, asm=True,
                        sblk=True) for bm in (32, 64) for bn in (64, 128) for bt in (16, 32) for wp in (4, 8)]
                  + [dict(splits=sp) for sp in (1, 2, 4, 8)])
GGUF_DOT_SWEEP = ([dict(block_n=bn, block_b=bb, num_warps=wp) for bn in (64, 128) for bb in (2, 4) for wp in (4, 8)]
                  + [dict(splits=sp) for sp in (1, 2, 4, 8)])
GGUF_SWEEP = ([dict(block_n=bn, block_b=bb, num_warps=wp) for bn in (4, 8, 16) for bb in (64, 128, 256)
               for wp in (4, 8)]
              + [dict(splits=sp) for sp in (1, 2, 4, 8)] + [dict(splits=sp, num_warps=8) for sp in (2, 4)])


def _do_bench(fn) -> float:
    return ceilings.bench_us(fn, warmup=25, rep=200)


def _rotating(fns, fast: bool = False) -> float:
    """Median us per call of calls that rotate over ``fns`` (one closure per weight buffer). On CUDA the calls are
    captured once into a CUDA graph (one call per buffer, in order) and the graph's replays are timed, so host launch
    overhead stays out and capture safety is checked too; where capture fails, eager calls are timed instead. Off a
    GPU: one call's wall time (ceilings.bench_us)."""
    import triton.testing

    warmup, rep = (5, 40) if fast else (25, 200)
    if not ceilings.on_gpu():
        return ceilings.bench_us(fns[0])
    for fn in fns:  # compile and allocate outside the capture
        fn()
    if _USE_GRAPHS and all(_on_cuda(fn) for fn in fns):
        try:
            torch.cuda.synchronize()
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                for fn in fns:
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for fn in fns:
                    fn()
            graph.replay()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(graph.replay, warmup=warmup, rep=rep, return_mode="median")
            return ms * 1e3 / len(fns)
        except Exception as exc:  # not capturable: say so and time eagerly
            print(f"  [graph] capture failed ({type(exc).__name__}: {str(exc)[:100]}); timing eagerly",
                  file=sys.stderr)
            torch.cuda.synchronize()
    it = itertools.cycle(fns)
    return ceilings.bench_us(lambda: next(it)(), warmup=warmup, rep=rep)


def _on_cuda(fn) -> bool:
    args = getattr(fn, "args", ())
    return bool(args) and isinstance(args[0], torch.Tensor) and args[0].is_cuda


_USE_GRAPHS = os.environ.get("ENGINE_BENCH_GRAPHS", "1") not in ("", "0")


def _buffers(bytes_per_set: int, l2_bytes: int) -> int:
    return max(2, min(16, math.ceil(3 * l2_bytes / bytes_per_set)))


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()


def _check(name: str, got, want, tol: float) -> None:
    err = _rel_err(got, want)
    if not err < tol:  # also catches NaN
        raise AssertionError(f"{name}: relative error {err:.3g} against the reference (tolerance {tol})")


def _row(bench, shape, us, nbytes, peer, peer_us, goal, met) -> dict:
    return {"bench": bench, "shape": shape, "us": round(us, 2), "gbps": round(nbytes / us / 1e3, 1), "peer": peer,
            "peer_us": round(peer_us, 2), "ratio": round(peer_us / us, 3), "goal": goal, "met": bool(met)}


def _copy_bandwidth(device, numel: int = 2**28) -> tuple[float, float]:
    """(us, GB/s) of a device-to-device copy of ``numel`` fp32 (1 GiB), counting bytes read plus bytes written."""
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    us = _do_bench(functools.partial(dst.copy_, src))
    return us, 2 * src.nbytes / us / 1e3


def _random_gguf(n: int, k: int, qtype: int, device, gen) -> torch.Tensor:
    """Random GGUF bytes made on the GPU (no gguf package needed): random quant bytes, fp16 scales (and Q4_1
    minimums) of plausible size."""
    from engine.core.ops.gguf_quant import GGUF_QTYPES as QT

    nb, bb = k // 32, QT[qtype][1]
    raw = torch.randint(0, 256, (n, nb, bb), dtype=torch.uint8, device=device, generator=gen)
    d = (torch.rand((n, nb), device=device, generator=gen) * 0.02 + 0.001).half()
    raw[..., 0:2] = d.view(torch.uint8).view(n, nb, 2)
    if qtype == 3:
        m = (torch.rand((n, nb), device=device, generator=gen) * -0.1).half()
        raw[..., 2:4] = m.view(torch.uint8).view(n, nb, 2)
    return raw.view(n, nb * bb)


def _nvfp4_calls(nmod, x, wq, kernel, config):
    return [functools.partial(nmod.w4a16_linear, x, *q, None, kernel=kernel, config=config) for q in wq]


def _gguf_calls(gmod, x, raws, qtype, k, kernel, config):
    return [functools.partial(gmod.linear, x, r, qtype, k, kernel=kernel, config=config) for r in raws]


def _tune_rows(label, shape, fns_for, configs, peer_us, nbytes, ref=None):
    """Time ``fns_for(config)`` for each config; the fastest as one row (configs that fail to compile are skipped)."""
    best = None
    for cfg in configs:
        try:
            fns = fns_for(cfg)
            if ref is not None:  # a wrong config is an error, not a result
                _check(f"{label} {shape} {cfg}", fns[0](), ref, 2e-2)
            us = _rotating(fns, fast=True)
            print(f"  [tune] {label} {shape} {json.dumps(cfg, sort_keys=True)}: {us:.2f} us", file=sys.stderr)
        except Exception as exc:  # an out-of-resources config on this GPU, say
            print(f"  [tune] {label} {shape} {cfg}: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
            continue
        if best is None or us < best[0]:
            best = (us, cfg)
    if best is None:
        return []
    us, cfg = best
    return [_row(f"{label} tuned-best {json.dumps(cfg, sort_keys=True)}", shape, us, nbytes, "cuBLAS bf16", peer_us,
                 f"info: tuning ({len(configs)} configs)", peer_us / us >= GOAL_RATIO)]


def run(tune: bool | None = None, device: str = "cuda", tiny: bool = False) -> list[dict]:
    """The rows described in the module docstring (``tune``, default ENGINE_BENCH_SWEEP, adds the block-size sweep).
    ``tiny``: at ``TINY``, on the CPU under the Triton interpreter where there is no GPU."""
    shapes, ms, copy_numel, first = SHAPES, NVFP4_MS, 2**28, None
    if tiny:
        shapes, ms, copy_numel, first = TINY["shapes"], TINY["ms"], TINY["copy_numel"], TINY["sweep_first"]
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if tune is None:
        env = os.environ.get("ENGINE_BENCH_SWEEP", "0")
        tune = "wide" if env == "wide" else env not in ("", "0")
    wide = tune == "wide"  # the M = 64 sweeps only
    if wide:
        tune = False
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("benchmarks/gpu/quant.py needs a CUDA GPU")
    from engine.core.ops.gguf_quant import _gguf_linear_ref
    from engine.core.ops.nvfp4 import _nvfp4_linear_ref, nvfp4_global_scale
    from engine.platforms.triton_kernels import gguf_linear as gmod
    from engine.platforms.triton_kernels import nvfp4 as nmod

    dev = torch.device(device)
    l2 = ceilings.l2_bytes(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    copy_us, copy_gbps = _copy_bandwidth(dev, copy_numel)
    rows.append({"bench": "copy device-to-device (read + write)", "shape": f"{copy_numel * 4 / 2**20:g} MiB fp32",
                 "us": round(copy_us, 2),
                 "gbps": round(copy_gbps, 1), "peer": "-", "peer_us": round(copy_us, 2), "ratio": 1.0,
                 "goal": "the bandwidth ceiling", "met": True})

    for n, k in shapes:
        shape_w = f"{n}x{k}"
        # cuBLAS bf16 weights, rotating
        nb16 = _buffers(n * k * 2, l2)
        w16 = [torch.randn((n, k), device=dev, dtype=torch.bfloat16, generator=gen) * k**-0.5 for _ in range(nb16)]
        # NVFP4 weights (quantized with the Triton kernel), rotating
        nvfp4_bytes = n * k // 2 + n * k // 16
        wq = []
        for _ in range(_buffers(nvfp4_bytes, l2)):
            w = torch.randn((n, k), device=dev, dtype=torch.bfloat16, generator=gen) * k**-0.5
            gs = nvfp4_global_scale(w)
            wq.append((*nmod.quantize(w, gs), gs))
        w = None
        peer_us_by_m = {}
        for m in ms:
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16, generator=gen)
            peer_us = _rotating([functools.partial(torch.nn.functional.linear, x, w) for w in w16])
            peer_us_by_m[m] = peer_us
            default = "gemv" if m <= nmod.GEMV_MAX_M else "dot"
            kernels = [default] + [kk for kk in ("gemv", "dot") if kk != default and (kk != "gemv" or m <= 4)]
            ref = _nvfp4_linear_ref(x, *wq[0], None)
            for kernel in kernels:
                _check(f"nvfp4 {kernel} M={m} {shape_w}", nmod.w4a16_linear(x, *wq[0], None, kernel=kernel), ref,
                       2e-2)
                us = _rotating(_nvfp4_calls(nmod, x, wq, kernel, None))
                is_default = kernel == default
                rows.append(_row(f"nvfp4_w4a16[{kernel}]" + ("" if is_default else " (not the default)"),
                                 f"M={m} {shape_w}", us, nvfp4_bytes, "cuBLAS bf16 F.linear", peer_us,
                                 f"ratio >= {GOAL_RATIO}" if is_default else "info: the other kernel",
                                 peer_us / us >= GOAL_RATIO))
            if m > nmod.GEMV_MAX_M:  # the plane-pair dots (x in plane_order) on the default tile
                pairs = {"pairs": True, "asm": True}
                _check(f"nvfp4 dot pairs M={m} {shape_w}",
                       nmod.w4a16_linear(x, *wq[0], None, kernel="dot", config=pairs), ref, 2e-2)
                us = _rotating(_nvfp4_calls(nmod, x, wq, "dot", pairs))
                rows.append(_row("nvfp4_w4a16[dot pairs] (not the default)", f"M={m} {shape_w}", us, nvfp4_bytes,
                                 "cuBLAS bf16 F.linear", peer_us, "info", peer_us / us >= GOAL_RATIO))
            if tune:
                if m == 1:
                    rows += _tune_rows("nvfp4_w4a16[gemv]", f"M={m} {shape_w}",
                                       functools.partial(_nvfp4_calls, nmod, x, wq, "gemv"), GEMV_SWEEP[:first],
                                       peer_us, nvfp4_bytes, ref)
            if (tune and m > 1) or (wide and m > 16):
                configs = (DOT_WIDE_SWEEP if wide else DOT_SWEEP)[:first]
                rows += _tune_rows("nvfp4_w4a16[dot]", f"M={m} {shape_w}",
                                   functools.partial(_nvfp4_calls, nmod, x, wq, "dot"), configs, peer_us, nvfp4_bytes,
                                   ref)
        wq = w16 = None

        # GGUF at M = 1
        x = torch.randn((1, k), device=dev, dtype=torch.bfloat16, generator=gen)
        for qtype, qname in GGUF_QTYPES:
            raw_bytes = n * (k // 32) * {2: 18, 3: 20, 8: 34}[qtype]
            raws = [_random_gguf(n, k, qtype, dev, gen) for _ in range(_buffers(raw_bytes, l2))]
            _check(f"gguf {qname} M=1 {shape_w}", gmod.linear(x, raws[0], qtype, k),
                   _gguf_linear_ref(x, raws[0], qtype, k), 2e-2)
            us = _rotating(_gguf_calls(gmod, x, raws, qtype, k, None, None))
            row = _row(f"gguf_{qname.lower()}_gemv", f"M=1 {shape_w}", us, raw_bytes, "cuBLAS bf16 F.linear",
                       peer_us_by_m[1], f"GB/s >= {GGUF_GOAL_FRACTION} x copy ({copy_gbps:.0f} GB/s)", False)
            row["met"] = row["gbps"] >= GGUF_GOAL_FRACTION * copy_gbps
            rows.append(row)
            if tune:
                configs = GGUF_SWEEP[:first]
                rows += _tune_rows(f"gguf_{qname.lower()}_gemv", f"M=1 {shape_w}",
                                   functools.partial(_gguf_calls, gmod, x, raws, qtype, k, "gemv"), configs,
                                   peer_us_by_m[1], raw_bytes)
            if qtype == 2 and GGUF_WIDE_M in peer_us_by_m:  # Q4_0 at M = 64: the tensor-core kernel
                xw = torch.randn((GGUF_WIDE_M, k), device=dev, dtype=torch.bfloat16, generator=gen)
                _check(f"gguf {qname} M={GGUF_WIDE_M} {shape_w}", gmod.linear(xw, raws[0], qtype, k),
                       _gguf_linear_ref(xw, raws[0], qtype, k), 2e-2)
                us = _rotating(_gguf_calls(gmod, xw, raws, qtype, k, None, None))
                rows.append(_row(f"gguf_{qname.lower()}_dot", f"M={GGUF_WIDE_M} {shape_w}", us, raw_bytes,
                                 "cuBLAS bf16 F.linear", peer_us_by_m[GGUF_WIDE_M], "info: >= 1 (bf16 speed)",
                                 peer_us_by_m[GGUF_WIDE_M] / us >= 1))
                if wide or tune:
                    rows += _tune_rows(f"gguf_{qname.lower()}_dot", f"M={GGUF_WIDE_M} {shape_w}",
                                       functools.partial(_gguf_calls, gmod, xw, raws, qtype, k, "dot"),
                                       GGUF_DOT_SWEEP[:first], peer_us_by_m[GGUF_WIDE_M], raw_bytes)
            raws = None
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def report(rows, json_path: str | None) -> None:
    """Print ``rows`` as a table, and write them to ``json_path`` as well where one is given."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
    _print_table(rows)


def _print_table(rows) -> None:
    head = ("bench", "shape", "us", "GB/s", "peer_us", "ratio", "goal", "met")
    table = [head] + [(r["bench"], r["shape"], f"{r['us']:.2f}", f"{r.get('gbps', float('nan')):.0f}",
                       f"{r['peer_us']:.2f}", f"{r['ratio']:.2f}", r["goal"], "yes" if r["met"] else "NO")
                      for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tune", action="store_true", help="add the block-configuration sweep (or ENGINE_BENCH_SWEEP=1)")
    ap.add_argument("--no-tune", action="store_true", help="skip the sweep even with ENGINE_BENCH_SWEEP set")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--tiny", action="store_true", help="TINY shapes (CI runs them on the CPU under the interpreter)")
    args = ap.parse_args()
    report(run(tune=False if args.no_tune else True if args.tune else None, tiny=args.tiny), args.json)


if __name__ == "__main__":
    main()
