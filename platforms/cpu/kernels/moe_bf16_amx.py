"""fused_moe for bf16 prefill on CPUs with AMX-BF16: one torch bf16 matmul pair per expert (oneDNN runs them on
the AMX tiles), where the native kernel, which widens bf16 to fp32 FMAs, is 1.4-3x slower (BENCHMARKS.md).

Numerics: each expert's GEMMs accumulate in fp32 inside oneDNN but round their outputs (gate/up, then the
SiLU-and-mul product h, then h @ w2^T) to bf16; the weighted sum over a token's experts is fp32, rounded once.
That stays within the op's bf16 tolerance; decode-sized calls keep the native kernel (fp32 math throughout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.core.ops.moe import expert_groups, fused_moe
from engine.platforms.cpu import cpu_flags

from ._common import PRIORITY

# Fewer tokens than this and the native kernel wins (measured 1.5x at 16 tokens, 0.7x at 64, 0.35x at 256).
MIN_TOKENS = 33


def has_amx_bf16(cpuinfo: str) -> bool:
    return "amx_bf16" in cpu_flags(cpuinfo)


def _supports(x, w13, w2, router_logits, top_k, renormalize):
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in (x, w13, w2, router_logits)):
        return "x, w13, w2 and router_logits must be cpu tensors"
    if not x.dtype == w13.dtype == w2.dtype == torch.bfloat16:
        return "only bf16 x and weights (fp32 stays on the native kernel)"
    if x.dim() != 2 or x.shape[0] < MIN_TOKENS:
        return f"fewer than {MIN_TOKENS} tokens: the native kernel is faster"
    return True


def _experts_bf16(x, w13, w2, router_logits, top_k, renormalize):
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e, tokens, weight in expert_groups(router_logits, top_k, renormalize, w13.shape[0]):
        gate_up = F.linear(x[tokens], w13[e])
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out.index_add_(0, tokens, F.linear(h, w2[e]).float() * weight)
    return out.to(x.dtype)


def register(registry, cpuinfo: str) -> None:
    if not has_amx_bf16(cpuinfo):
        registry.skip(fused_moe, "bf16_amx_experts", "this CPU has no AMX-BF16 (cpuinfo flag amx_bf16)")
        return
    registry.register(fused_moe, _experts_bf16, name="bf16_amx_experts", supports=_supports, priority=PRIORITY + 1,
                      note=f"torch bf16 matmuls per expert on AMX, from {MIN_TOKENS} tokens", dtypes=(torch.bfloat16,))
