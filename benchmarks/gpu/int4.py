"""GPU benchmark of ``int4_linear`` (GPTQ / AWQ 4-bit weights, platforms/triton_kernels/int4_linear.py) against cuBLAS
bf16 (``F.linear``) and against the GGUF Q4_1 kernel the same checkpoints ran on before (gguf_linear.py), at the 8B
decode shapes and M = 1, 4, 16, 64; and GGUF Q4_0 matrices as the engine runs them where int4_linear has a kernel
(the same numbers as INT4 groups of 32, models.weights.gguf_as_int4) against the GGUF Q4_0 kernel.

Weights: groups of 128 with zero points (AWQ's and asymmetric GPTQ's layout; 4.19 bits a value with the fp16 scales
and uint8 zeros, against Q4_1's 5 and bf16's 16). Timing as in quant.py: CUDA-graph replays over weight copies that
together exceed three times the L2 cache; each kernel's output is checked against the op's reference first. Goal rows
(issue 27: the INT4 model >= 2.5x bf16 at one request) ask the M = 1 GEMV for >= 3x cuBLAS bf16; the rest are "info".

    python benchmarks/gpu/int4.py [--sweep] [--json out.json]   # --sweep (or ENGINE_BENCH_SWEEP=1): tile sweeps

``run(tiny=True)`` runs every row and the first configuration of each sweep at a tiny shape, on the CPU under the
Triton interpreter where there is no GPU (what CI runs: the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu import ceilings  # noqa: E402
from benchmarks.gpu.quant import _buffers, _check, _random_gguf, _rotating, _row, _tune_rows, report  # noqa: E402

SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))  # the 8B model's qkv, o, gate_up, down [N, K]
MS = (1, 2, 4, 16, 64)
GROUP = 128
GOAL_M1 = 3.0
TINY = {"shapes": ((32, 256),), "ms": (1, 5), "sweep_first": 1}
GEMV_SWEEP = ([dict(block_n=bn, block_b=bb, num_warps=wp, num_stages=st) for bn in (2, 4, 8) for bb in (64, 128, 256)
               for wp in (2, 4) for st in (2, 3)] + [dict(splits=sp) for sp in (1, 2, 4)])
DOT_SWEEP = ([dict(block_n=bn, block_t=bt, num_warps=wp, num_stages=st) for bn in (64, 128) for bt in (8, 16, 32)
              for wp in (4, 8) for st in (2, 3, 4)] + [dict(splits=sp) for sp in (1, 2, 4, 8)])
DOT_M1_SWEEP = [dict(block_m=16, block_n=bn, block_t=bt, num_warps=wp, num_stages=st) for bn in (32, 64, 128)
                for bt in (16, 32) for wp in (4, 8) for st in (3, 4)]  # tensor cores at decode sizes


def random_int4(n: int, k: int, group: int, device, gen) -> tuple:
    """(packed, scale fp16, zero uint8, group) of plausible magnitudes, made on the device."""
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device, generator=gen)
    scale = (torch.rand((n, k // group), device=device, generator=gen) * 0.01 + 0.002).half()
    zero = torch.randint(0, 16, (n, k // group), dtype=torch.uint8, device=device, generator=gen)
    return packed, scale, zero, group


def run(sweep: bool | None = None, device: str = "cuda", tiny: bool = False) -> list[dict]:
    from engine.core.models.weights import QuantizedWeight, gguf_as_int4
    from engine.core.ops.gguf_quant import Q4_0, Q4_1, _gguf_linear_ref
    from engine.core.ops.int4 import _int4_linear_ref
    from engine.platforms.triton_kernels import gguf_linear as gmod
    from engine.platforms.triton_kernels import int4_linear as imod

    shapes, ms, first, group = SHAPES, MS, None, GROUP
    if tiny:
        shapes, ms, first, group = TINY["shapes"], TINY["ms"], TINY["sweep_first"], 64
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if sweep is None:
        sweep = os.environ.get("ENGINE_BENCH_SWEEP", "0") not in ("", "0")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("benchmarks/gpu/int4.py needs a CUDA GPU")
    dev = torch.device(device)
    l2 = ceilings.l2_bytes(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for n, k in shapes:
        shape_w = f"{n}x{k}"
        w16 = [torch.randn((n, k), device=dev, dtype=torch.bfloat16, generator=gen) * k**-0.5
               for _ in range(_buffers(n * k * 2, l2))]
        int4_bytes = n * k // 2 + 3 * n * (k // group)
        w4 = [random_int4(n, k, group, dev, gen) for _ in range(_buffers(int4_bytes, l2))]
        q41_bytes = n * (k // 32) * 20
        q41 = [_random_gguf(n, k, Q4_1, dev, gen) for _ in range(_buffers(q41_bytes, l2))]
        q40_bytes = n * (k // 32) * 18
        q40 = [_random_gguf(n, k, Q4_0, dev, gen) for _ in range(_buffers(q40_bytes, l2))]
        q40_int4 = [gguf_as_int4(QuantizedWeight(r, Q4_0, n, k)) for r in q40]
        for m in ms:
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16, generator=gen)
            peer_us = _rotating([functools.partial(torch.nn.functional.linear, x, w) for w in w16])
            ref = _int4_linear_ref(x, *w4[0], None)
            _check(f"int4 M={m} {shape_w}", imod.int4_linear_triton(x, *w4[0], None), ref, 2e-2)

            def calls(config, x=x, w4=w4, kernel=None):
                return [functools.partial(imod.int4_linear_triton, x, *w, None, kernel=kernel, config=config)
                        for w in w4]

            us = _rotating(calls(None))
            goal = f"ratio >= {GOAL_M1}" if m == 1 else "info"
            rows.append(_row("int4_w4a16", f"M={m} {shape_w}", us, int4_bytes, "cuBLAS bf16 F.linear", peer_us, goal,
                             peer_us / us >= (GOAL_M1 if m == 1 else 1.0)))
            # the alternatives the defaults were chosen against: tensor cores at decode sizes, the dot without PTX
            if m <= imod.GEMV_DEFAULT_MAX_M:
                others = [("dot", None), ("gemv", {"mantissa": m > imod.GEMV_MANTISSA_MAX_M})]
            elif m <= imod.GEMV_MAX_M:
                others = [("gemv", None)]
            else:  # the PTX decode, the plane-pair dots (against session 26's K-ordered tile), scales a step ahead
                others = [("dot", {"asm": False}), ("dot", {"planes": False, "asm": False}), ("dot", {"ahead": True})]
            for kernel, config in others:
                _check(f"int4 {kernel} {config} M={m} {shape_w}",
                       imod.int4_linear_triton(x, *w4[0], None, kernel=kernel, config=config), ref, 2e-2)
                o_us = _rotating(calls(config, kernel=kernel))
                rows.append(_row(f"int4_w4a16[{kernel} {json.dumps(config)}] (not the default)",
                                 f"M={m} {shape_w}", o_us, int4_bytes, "cuBLAS bf16 F.linear", peer_us, "info",
                                 peer_us / o_us >= 1.0))
            _check(f"gguf q4_1 M={m} {shape_w}", gmod.linear(x, q41[0], Q4_1, k), _gguf_linear_ref(x, q41[0], Q4_1, k),
                   2e-2)
            q_us = _rotating([functools.partial(gmod.linear, x, r, Q4_1, k) for r in q41])
            rows.append(_row("gguf_q4_1 (before: GPTQ/AWQ ran as this)", f"M={m} {shape_w}", q_us, q41_bytes,
                             "cuBLAS bf16 F.linear", peer_us, "info", peer_us / q_us >= 1.0))
            q40_ref = _gguf_linear_ref(x, q40[0], Q4_0, k)
            _check(f"gguf q4_0 as int4 M={m} {shape_w}", imod.int4_linear_triton(
                x, q40_int4[0].packed, q40_int4[0].scale, None, 32, None), q40_ref, 2e-2)
            _check(f"gguf q4_0 M={m} {shape_w}", gmod.linear(x, q40[0], Q4_0, k), q40_ref, 2e-2)
            a_us = _rotating([functools.partial(imod.int4_linear_triton, x, w.packed, w.scale, None, 32, None)
                              for w in q40_int4])
            g_us = _rotating([functools.partial(gmod.linear, x, r, Q4_0, k) for r in q40])
            rows_q40 = [("gguf_q4_0 as int4_w4a16 groups of 32 (the engine's Q4_0 path now)", a_us)]
            if m > imod.GEMV_DEFAULT_MAX_M:  # tensor cores with one scale load a group, widened (DOT_WIDEN)
                widen = {"widen": True}
                _check(f"gguf q4_0 as int4, widened scales M={m} {shape_w}", imod.int4_linear_triton(
                    x, q40_int4[0].packed, q40_int4[0].scale, None, 32, None, kernel="dot", config=widen), q40_ref,
                    2e-2)
                rows_q40.append(("gguf_q4_0 as int4_w4a16[dot {\"widen\": true}] (not the default)", _rotating(
                    [functools.partial(imod.int4_linear_triton, x, w.packed, w.scale, None, 32, None, kernel="dot",
                                       config=widen) for w in q40_int4])))
            for name, t_us in (*rows_q40,
                               ("gguf_q4_0 (the GGUF kernel: Q4_0 ran as this before)", g_us)):
                rows.append(_row(name, f"M={m} {shape_w}", t_us, q40_bytes, "cuBLAS bf16 F.linear", peer_us, "info",
                                 peer_us / t_us >= 1.0))
            if sweep:
                sweeps = ([("gemv", GEMV_SWEEP), ("dot", DOT_M1_SWEEP)] if m <= imod.GEMV_DEFAULT_MAX_M
                          else [("dot", DOT_SWEEP)])
                for kernel, configs in sweeps:
                    rows += _tune_rows(f"int4_w4a16[{kernel}]", f"M={m} {shape_w}",
                                       functools.partial(calls, kernel=kernel), configs[:first], peer_us, int4_bytes,
                                       ref)
        w16 = w4 = q41 = q40 = q40_int4 = None
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="add the tile sweeps (or ENGINE_BENCH_SWEEP=1)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--tiny", action="store_true", help="TINY shapes (CI runs them on the CPU under the interpreter)")
    args = ap.parse_args()
    report(run(sweep=True if args.sweep else None, tiny=args.tiny), args.json)


if __name__ == "__main__":
    main()
