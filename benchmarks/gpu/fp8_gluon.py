"""The Gluon warp-specialized FP8 block-scaled GEMM (platforms/cuda/gluon_fp8_block.py) on an H200, in one process:
each variant checked against the op's reference on fresh random inputs, then timed beside the Triton default
(``triton_fp8_linear``) and ``torch._scaled_mm`` per-tensor (the goal's peer, same operands as quant_sweep.py fp8).

    python benchmarks/gpu/fp8_gluon.py     # 4096^3 and 8192^3 (variants), then M = 1024 .. 8192 at N = K = 4096
    python benchmarks/gpu/fp8_gluon.py --tiny   # TINY shapes; the Gluon calls only on an sm_90 GPU (CI builds the
                                                # cases and times the peers on the CPU under the Triton interpreter)

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
TINY = {"squares": (128,), "shapes": [(128, 128, 128), (32, 128, 256)]}


def hopper() -> bool:
    """Whether the Gluon kernel can run here: an sm_90 CUDA GPU (Gluon cannot be interpreted)."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def run(shapes=SHAPES, squares=SQUARES, device="cuda", gluon: bool = True, tiny: bool = False) -> list[dict]:
    """The rows above; ``gluon=False`` builds every case and times the peers but launches no Gluon kernel (its rows
    say so); ``tiny``: at ``TINY`` (on the CPU under the Triton interpreter where there is no GPU)."""
    from benchmarks.gpu import ceilings
    from benchmarks.gpu.fp8 import _operands, _rel_err, _us
    from engine.platforms.cuda import gluon_fp8_block as gb
    from engine.platforms.triton_kernels import fp8_linear as fl

    if tiny:
        shapes, squares = TINY["shapes"], TINY["squares"]
        device = "cuda" if torch.cuda.is_available() else "cpu"
    for cfg in VARIANTS:  # a key the kernel does not read would be ignored, and the row would time the default
        assert set(cfg or {}) <= set(gb.CONFIG), f"{cfg}: gluon_fp8_block.CONFIG has {sorted(gb.CONFIG)}"

    gen = torch.Generator(device=device).manual_seed(int(time.time()))
    rows = []
    print(json.dumps(_head(gen.device)), flush=True)
    for m, n, k in shapes:
        timer = _us if (m == n == k and m in squares) else ceilings.graph_us
        xt, xts, wt, wts, _ = _operands(m, n, k, gen, "tensor", "tensor")
        peer = timer(functools.partial(torch._scaled_mm, xt, wt.t(), scale_a=xts, scale_b=wts,
                                       out_dtype=torch.bfloat16))
        del xt, wt
        args = _operands(m, n, k, gen, ("block", torch.float8_e4m3fn, (1, 128)),
                         ("block", torch.float8_e4m3fn, (128, 128)))
        tri_err = _rel_err(fl.triton_fp8_linear(*args, torch.bfloat16), args)
        tri = timer(functools.partial(fl.triton_fp8_linear, *args, torch.bfloat16))
        variants = VARIANTS if m == n == k else VARIANTS[:1]
        for cfg in variants:
            name = json.dumps({**gb.CONFIG, **(cfg or {})}, sort_keys=True)
            if not gluon:
                rows.append(dict(shape=f"{m}x{n}x{k}", cfg=name, triton_us=round(tri, 2), scaled_mm_us=round(peer, 2),
                                 triton_ratio=round(peer / tri, 3), triton_err=f"{tri_err:.2e}", ok=tri_err < 2e-2,
                                 gluon="not launched (needs an sm_90 GPU)"))
                print(rows[-1], flush=True)
                continue
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
        if gen.device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _head(device: torch.device) -> dict:
    import triton

    return dict(triton=triton.__version__, torch=torch.__version__,
                device=torch.cuda.get_device_name(device) if device.type == "cuda" else str(device))


if __name__ == "__main__":
    result = run(tiny="--tiny" in sys.argv, gluon=hopper())
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "fp8_gluon.json"), "w") as f:
            json.dump(dict(_head(torch.device("cuda" if torch.cuda.is_available() else "cpu")), rows=result), f,
                      indent=1)
