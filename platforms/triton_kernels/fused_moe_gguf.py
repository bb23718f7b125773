"""``fused_moe_gguf`` in Triton: fused_moe.py's pipeline (routing and expert alignment on the device, two grouped
GEMMs, SiLU-and-mul fused into the first) with the expert weights read as raw GGUF rows: each B tile is decoded from
its blocks in registers (gguf_values.py) and rounded to x's dtype for the tensor cores. Nothing is read back to the
host, so a call is CUDA-graph capturable. Every GGUF type the op takes (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K).

Not tuned: the tiles are fused_moe's for bf16 weights, and the byte-wise decode is not the wide-load GEMV of
gguf_linear.py; interpreter-tested, not yet run on a GPU.
"""

from __future__ import annotations

import torch

from engine.core.ops.moe_gguf import fused_moe_gguf, moe_gguf_problem

from .fused_moe import _DTYPES, _LOGIT_DTYPES, _MAX_EXPERTS, _MAX_TOP_K, PRIORITY, MoeConfig, _forward


def triton_fused_moe_gguf(x, w13, w13_qtype, w2, w2_qtype, router_logits, top_k, renormalize, *,
                          config: MoeConfig | None = None):
    """``fused_moe_gguf``. ``config`` overrides the tile heuristics (tests, tuning)."""
    return _forward(x, w13.contiguous(), w2.contiguous(), router_logits, top_k, renormalize, w13_qtype=w13_qtype,
                    w2_qtype=w2_qtype, config=config)


def make_supports(device_type: str, capability: tuple[int, int] | None = None):
    def supports(x, w13, w13_qtype, w2, w2_qtype, router_logits, top_k, renormalize):
        problem = moe_gguf_problem(x, w13, w13_qtype, w2, w2_qtype, router_logits, top_k)
        if problem:
            return problem
        if any(t.device.type != device_type for t in (x, w13, w2, router_logits)):
            return f"tensors must be on the {device_type} device"
        if x.dtype not in _DTYPES:
            return f"x dtype {x.dtype}: need fp32, bf16 or fp16"
        if router_logits.dtype not in _LOGIT_DTYPES:
            return f"router_logits dtype {router_logits.dtype}: need fp32, bf16, fp16 or fp64"
        if w13.shape[0] > _MAX_EXPERTS or top_k > _MAX_TOP_K:
            return f"{w13.shape[0]} experts, top_k {top_k}: at most {_MAX_EXPERTS} experts and top_k {_MAX_TOP_K}"
        if capability is not None and tuple(capability) < (8, 0) and x.dtype == torch.bfloat16:
            return f"bf16 tl.dot needs compute capability >= 8.0, this device has {tuple(capability)}"
        return True

    return supports


def register(registry, device_type: str, capability: tuple[int, int] | None = None) -> None:
    registry.register(fused_moe_gguf, triton_fused_moe_gguf, name="triton_fused_moe_gguf",
                      supports=make_supports(device_type, capability), priority=PRIORITY,
                      note="Triton: fused_moe's grouped GEMMs with each weight tile decoded from its GGUF blocks "
                      "(not tuned, not yet run on a GPU)")
