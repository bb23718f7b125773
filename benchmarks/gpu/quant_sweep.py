"""One-call GPU sweep of the FP8 block-scaled GEMM and NVFP4 W4A16 variants, each checked against the op's
reference and timed beside its peer in the same process (``_scaled_mm`` per-tensor / cuBLAS bf16).

    python benchmarks/gpu/quant_sweep.py fp8     # FP8 block-scaled GEMM tile / stage variants at 4096^3 and 8192^3
    python benchmarks/gpu/quant_sweep.py nvfp4   # NVFP4 tensor-core decode variants (and the GEMV), M = 1, 2, 4, 16
    python benchmarks/gpu/quant_sweep.py gemv    # NVFP4 GEMV tiles / splits / decode at M = 1, 2, 4 (and the dot)
    python benchmarks/gpu/quant_sweep.py defaults  # the op's default kernel at M = 1..4 against the dot and cuBLAS
    python benchmarks/gpu/quant_sweep.py gemv1 ['{"block_n": 8}']  # the M = 1 GEMV alone, 20 calls (a profiler's)
    python benchmarks/gpu/quant_sweep.py --tiny [MODE]   # TINY shapes (CI runs every mode so, on the CPU under the
                                                         # Triton interpreter: the numbers mean nothing)

Rows are printed as they come (a compiler crash in one variant then loses only what follows it) and written to
$OUT/sweep_<mode>.json when OUT is set. ``err`` is ||out - ref|| / ||ref|| against the op's reference on fresh
random inputs; a variant marked WRONG must not become a default. The nvfp4 mode ends with a DECISION line: the
tensor-core variant with the best geometric-mean speed-up over the first (the old default) at M = 4 and 16, and the
GEMV_MAX_M at which it beats the GEMV on both shapes. The gemv mode prints the weight bytes streamed per second
("TB/s": packed codes + block scales over the time) and, with NVFP4_OLD naming a copy of an earlier nvfp4.py, times
that module's default GEMV beside the current one in the same process.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FP8_SIZES = (4096, 8192)
NVFP4_SHAPES = ((4096, 14336), (14336, 4096))  # weight [N, K]
WRONG = 5e-3
WRONG_TINY = 1e-2  # at TINY, the op's bf16 tolerance: interpreted on the CPU these kernels were 2.6-5.1e-3 off
# every mode on small shapes: one FP8 scale block of K and the first tile of the FP8 grid; the first NVFP4 variant
# at each M (the first three in the nvfp4 mode: enough for ``decide`` to score one against the old default)
TINY = {"fp8_sizes": (128,), "fp8_first": 1, "nvfp4_shapes": ((16, 256),), "variants_first": {"nvfp4": 3},
        "gemv1_shape": (16, 256), "calls": 2}


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _fp8_configs() -> list[dict]:
    """Block-scaled GEMM tiles (BLOCK_M, BLOCK_N, warps, stages, GROUP_M), all through tensor descriptors."""
    grid = [(64, 128, 4, 4, 8), (64, 128, 4, 3, 8), (64, 128, 4, 5, 8), (64, 128, 4, 6, 8), (64, 128, 4, 4, 4),
            (64, 128, 4, 4, 16), (128, 128, 8, 3, 8), (128, 128, 8, 4, 8), (64, 256, 8, 3, 8), (64, 256, 8, 4, 8),
            (128, 256, 8, 3, 8), (128, 64, 4, 4, 8)]
    return [dict(BLOCK_K=128, TMA=True, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, GROUP_M=g)
            for bm, bn, w, st, g in grid]


def fp8_rows(sizes=FP8_SIZES, first: int | None = None, device="cuda") -> list[dict]:
    from benchmarks.gpu.fp8 import _operands, _rel_err, _us
    from engine.platforms.triton_kernels import fp8_linear as fl

    gen = torch.Generator(device=device).manual_seed(int(time.time()))
    rows = []
    for s in sizes:
        xt, xts, wt, wts, _ = _operands(s, s, s, gen, "tensor", "tensor")
        peer = _us(functools.partial(torch._scaled_mm, xt, wt.t(), scale_a=xts, scale_b=wts, out_dtype=torch.bfloat16))
        args = _operands(s, s, s, gen, ("block", torch.float8_e4m3fn, (1, 128)),
                         ("block", torch.float8_e4m3fn, (128, 128)))
        for cfg in [None] + _fp8_configs()[:first]:
            name = "default" if cfg is None else json.dumps(cfg, sort_keys=True)
            try:
                err = _rel_err(fl.triton_fp8_linear(*args, torch.bfloat16, config=cfg), args)
                us = _us(functools.partial(fl.triton_fp8_linear, *args, torch.bfloat16, config=cfg))
            except Exception as exc:  # out of shared memory, a compiler refusal
                _emit(rows, dict(op="fp8", shape=s, cfg=name, error=f"{type(exc).__name__}: {str(exc)[:150]}"))
                continue
            _emit(rows, dict(op="fp8", shape=s, cfg=name, us=round(us, 2), peer_us=round(peer, 2),
                             ratio=round(peer / us, 3), tflops=round(2 * s**3 / us / 1e6, 1), err=f"{err:.2e}",
                             ok=err < 2e-2))
        if gen.device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# tensor-core kernel variants for M <= 16 (the first is the old default: Triton decode, a scale load per word)
_FINAL = [{"asm": False, "sblk": False}, {"asm": True, "sblk": False}, {"asm": False, "sblk": True},
          {"asm": True, "sblk": True}, {"asm": True, "sblk": True, "block_n": 128},
          {"asm": True, "sblk": True, "block_t": 32}, {"asm": True, "sblk": True, "num_warps": 8, "block_n": 128}]


def _nvfp4_final(m: int) -> list[tuple[str, dict]]:
    return ([("gemv", {})] if m <= 2 else []) + [("dot", c) for c in _FINAL]


def decide(rows: list[dict]) -> dict:
    """The tensor-core variant with the best geometric-mean speed-up over the default at M = 4 and 16 (both shapes),
    among those right on every row; and GEMV_MAX_M from where that variant beats the GEMV on both shapes."""
    import math

    by = {(r["shape"], r["cfg"]): r for r in rows}
    shapes = sorted({r["shape"].split()[1] for r in rows})

    def us(m, shape, cfg):
        r = by.get((f"M={m} {shape}", cfg))
        return r["us"] if r and "us" in r and r["ok"] else None

    base = f"dot {json.dumps(_FINAL[0], sort_keys=True)}"
    best, best_score = {}, 1.0
    for cfg in _FINAL[1:]:
        name = f"dot {json.dumps(cfg, sort_keys=True)}"
        t = {(m, sh): (us(m, sh, base), us(m, sh, name)) for m in (1, 2, 4, 16) for sh in shapes}
        if any(b is None or v is None for b, v in t.values()):
            continue
        scored = [bv for (m, _), bv in t.items() if m >= 4]  # M = 4 and 16
        score = math.exp(sum(math.log(b / v) for b, v in scored) / len(scored))
        if score > best_score * 1.03:
            best, best_score = cfg, score
    name = f"dot {json.dumps(best, sort_keys=True)}"
    gemv_max = 2
    for m in (2, 1):  # the GEMV keeps M up to where the chosen dot does not beat it on both shapes
        dot_t, gemv_t = [us(m, sh, name) for sh in shapes], [us(m, sh, "gemv {}") for sh in shapes]
        if None in dot_t or None in gemv_t or any(d >= g for d, g in zip(dot_t, gemv_t, strict=True)):
            break
        gemv_max = m - 1
    return {"cfg": best, "score": round(best_score, 3), "gemv_max_m": gemv_max}


# GEMV variants: (kernel, config) per M; "old" runs NVFP4_OLD's default kernel for that M
_GEMV_M1 = [{"asm": False}, {}, {"block_n": 8}, {"block_n": 8, "prefetch": True}, {"prefetch": True},
            {"block_n": 8, "block_b": 64, "num_warps": 2}, {"block_n": 8, "block_b": 64, "num_warps": 2, "splits": 2},
            {"block_n": 8, "block_b": 64, "num_warps": 2, "splits": 2, "prefetch": True},
            {"block_n": 8, "block_b": 256, "num_warps": 8}, {"block_n": 4, "block_b": 256, "num_warps": 8},
            {"block_n": 4, "block_b": 64, "splits": 2}, {"block_n": 8, "splits": 4}, {"block_n": 16, "block_b": 32},
            {"block_n": 2, "block_b": 128, "num_warps": 4}]
_GEMV_MN = [{}, {"block_n": 8}, {"prefetch": True}, {"block_n": 8, "block_b": 64, "num_warps": 2, "splits": 2},
            {"block_n": 4, "block_b": 64, "num_warps": 2}]


def _gemv_variants(m: int) -> list[tuple[str, dict]]:
    old = [("old", {})] if os.environ.get("NVFP4_OLD") and m == 1 else []
    if m == 1:
        return old + [("gemv", c) for c in _GEMV_M1]
    return old + [("dot", {})] + [("gemv", c) for c in _GEMV_MN]


def _default_variants(m: int) -> list[tuple[str, dict]]:
    """What the op picks by default ("default"), beside the tensor-core kernel for M > 1 and two M = 1 tiles."""
    if m == 1:
        return [("default", {}), ("gemv", {"block_n": 2, "prefetch": True}), ("gemv", {"block_n": 4, "splits": 1})]
    return [("default", {}), ("dot", {})]


def _old_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("nvfp4_old", os.environ["NVFP4_OLD"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gemv1(cfg: dict | None = None, shape=(4096, 14336), calls: int = 20, device="cuda") -> None:
    """20 calls of the M = 1 GEMV (default config, or ``cfg``) on 4096 x 14336 (bf16), for ncu to pick one."""
    from engine.core.ops.nvfp4 import nvfp4_global_scale
    from engine.platforms.triton_kernels import nvfp4 as nmod

    dev = torch.device(device)
    n, k = shape
    w = torch.randn((n, k), device=dev, dtype=torch.bfloat16) * k**-0.5
    gs = nvfp4_global_scale(w)
    q = (*nmod.quantize(w, gs), gs)
    x = torch.randn((1, k), device=dev, dtype=torch.bfloat16)
    for _ in range(calls):
        nmod.w4a16_linear(x, *q, None, kernel="gemv", config=cfg)
    if dev.type == "cuda":
        torch.cuda.synchronize()


def nvfp4_rows(variants=_nvfp4_final, ms=(1, 2, 4, 16), shapes=NVFP4_SHAPES, device="cuda",
               variants_first: int | None = None, wrong: float = WRONG) -> list[dict]:
    from benchmarks.gpu import ceilings
    from benchmarks.gpu.quant import _buffers, _rel_err, _rotating
    from engine.core.ops.nvfp4 import _nvfp4_linear_ref, nvfp4_global_scale
    from engine.platforms.triton_kernels import nvfp4 as nmod

    dev = torch.device(device)
    l2 = ceilings.l2_bytes(dev)
    gen = torch.Generator(device=dev).manual_seed(int(time.time()))
    old = _old_module() if os.environ.get("NVFP4_OLD") else None
    rows = []
    for n, k in shapes:
        wbytes = n * k // 2 + n * k // 16  # packed codes + e4m3 block scales
        w16 = [torch.randn((n, k), device=dev, dtype=torch.bfloat16, generator=gen) * k**-0.5
               for _ in range(_buffers(n * k * 2, l2))]
        wq = []
        for _ in range(_buffers(n * k // 2 + n * k // 16, l2)):
            w = torch.randn((n, k), device=dev, dtype=torch.bfloat16, generator=gen) * k**-0.5
            gs = nvfp4_global_scale(w)
            wq.append((*nmod.quantize(w, gs), gs))
        for m in ms:
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16, generator=gen)
            peer = _rotating([functools.partial(torch.nn.functional.linear, x, w) for w in w16], fast=True)
            ref = _nvfp4_linear_ref(x, *wq[0], None)
            for kernel, cfg in variants(m)[:variants_first]:
                name = f"{kernel} {json.dumps(cfg, sort_keys=True)}"
                mod, kw = ((old, {}) if kernel == "old" else (nmod, {}) if kernel == "default"
                           else (nmod, dict(kernel=kernel, config=cfg)))
                try:
                    err = _rel_err(mod.w4a16_linear(x, *wq[0], None, **kw), ref)
                    us = _rotating([functools.partial(mod.w4a16_linear, x, *q, None, **kw) for q in wq], fast=True)
                except Exception as exc:
                    _emit(rows, dict(op="nvfp4", shape=f"M={m} {n}x{k}", cfg=name,
                                     error=f"{type(exc).__name__}: {str(exc)[:200]}"))
                    continue
                _emit(rows, dict(op="nvfp4", shape=f"M={m} {n}x{k}", cfg=name, us=round(us, 2),
                                 peer_us=round(peer, 2), ratio=round(peer / us, 3), err=f"{err:.2e}",
                                 tbs=round(wbytes / us / 1e6, 2), ok=err < wrong))
        w16 = wq = None
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _emit(rows: list, row: dict) -> None:
    rows.append(row)
    if "error" in row:
        print(f"{row['op']} {row['shape']} {row['cfg']}: {row['error']}", flush=True)
    else:
        tbs = f", {row['tbs']} TB/s" if "tbs" in row else ""
        print(f"{row['op']} {row['shape']} {row['cfg']}: {row['us']} us{tbs}, peer {row['peer_us']} us, "
              f"ratio {row['ratio']}, err {row['err']}{'' if row['ok'] else ' WRONG'}", flush=True)


def run(what: str = "nvfp4", cfg: dict | None = None, tiny: bool = False) -> list[dict]:
    """One mode's rows (printed as they come); ``tiny``: at ``TINY``, on the CPU where there is no GPU."""
    t = TINY if tiny else {}
    dev = _device() if tiny else "cuda"
    shapes = dict(shapes=t.get("nvfp4_shapes", NVFP4_SHAPES), device=dev, wrong=WRONG_TINY if tiny else WRONG,
                  variants_first=t["variants_first"].get(what, 1) if tiny else None)
    if what == "fp8":
        return fp8_rows(t.get("fp8_sizes", FP8_SIZES), t.get("fp8_first"), dev)
    if what == "gemv1":
        gemv1(cfg, t.get("gemv1_shape", (4096, 14336)), t.get("calls", 20), dev)
        return []
    if what == "gemv":
        return nvfp4_rows(_gemv_variants, ms=(1, 2, 4), **shapes)
    if what == "defaults":
        return nvfp4_rows(_default_variants, ms=(1, 2, 3, 4), **shapes)
    rows = nvfp4_rows(**shapes)
    print("DECISION", json.dumps(decide(rows)), flush=True)
    return rows


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--tiny"]
    what = args[0] if args else "nvfp4"
    rows = run(what, json.loads(args[1]) if what == "gemv1" and len(args) > 1 else None, "--tiny" in sys.argv)
    if what == "gemv1":
        return
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"sweep_{what}.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
