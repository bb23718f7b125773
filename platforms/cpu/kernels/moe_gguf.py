"""``fused_moe_gguf`` on the CPU: the tokens grouped by expert, then each expert's two GEMMs on the native GGUF
kernels, straight from its blocks.

Each expert's ``w13[e]`` / ``w2[e]`` is a plain [rows, row bytes] GGUF matrix. Its GEMMs run the fused raw-row kernel
(blocks decoded in registers, fp32 math; above 64 tokens, dequantize + GEMM), not the packed one the dense layers
use: that one keeps a second, row-interleaved copy of each weight it meets, keyed by the tensor, and an expert slice
is a new tensor every call (a copy per call, and all of the experts twice in memory). SiLU-and-mul is the native
kernel.
"""

from __future__ import annotations

import torch

from engine.core.ops.moe import expert_groups
from engine.core.ops.moe_gguf import fused_moe_gguf, moe_gguf_problem

from ._common import DTYPE_CODE, PRIORITY
from .gguf import _fused_linear as raw_rows_linear
from .small_ops import _silu_and_mul


def _supports(x, w13, w13_qtype, w2, w2_qtype, router_logits, top_k, renormalize):
    problem = moe_gguf_problem(x, w13, w13_qtype, w2, w2_qtype, router_logits, top_k)
    if problem:
        return problem
    if any(t.device.type != "cpu" for t in (x, w13, w2, router_logits)):
        return "x, w13, w2 and router_logits must be cpu tensors"
    if x.dtype not in DTYPE_CODE:
        return f"x dtype {x.dtype}: the native GGUF kernels take fp32 or bf16"
    return True


def _fused_moe_gguf(x, w13, w13_qtype, w2, w2_qtype, router_logits, top_k, renormalize):
    tokens, hidden = x.shape
    inter = w13.shape[1] // 2
    w13, w2 = w13.contiguous(), w2.contiguous()  # expert slices must be dense [rows, row bytes] matrices
    out = torch.zeros((tokens, hidden), dtype=torch.float32)
    for e, rows, weight in expert_groups(router_logits, top_k, renormalize, w13.shape[0]):
        gate_up = raw_rows_linear(x[rows], w13[e], w13_qtype, hidden)
        h = _silu_and_mul(gate_up)
        y = raw_rows_linear(h, w2[e], w2_qtype, inter)
        out.index_add_(0, rows, y.float() * weight)  # a token meets each expert at most once
    return out.to(x.dtype)


def register(registry) -> None:
    registry.register(fused_moe_gguf, _fused_moe_gguf, name="native_per_expert", supports=_supports,
                      priority=PRIORITY, note="tokens grouped by expert; each expert's GEMMs on the native GGUF "
                      "kernels, from its blocks")
