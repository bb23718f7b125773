"""The Gluon warp-specialized FP8 block-scaled GEMM (platforms/cuda/gluon_fp8_block.py) on an H200, in one process:
each variant checked against the op's reference on fresh random inputs, then timed beside the Triton default
(``triton_fp8_linear``) and ``torch._scaled_mm`` per-tensor (the goal's peer, same operands as quant_sweep.py fp8).

    python benchmarks/gpu/fp8_gluon.py     # 4096^3 and 8192^3 (variants), then M = 1024 .. 8192 at N = K = 4096

Rows print as they come; ``$OUT/fp8_gluon.json`` holds them when OUT is set. ``ratio`` is scaled_mm_us / us (the
goal: >= 0.8 at the squares), ``vs_triton`` triton_us / us. ``err``: ||out - ref|| / ||ref||, WRONG above 2e-2.
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

# the module's CONFIG first (H200, 2026-12-01: STAGES 4 / 6 and GROUP_M 16 within 1%, one program per tile 8-10%
# slower than the persistent grid)
VARIANTS = [None, dict(STAGES=6)]
SQUARES = (4096, 8192)  # timed with triton.testing.do_bench, as quant_sweep.py fp8 times them
SHAPES = [(s, s, s) for s in SQUARES] + [(1024, 4096, 4096), (2048, 4096, 4096), (8192, 4096, 4096)]  # and
# these (about MIN_M / MIN_TILES) as CUDA-graph replays: no host launch cost in the comparison


def main() -> None:
    import triton

    from benchmarks.gpu.fp8 import _operands, _rel_err, _us
    from engine.platforms.cuda import gluon_fp8_block as gb
    from engine.platforms.triton_kernels import fp8_linear as fl

    def _graph_us(fn):
        fn()
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3

    gen = torch.Generator(device="cuda").manual_seed(int(time.time()))
    rows = []
    head = dict(triton=triton.__version__, torch=torch.__version__, device=torch.cuda.get_device_name())
    print(json.dumps(head), flush=True)
    for m, n, k in SHAPES:
        timer = _us if (m == n == k and m in SQUARES) else _graph_us
        xt, xts, wt, wts, _ = _operands(m, n, k, gen, "tensor", "tensor")
        peer = timer(functools.partial(torch._scaled_mm, xt, wt.t(), scale_a=xts, scale_b=wts,
                                       out_dtype=torch.bfloat16))
        del xt, wt
        args = _operands(m, n, k, gen, ("block", torch.float8_e4m3fn, (1, 128)),
                         ("block", torch.float8_e4m3fn, (128, 128)))
        tri = timer(functools.partial(fl.triton_fp8_linear, *args, torch.bfloat16))
        variants = VARIANTS if m == n == k else VARIANTS[:1]
        for cfg in variants:
            name = json.dumps({**gb.CONFIG, **(cfg or {})}, sort_keys=True)
            try:
                err = _rel_err(gb.gluon_fp8_block_linear(*args, torch.bfloat16, config=cfg), args)
                us = timer(functools.partial(gb.gluon_fp8_block_linear, *args, torch.bfloat16, config=cfg))
            except Exception as exc:  # a compiler refusal, out of shared memory
                rows.append(dict(shape=f"{m}x{n}x{k}", cfg=name, error=f"{type(exc).__name__}: {str(exc)[:300]}"))
                print(rows[-1], flush=True)
                continue
            row = dict(shape=f"{m}x{n}x{k}", cfg=name, us=round(us, 2), triton_us=round(tri, 2),
                       scaled_mm_us=round(peer, 2), ratio=round(peer / us, 3), vs_triton=round(tri / us, 3),
                       triton_ratio=round(peer / tri, 3), tflops=round(2 * m * n * k / us / 1e6, 1),
                       err=f"{err:.2e}", ok=err < 2e-2)
            rows.append(row)
            print(f"{row['shape']} {name}: {row['us']} us ({row['tflops']} TFLOP/s), triton {row['triton_us']} us, "
                  f"scaled_mm {row['scaled_mm_us']} us | ratio {row['ratio']} (triton {row['triton_ratio']}), "
                  f"vs triton {row['vs_triton']}x, err {row['err']}{'' if row['ok'] else ' WRONG'}", flush=True)
        del args
        torch.cuda.empty_cache()
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "fp8_gluon.json"), "w") as f:
            json.dump(dict(head, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
