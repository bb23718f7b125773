"""``fused_moe_nvfp4`` in Triton (W4A16): fused_moe.py's pipeline with the experts kept packed; each B tile is decoded
from its e2m1 codes and e4m3 block scales in registers (fp4_values.py: exact in x's dtype), and each sum is divided
by its row's global scale once, after the K loop. Nothing is read back to the host (CUDA-graph capturable).

Not tuned (fused_moe's bf16 tiles, byte loads); interpreter-tested, not yet run on a GPU. Blackwell's FP4 tensor
cores (W4A4) are not used here.
"""

from __future__ import annotations

import torch

from engine.core.ops.moe_nvfp4 import fused_moe_nvfp4, moe_nvfp4_problem

from .fused_moe import NVFP4, PRIORITY, MoeConfig, _forward, quantized_experts_verdict


def triton_fused_moe_nvfp4(x, w13_packed, w13_block_scale, w13_global_scale, w2_packed, w2_block_scale,
                           w2_global_scale, router_logits, top_k, renormalize, *, config: MoeConfig | None = None):
    """``fused_moe_nvfp4``. ``config`` overrides the tile heuristics (tests, tuning)."""
    return _forward(x, w13_packed.contiguous(), w2_packed.contiguous(), router_logits, top_k, renormalize,
                    w13_scale=w13_block_scale.contiguous().view(torch.uint8),
                    w2_scale=w2_block_scale.contiguous().view(torch.uint8), w13_qtype=NVFP4, w2_qtype=NVFP4,
                    w13_gs=w13_global_scale.contiguous(), w2_gs=w2_global_scale.contiguous(), config=config)


def make_supports(device_type: str, capability: tuple[int, int] | None = None):
    def supports(x, w13_packed, w13_block_scale, w13_global_scale, w2_packed, w2_block_scale, w2_global_scale,
                 router_logits, top_k, renormalize):
        problem = moe_nvfp4_problem(x, w13_packed, w13_block_scale, w13_global_scale, w2_packed, w2_block_scale,
                                    w2_global_scale, router_logits, top_k)
        if problem:
            return problem
        tensors = (x, w13_packed, w13_block_scale, w13_global_scale, w2_packed, w2_block_scale, w2_global_scale,
                   router_logits)
        return quantized_experts_verdict(device_type, capability, x, tensors, router_logits, w13_packed.shape[0],
                                         top_k)

    return supports


def register(registry, device_type: str, capability: tuple[int, int] | None = None) -> None:
    registry.register(fused_moe_nvfp4, triton_fused_moe_nvfp4, name="triton_fused_moe_nvfp4",
                      supports=make_supports(device_type, capability), priority=PRIORITY,
                      note="Triton W4A16: fused_moe's grouped GEMMs with each weight tile decoded from its e2m1 codes "
                      "and e4m3 block scales (not tuned, not yet run on a GPU)")
