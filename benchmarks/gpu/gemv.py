"""bf16 GEMV at M = 1 on the Llama-3-8B decode shapes: cuBLAS (``F.linear``, what the engine runs today) against a
plain Triton GEMV swept over a few tiles. An experiment, not an engine kernel: it measures how far the single-request
decode's GEMMs (about 85% of its device time) are from the copy bandwidth, and whether a GEMV of our own closes that.

Timing as in quant.py (CUDA-graph replays rotating over weight buffers larger than L2); every Triton result is
checked against cuBLAS first. ``run()`` returns rows {"bench", "shape", "us", "tbps", "peer", "peer_us",
"peer_tbps", "ratio", "config"}.

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
SWEEP = [dict(block_n=bn, block_k=bk, num_warps=w, num_stages=s)
         for bn, bk, w, s in itertools.product((4, 8, 16), (256, 512), (4, 8), (3, 4))]


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        nmask = rn < N
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            w = tl.load(w_ptr + rn[:, None] * stride_wn + (k + rk)[None, :], mask=nmask[:, None], other=0.0)
            x = tl.load(x_ptr + k + rk)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        tl.store(y_ptr + rn, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=nmask)

    return gemv_kernel


def gemv(x, w, y, kernel, block_n, block_k, num_warps, num_stages):
    n, k = w.shape
    kernel[(-(-n // block_n),)](x, w, y, n, k, w.stride(0), BLOCK_N=block_n, BLOCK_K=block_k,
                                num_warps=num_warps, num_stages=num_stages)
    return y


def run() -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quant import _buffers, _check, _rotating

    kernel = _kernel()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for name, (n, k) in SHAPES.items():
        nbytes = n * k * 2
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(_buffers(nbytes, l2))]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        peer = _rotating([functools.partial(torch.nn.functional.linear, x, w) for w in ws])
        best = None
        for cfg in SWEEP:
            if k % cfg["block_k"]:
                continue
            _check(f"gemv {name} {cfg}", gemv(x, ws[0], y, kernel, **cfg), torch.nn.functional.linear(x, ws[0]), 1e-2)
            us = _rotating([functools.partial(gemv, x, w, y, kernel, **cfg) for w in ws], fast=True)
            if best is None or us < best[0]:
                best = (us, cfg)
        us, cfg = best
        rows.append({"bench": f"bf16 GEMV M=1 {name}", "shape": f"{n}x{k}", "us": us, "tbps": nbytes / us / 1e6,
                     "peer": "cuBLAS F.linear", "peer_us": peer, "peer_tbps": nbytes / peer / 1e6,
                     "ratio": peer / us, "config": str(cfg)})
        print(rows[-1], flush=True)
        del ws
    return rows


if __name__ == "__main__":
    for r in run():
        print(r)
