"""``fused_moe_gguf`` in Triton: fused_moe.py's pipeline (routing and expert alignment on the device, two grouped
GEMMs, SiLU-and-mul fused into the first) with the expert weights read as raw GGUF rows: each B tile is decoded from
its blocks in registers (gguf_values.py) and rounded to x's dtype for the tensor cores. Nothing is read back to the
host, so a call is CUDA-graph capturable. Every GGUF type the op takes (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K).

Not tuned: the tiles are fused_moe's for bf16 weights, and the byte-wise decode is not the wide-load GEMV of
gguf_linear.py; interpreter-tested, not yet run on a GPU.
"""

from __future__ import annotations

from engine.core.ops.moe_gguf import fused_moe_gguf, moe_gguf_problem

from .fused_moe import PRIORITY, MoeConfig, _forward, quantized_experts_verdict


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
        return quantized_experts_verdict(device_type, capability, x, (x, w13, w2, router_logits), router_logits,
                                         w13.shape[0], top_k)

    return supports


def register(registry, device_type: str, capability: tuple[int, int] | None = None) -> None:
    registry.register(fused_moe_gguf, triton_fused_moe_gguf, name="triton_fused_moe_gguf",
                      supports=make_supports(device_type, capability), priority=PRIORITY,
                      note="Triton: fused_moe's grouped GEMMs with each weight tile decoded from its GGUF blocks "
                      "(not tuned, not yet run on a GPU)")
