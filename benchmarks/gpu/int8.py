"""GPU benchmark of ``int8_linear`` (8-bit weight-only: GPTQ 8-bit, GGUF Q8_0 as groups of 32;
platforms/triton_kernels/int8_linear.py) against cuBLAS bf16 (``F.linear``) and against the GGUF Q8_0 kernel Q8_0
matrices ran on before (gguf_linear.py), at the 8B decode shapes and M = 1, 4, 16, 64.

Weights: GGUF Q8_0 blocks made on the GPU, run by the GGUF kernel as they are and by int8_linear after
models.weights.gguf_as_int8 (the same numbers: 8.5 bits a value against bf16's 16); and GPTQ-style groups of 128
with zero points. Timing as in quant.py: CUDA-graph replays over weight copies that together exceed three times the
L2 cache; each kernel's output is checked against the op's reference first. Goal row (issue 28: Q8_0 GEMV at M = 1
>= 1.6x cuBLAS bf16); the rest are "info".

    python benchmarks/gpu/int8.py [--json out.json]

``run(tiny=True)`` runs every row at a tiny shape, on the CPU under the Triton interpreter where there is no GPU (what
CI runs: the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu import ceilings  # noqa: E402
from benchmarks.gpu.quant import _buffers, _check, _random_gguf, _rotating, _row, report  # noqa: E402

SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))  # the 8B model's qkv, o, gate_up, down [N, K]
MS = (1, 2, 4, 16, 64)
GOAL_M1 = 1.6
TINY = {"shapes": ((32, 256),), "ms": (1, 5)}


def run(device: str = "cuda", tiny: bool = False) -> list[dict]:
    from engine.core.models.weights import QuantizedWeight, gguf_as_int8
    from engine.core.ops.gguf_quant import Q8_0, _gguf_linear_ref
    from engine.core.ops.int8 import _int8_linear_ref
    from engine.platforms.triton_kernels import gguf_linear as gmod
    from engine.platforms.triton_kernels import int8_linear as imod

    shapes, ms = SHAPES, MS
    if tiny:
        shapes, ms = TINY["shapes"], TINY["ms"]
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("benchmarks/gpu/int8.py needs a CUDA GPU")
    dev = torch.device(device)
    l2 = ceilings.l2_bytes(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for n, k in shapes:
        shape_w = f"{n}x{k}"
        w16 = [torch.randn((n, k), device=dev, dtype=torch.bfloat16, generator=gen) * k**-0.5
               for _ in range(_buffers(n * k * 2, l2))]
        q8_bytes = n * (k // 32) * 34
        q8 = [_random_gguf(n, k, Q8_0, dev, gen) for _ in range(_buffers(q8_bytes, l2))]
        q8_int8 = [gguf_as_int8(QuantizedWeight(r, Q8_0, n, k)) for r in q8]
        g128_bytes = n * k + 3 * n * (k // 128)
        g128 = [(torch.randint(0, 256, (n, k), dtype=torch.uint8, device=dev, generator=gen),
                 (torch.rand((n, k // 128), device=dev, generator=gen) * 1e-3 + 1e-4).half(),
                 torch.randint(0, 256, (n, k // 128), dtype=torch.uint8, device=dev, generator=gen))
                for _ in range(_buffers(g128_bytes, l2))]
        for m in ms:
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16, generator=gen)
            peer_us = _rotating([functools.partial(torch.nn.functional.linear, x, w) for w in w16])
            ref = _gguf_linear_ref(x, q8[0], Q8_0, k)
            w0 = q8_int8[0]
            _check(f"q8_0 as int8 M={m} {shape_w}", imod.int8_linear_triton(x, w0.codes, w0.scale, None, 32), ref,
                   2e-2)
            _check(f"gguf q8_0 M={m} {shape_w}", gmod.linear(x, q8[0], Q8_0, k), ref, 2e-2)
            us = _rotating([functools.partial(imod.int8_linear_triton, x, w.codes, w.scale, None, 32)
                            for w in q8_int8])
            goal = f"ratio >= {GOAL_M1}" if m == 1 else "info"
            rows.append(_row("gguf_q8_0 as int8_w8a16 groups of 32 (the engine's Q8_0 path now)", f"M={m} {shape_w}",
                             us, q8_bytes, "cuBLAS bf16 F.linear", peer_us, goal,
                             peer_us / us >= (GOAL_M1 if m == 1 else 1.0)))
            g_us = _rotating([functools.partial(gmod.linear, x, r, Q8_0, k) for r in q8])
            rows.append(_row("gguf_q8_0 (the GGUF kernel: Q8_0 ran as this before)", f"M={m} {shape_w}", g_us,
                             q8_bytes, "cuBLAS bf16 F.linear", peer_us, "info", peer_us / g_us >= 1.0))
            _check(f"int8 g128 zero M={m} {shape_w}", imod.int8_linear_triton(x, *g128[0], 128),
                   _int8_linear_ref(x, *g128[0], 128, None), 2e-2)
            z_us = _rotating([functools.partial(imod.int8_linear_triton, x, *w, 128) for w in g128])
            rows.append(_row("int8_w8a16 groups of 128, zero points (GPTQ 8-bit)", f"M={m} {shape_w}", z_us,
                             g128_bytes, "cuBLAS bf16 F.linear", peer_us, "info", peer_us / z_us >= 1.0))
        w16 = q8 = q8_int8 = g128 = None
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--tiny", action="store_true", help="TINY shapes (CI runs them on the CPU under the interpreter)")
    args = ap.parse_args()
    report(run(tiny=args.tiny), args.json)


if __name__ == "__main__":
    main()
