"""FP8 linear on a CUDA GPU: the Triton block-scaled GEMM (1x128 activation groups x 128x128 weight blocks,
DeepSeek-style) and the per-token / per-channel ``torch._scaled_mm`` path, each against ``torch._scaled_mm`` with
per-tensor scales measured in the same run; plus the dynamic quantizer against the torch reference.

    python benchmarks/gpu/fp8.py                       # default rows only (short; benchmarks/bench_gpu.py runs it)
    ENGINE_BENCH_SWEEP=1 python benchmarks/gpu/fp8.py  # plus the block-scaled GEMM sweep at 4096 and 8192
    ENGINE_BENCH_GEMV_SWEEP=1 python benchmarks/gpu/fp8.py [--gemv-only]  # plus the decode GEMV's tile sweep

``run() -> list[dict]``: bench, shape (MxNxK), us (median of triton.testing.do_bench), tflops, peer, peer_us,
ratio (peer_us / us: above 1 is faster than the peer), goal, met, and max_rel_err (the output against the op's
reference, computed on the GPU). Rows named "sweep ..." (ENGINE_BENCH_SWEEP=1) time other tile configurations and
loop variants of the block-scaled GEMM (flags P = PREFETCH, D = DEFER, T = TMA; platforms/triton_kernels/fp8_linear.py
``gemm_config`` holds the one in use): a better one there is the next tuning step.

``run(tiny=True)`` (``--tiny``) runs every row, and the first configuration of the sweep, at ``TINY``: on the CPU
under the Triton interpreter where there is no GPU (what CI runs: the numbers mean nothing).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu import ceilings  # noqa: E402

GOAL = 0.8  # the Triton block-scaled GEMM vs _scaled_mm per-tensor at the large squares


@dataclasses.dataclass(frozen=True)
class Setup:
    """GEMM shapes (M, N, K): the squares (swept when asked) and the decode shape; the quantizer's (M, K); the
    device. FULL is what the benchmark measures; TINY runs the same code in seconds."""
    squares: tuple[tuple[int, int, int], ...] = ((4096, 4096, 4096), (8192, 8192, 8192))
    decode: tuple[int, int, int] = (16, 8192, 8192)
    gemv: tuple[tuple[int, int, int], ...] = ((1, 4096, 14336), (1, 14336, 4096), (4, 4096, 14336), (1, 6144, 4096))
    quant: tuple[int, int] = (8192, 8192)
    sweep_first: int | None = None  # run only this many configurations of the sweep
    device: str = "cuda"


FULL = Setup()
TINY = Setup(squares=((32, 128, 256),), decode=(4, 64, 256), gemv=((1, 96, 384), (3, 64, 256)), quant=(4, 256),
             sweep_first=1,
             device="cuda" if torch.cuda.is_available() else "cpu")
SWEEP_ON = os.environ.get("ENGINE_BENCH_SWEEP", "") not in ("", "0")  # the tile/variant sweep is opt-in
GEMV_SWEEP_ON = os.environ.get("ENGINE_BENCH_GEMV_SWEEP", "") not in ("", "0")  # the decode GEMV's tiles alone
# PREFETCH with DEFER is refused: it computed wrong products on the H200 (fp8_linear.py says more).
_C = [  # (BLOCK_M, BLOCK_N, num_warps, num_stages, GROUP_M, variant flags): BLOCK_K is 128 (one scale block per step)
    (64, 128, 4, 4, 8, ""), (64, 128, 4, 4, 8, "P"), (64, 128, 4, 4, 8, "D"), (64, 128, 4, 4, 8, "TP"),
    (64, 128, 4, 4, 8, "TD"), (64, 128, 4, 3, 8, "T"), (64, 128, 4, 5, 8, "T"), (128, 128, 8, 3, 8, ""),
    (128, 128, 8, 3, 8, "T"), (128, 128, 8, 4, 8, "T"), (128, 64, 4, 4, 8, "T"),
]
_FLAGS = {"P": "PREFETCH", "D": "DEFER", "T": "TMA"}  # fp8_linear.py _fp8_gemm_kernel: scales a step ahead /
# step k scaled beside step k+1's wgmma / tiles through tensor descriptors (the bulk tensor copy engine)
SWEEP = [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, GROUP_M=g, num_warps=w, num_stages=s,
              **{_FLAGS[f]: True for f in flags}) for bm, bn, w, s, g, flags in _C]


def _cfg_name(c: dict) -> str:
    flags = "".join(f for f, name in _FLAGS.items() if c.get(name))
    return f"{c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']} g{c['GROUP_M']}" + (
        f" {flags}" if flags else "")


def _us(fn) -> float:
    if ceilings.on_gpu():
        fn()  # compile / warm
    return ceilings.bench_us(fn, warmup=25, rep=100)


def _rel_err(got: torch.Tensor, args) -> float:
    from engine.core.ops.fp8 import fp8_linear

    want = fp8_linear.reference(*args, torch.float32)
    return ((got.float() - want).norm() / want.norm()).item()


def _row(bench, m, n, k, us, peer, peer_us, goal=GOAL, err=None):
    ratio = peer_us / us
    ok = ratio >= goal and (err is None or err < 2e-2)
    row = {"bench": bench, "shape": f"{m}x{n}x{k}", "us": us, "tflops": 2 * m * n * k / us / 1e6, "peer": peer,
           "peer_us": peer_us, "ratio": ratio, "goal": f">= {goal}x {peer}", "met": ok}
    if err is not None:
        row["max_rel_err"] = err
    return row


def _operands(m, n, k, gen, xg, wg):
    """(x_q, x_scale, w_q, w_scale, bias None) on the generator's device; ``xg`` / ``wg``: a quantize_fp8
    granularity, or its (granularity, fp8 dtype, block) arguments."""
    from engine.core.ops.fp8 import quantize_fp8

    x = torch.randn(m, k, generator=gen, device=gen.device).bfloat16()
    w = (torch.randn(n, k, generator=gen, device=gen.device) * k ** -0.5).bfloat16()
    fp8 = torch.float8_e4m3fn
    x_q, xs = quantize_fp8(x, *xg) if isinstance(xg, tuple) else quantize_fp8(x, xg, fp8)
    w_q, ws = quantize_fp8(w, *wg) if isinstance(wg, tuple) else quantize_fp8(w, wg, fp8)
    return x_q, xs, w_q, ws, None


def _gemm_rows(m, n, k, gen, sweep: bool, sweep_first: int | None = None) -> list[dict]:
    from engine.platforms.triton_kernels import fp8_linear as fl

    out = torch.bfloat16
    peer = "_scaled_mm per-tensor"
    xt, xts, wt, wts, _ = _operands(m, n, k, gen, "tensor", "tensor")
    peer_us = _us(lambda: torch._scaled_mm(xt, wt.t(), scale_a=xts, scale_b=wts, out_dtype=out))

    blk = (("block", torch.float8_e4m3fn, (1, 128)), ("block", torch.float8_e4m3fn, (128, 128)))
    args = _operands(m, n, k, gen, *blk)
    rows = []
    cfg = fl.gemm_config(m, n, k, True)
    err = _rel_err(fl.triton_fp8_linear(*args, out), args)
    rows.append(_row(f"triton block-scaled GEMM {_cfg_name(cfg)}", m, n, k,
                     _us(lambda: fl.triton_fp8_linear(*args, out)), peer, peer_us, err=err))
    if sweep:
        for c in SWEEP[:sweep_first]:
            if c == cfg:
                continue
            try:
                e = _rel_err(fl.triton_fp8_linear(*args, out, config=c), args)
                us = _us(lambda c=c: fl.triton_fp8_linear(*args, out, config=c))
            except Exception as exc:  # a configuration the compiler or the SM cannot take (shared memory)
                rows.append({"bench": f"sweep {_cfg_name(c)}", "shape": f"{m}x{n}x{k}", "error": repr(exc)[:200],
                             "met": False})
                continue
            rows.append(_row(f"sweep {_cfg_name(c)}", m, n, k, us, peer, peer_us, err=e))

    rw = _operands(m, n, k, gen, "token", "channel")
    err = _rel_err(fl.scaled_mm_linear(*rw, out), rw)
    rows.append(_row("_scaled_mm per-token x per-channel (engine path)", m, n, k,
                     _us(lambda: fl.scaled_mm_linear(*rw, out)), peer, peer_us, err=err))
    err = _rel_err(fl.triton_fp8_linear(*rw, out), rw)
    rows.append(_row("triton GEMM per-token x per-channel", m, n, k, _us(lambda: fl.triton_fp8_linear(*rw, out)),
                     peer, peer_us, err=err))
    return rows


GEMV_GOAL = 1.6  # the FP8 GEMV vs the bf16 weight through cuBLAS (issue 27: an FP8 model decodes >= 1.6x bf16)
GEMV_SWEEP = [dict(block_n=bn, block_k=bk, num_warps=w, num_stages=s) for bn, bk, w, s in (
    (8, 512, 4, 2), (4, 512, 4, 2), (16, 256, 4, 2), (8, 1024, 8, 2), (4, 1024, 4, 3), (16, 512, 8, 2), (2, 1024, 4, 2),
    (8, 256, 2, 2), (32, 256, 8, 2), (4, 512, 4, 4), (2, 512, 2, 3))] + [
    dict(block_n=bn, block_k=bk, num_warps=w, num_stages=3, splits=sp) for bn, bk, w, sp in (
        (8, 512, 4, 4), (4, 512, 4, 4), (8, 256, 4, 8), (16, 512, 8, 8))]


GEMV_COPIES = 4  # weight copies the GEMV rows rotate over: 4 x 29 MB of FP8 outgrow the H200's 50 MB L2


def _graph_us(call, args_list) -> float:
    """us per call of ``call(*args)`` rotating over ``args_list`` (one weight copy each), timed as CUDA-graph replays
    (quant.py's ``_rotating``): the GEMV runs inside the engine's decode graphs, so the host's launch cost (tens of
    us of Python for a Triton launch, more than the kernel) is no part of its time. Off a GPU: one call."""
    from benchmarks.gpu.quant import _rotating

    return _rotating([lambda a=a: call(*a) for a in args_list])


def _copies(args, n: int) -> list[tuple]:
    """``args`` (x_q, x_scale, w_q, w_scale, bias) with n - 1 more copies of the weight and its scale."""
    x_q, xs, w_q, ws, bias = args
    return [args] + [(x_q, xs, w_q.clone(), ws.clone(), bias) for _ in range(n - 1)]


def _gemv_rows(m, n, k, gen, sweep: bool, sweep_first: int | None = None) -> list[dict]:
    """triton_fp8_gemv (per-token x per-channel, the engine's decode path for such checkpoints; and 128x128 blocks)
    against the same shape in bf16 through cuBLAS, with _scaled_mm (what decode ran before) beside it; every row
    timed as CUDA-graph replays over rotating weight copies."""
    from engine.platforms.triton_kernels import fp8_gemv as fg
    from engine.platforms.triton_kernels import fp8_linear as fl

    out = torch.bfloat16
    copies = GEMV_COPIES if ceilings.on_gpu() else 1
    x = torch.randn(m, k, generator=gen, device=gen.device).bfloat16()
    ws_bf16 = [((torch.randn(n, k, generator=gen, device=gen.device) * k ** -0.5).bfloat16(),) for _ in range(copies)]
    peer = "bf16 cuBLAS (x @ w.T)"
    peer_us = _graph_us(lambda w: torch.nn.functional.linear(x, w), ws_bf16)
    rw = _operands(m, n, k, gen, "token", "channel")
    rws = _copies(rw, copies)
    rows = []
    err = _rel_err(fl.scaled_mm_linear(*rw, out), rw) if ceilings.on_gpu() else None
    if err is not None:
        rows.append(_row("_scaled_mm per-token x per-channel (decode before)", m, n, k,
                         _graph_us(lambda *a: fl.scaled_mm_linear(*a, out), rws), peer, peer_us, goal=GEMV_GOAL,
                         err=err))
    cfg = fg.gemv_config(m)
    rows.append(_row(f"triton_fp8_gemv per-token x per-channel {cfg}", m, n, k,
                     _graph_us(lambda *a: fg.fp8_gemv_linear(*a, out), rws), peer, peer_us, goal=GEMV_GOAL,
                     err=_rel_err(fg.fp8_gemv_linear(*rw, out), rw)))
    blk = _operands(m, n, k, gen, ("block", torch.float8_e4m3fn, (1, 128)), ("block", torch.float8_e4m3fn, (128, 128)))
    rows.append(_row("triton_fp8_gemv 1x128 x 128x128 blocks", m, n, k,
                     _graph_us(lambda *a: fg.fp8_gemv_linear(*a, out), _copies(blk, copies)),
                     peer, peer_us, goal=GEMV_GOAL, err=_rel_err(fg.fp8_gemv_linear(*blk, out), blk)))
    if sweep:
        for c in GEMV_SWEEP[:sweep_first]:
            try:
                e = _rel_err(fg.fp8_gemv_linear(*rw, out, config=c), rw)
                us = _graph_us(lambda *a, c=c: fg.fp8_gemv_linear(*a, out, config=c), rws)
            except Exception as exc:  # a tile the compiler cannot take (registers)
                rows.append({"bench": f"gemv sweep {c}", "shape": f"{m}x{n}x{k}", "error": repr(exc)[:200],
                             "met": False})
                continue
            rows.append(_row(f"gemv sweep {c}", m, n, k, us, peer, peer_us, goal=GEMV_GOAL, err=e))
    return rows


def _quant_rows(m, k, gen) -> list[dict]:
    from engine.core.ops.fp8 import quantize_fp8
    from engine.platforms.triton_kernels import fp8_linear as fl

    x = torch.randn(m, k, generator=gen, device=gen.device).bfloat16()
    rows = []
    for group, ref in ((0, lambda: quantize_fp8(x, "token")), (128, lambda: quantize_fp8(x, "block", block=(1, 128)))):
        q, s = fl.triton_fp8_quantize(x, "e4m3fn", group)
        rq, rs = ref()
        exact = torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
        us, peer_us = _us(lambda g=group: fl.triton_fp8_quantize(x, "e4m3fn", g)), _us(ref)
        gbs = m * k * 3 / us / 1e3  # bf16 read + fp8 written
        name = "per-token" if group == 0 else "1x128 groups"
        rows.append({"bench": f"triton fp8_quantize_per_token {name}" + ("" if exact else " (NOT BIT-EXACT)"),
                     "shape": f"{m}x{k}", "us": us, "tflops": 0.0, "peer": "torch reference (quantize_fp8)",
                     "peer_us": peer_us, "ratio": peer_us / us, "goal": ">= 2x torch reference, bit-exact",
                     "met": exact and peer_us / us >= 2, "gb_s": gbs})
    return rows


def run(sweep: bool | None = None, tiny: bool = False, gemv_only: bool = False) -> list[dict]:
    """The rows above (``sweep``, default ENGINE_BENCH_SWEEP, adds the block-scaled GEMM sweep at the squares;
    ``tiny``: at ``TINY``, with the sweep's first configuration; ``gemv_only``: the decode GEMV's rows alone)."""
    s = TINY if tiny else FULL
    if s.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("benchmarks/gpu/fp8.py needs a CUDA GPU")
        cap = torch.cuda.get_device_capability()
        if cap < (8, 9):
            raise RuntimeError(f"FP8 needs compute capability >= 8.9, this GPU is {cap}")
    gen = torch.Generator(device=s.device).manual_seed(0)
    rows = []
    for m, n, k in () if gemv_only else s.squares:
        rows += _gemm_rows(m, n, k, gen, sweep=SWEEP_ON if sweep is None else sweep, sweep_first=s.sweep_first)
        if s.device == "cuda":
            torch.cuda.empty_cache()
    if not gemv_only:
        rows += _gemm_rows(*s.decode, gen, sweep=False)
    for m, n, k in s.gemv:
        rows += _gemv_rows(m, n, k, gen, sweep=(SWEEP_ON if sweep is None else sweep) or GEMV_SWEEP_ON,
                           sweep_first=s.sweep_first)
    if not gemv_only:
        rows += _quant_rows(*s.quant, gen)
    return rows


if __name__ == "__main__":
    result = run(tiny="--tiny" in sys.argv, gemv_only="--gemv-only" in sys.argv)
    keys = list(dict.fromkeys(k for r in result for k in r))
    print("| " + " | ".join(keys) + " |")
    for r in result:
        print("| " + " | ".join(f"{r[k]:.3g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys)
              + " |")
