"""bf16 ``linear`` at M = 1, 2, 4 on the Llama-3-8B decode shapes: the engine's Triton GEMV
(platforms/triton_kernels/linear.py, what the cuda platform runs for M <= 4) against cuBLAS (``F.linear``, what it
ran before), with a short tile sweep around the kernel's defaults (``CONFIGS``). The rows report the default
config's time and the sweep's best, so a better tile shows up as best_us < us.

Timing as in quant.py (CUDA-graph replays rotating over weight buffers larger than L2); every Triton result is
checked against cuBLAS first. ``run()`` returns rows {"bench", "shape", "us", "tbps", "peer", "peer_us",
"peer_tbps", "ratio", "best_us", "best_config"}.

    python benchmarks/gpu/gemv.py
    python benchmarks/gpu/gemv.py --tiny   # TINY: the same code on small shapes, the sweep's first tile (CI runs it
                                           # on the CPU under the Triton interpreter: the numbers mean nothing)
"""

from __future__ import annotations

import functools
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu import ceilings  # noqa: E402

# weight [N, K] of the 8B model: fused qkv, o, fused gate_up, down, lm_head
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
MS = (1, 2, 4)
# (block_n, block_k, num_warps, num_stages)
SWEEP = list(itertools.product((4, 8, 16), (256, 512), (4, 8), (3,)))
TINY = {"shapes": {"qkv": (48, 256), "down": (32, 512)}, "ms": (1, 3), "sweep": SWEEP[:1]}


def run(shapes: dict = SHAPES, ms=MS, sweep=SWEEP, device: str = "cuda", tiny: bool = False) -> list[dict]:
    """The rows above; ``tiny``: at ``TINY`` (on the CPU under the Triton interpreter where there is no GPU)."""
    if tiny:
        shapes, ms, sweep = TINY["shapes"], TINY["ms"], TINY["sweep"]
        device = "cuda" if torch.cuda.is_available() else "cpu"
    from benchmarks.gpu.quant import _buffers, _check, _rotating
    from engine.platforms.triton_kernels.linear import gemv_config, triton_gemv

    l2 = ceilings.l2_bytes(device)
    rows = []
    for name, (n, k) in shapes.items():
        nbytes = n * k * 2
        ws = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * k ** -0.5 for _ in range(_buffers(nbytes, l2))]
        for m in ms:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            peer = _rotating([functools.partial(torch.nn.functional.linear, x, w) for w in ws], fast=True)
            default = gemv_config(m, k, torch.bfloat16)
            timed = {}
            for bn, bk, warps, stages in [default[1:], *sweep]:
                cfg = (default[0], bn, bk, warps, stages)
                if cfg in timed or bn * bk * default[0] > 16384:  # beyond this the accumulator spills
                    continue
                _check(f"gemv {name} M={m} {cfg}", triton_gemv(x, ws[0], None, cfg),
                       torch.nn.functional.linear(x, ws[0]), 2e-2)
                timed[cfg] = _rotating([functools.partial(triton_gemv, x, w, None, cfg) for w in ws], fast=True)
            us = timed[default]
            best_cfg = min(timed, key=timed.get)
            rows.append({"bench": f"bf16 linear M={m} {name}", "shape": f"{n}x{k}", "us": us,
                         "tbps": nbytes / us / 1e6, "peer": "cuBLAS F.linear", "peer_us": peer,
                         "peer_tbps": nbytes / peer / 1e6, "ratio": peer / us, "best_us": timed[best_cfg],
                         "best_config": str(best_cfg[1:])})
            print(rows[-1], flush=True)
        del ws
    return rows


if __name__ == "__main__":
    run(tiny="--tiny" in sys.argv)  # prints each row as it is measured
