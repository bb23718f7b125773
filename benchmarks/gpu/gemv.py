"""bf16 ``linear`` at M = 1, 2, 4 on the Llama-3-8B decode shapes: the engine's Triton GEMV
(platforms/triton_kernels/linear.py, what the cuda platform runs for M <= 4) against cuBLAS (``F.linear``, what it
ran before), with a short tile sweep around the kernel's defaults (``CONFIGS``). The rows report the default
config's time and the sweep's best, so a better tile shows up as best_us < us.

Timing as in quant.py (CUDA-graph replays rotating over weight buffers larger than L2); every Triton result is
checked against cuBLAS first. ``run()`` returns rows {"bench", "shape", "us", "tbps", "peer", "peer_us",
"peer_tbps", "ratio", "best_us", "best_config"}.

    python benchmarks/gpu/gemv.py
"""

from __future__ import annotations

import functools
import itertools
import sys
from pathlib import Path

import torch

# weight [N, K] of the 8B model: fused qkv, o, fused gate_up, down, lm_head
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
MS = (1, 2, 4)
# (block_n, block_k, num_warps, num_stages)
SWEEP = list(itertools.product((4, 8, 16), (256, 512), (4, 8), (3,)))


def run() -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quant import _buffers, _check, _rotating

    from engine.platforms.triton_kernels.linear import gemv_config, triton_gemv

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for name, (n, k) in SHAPES.items():
        nbytes = n * k * 2
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(_buffers(nbytes, l2))]
        for m in MS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            peer = _rotating([functools.partial(torch.nn.functional.linear, x, w) for w in ws], fast=True)
            default = gemv_config(m, k, torch.bfloat16)
            timed = {}
            for bn, bk, warps, stages in [default[1:], *SWEEP]:
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
    run()  # prints each row as it is measured
