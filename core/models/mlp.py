"""Feed-forward blocks: the gated SiLU MLP and the sparse mixture of experts (Mixtral, Qwen2/3-MoE)."""

from __future__ import annotations

import torch

from engine.core.ops.activation import silu_and_mul
from engine.core.ops.moe import fused_moe

from .config import ModelConfig
from .layers import linear, stack_rows
from .weights import QuantizedWeight


class GatedMLP:
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, gate, up, down):
        self.gate_up = _stack_rows(gate, up)
        self.down = down

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gu = _linear_pair(x, self.gate_up) if isinstance(self.gate_up, _Pair) else linear(x, self.gate_up)
        return linear(silu_and_mul(gu), self.down)


def _stack_rows(a, b):
    """One [2I, H] matrix for gate and up, so the two projections are one GEMM."""
    stacked = stack_rows(a, b)
    return _Pair(a, b) if stacked is None else stacked


class _Pair:
    """Gate and up kept apart (mixed quantization types); ``linear`` on it is two GEMMs."""

    def __init__(self, a, b):
        self.a, self.b = a, b


def _linear_pair(x, w):
    return torch.cat([linear(x, w.a), linear(x, w.b)], dim=-1)


class SparseMoE:
    """Top-k routed experts (fused_moe), plus Qwen2-MoE's sigmoid-gated shared expert when present."""

    def __init__(self, cfg: ModelConfig, w: dict, prefix: str):
        mixtral = prefix + "block_sparse_moe.gate.weight" in w
        base = prefix + ("block_sparse_moe." if mixtral else "mlp.")
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        experts = [[w[f"{base}experts.{e}.{n}.weight"] for n in names] for e in range(cfg.num_experts)]
        if any(isinstance(t, QuantizedWeight) for ex in experts for t in ex):
            raise ValueError("quantized MoE experts are not supported yet; load the model with dequantize=True")
        self.router = w[base + "gate.weight"]
        self.w13 = torch.stack([torch.cat([g, u]) for g, u, _ in experts])
        self.w2 = torch.stack([d for _, _, d in experts])
        self.top_k = cfg.num_experts_per_tok
        self.renormalize = True if mixtral else cfg.norm_topk_prob
        self.shared = None
        if base + "shared_expert.gate_proj.weight" in w:
            s = base + "shared_expert."
            self.shared = GatedMLP(w[s + "gate_proj.weight"], w[s + "up_proj.weight"], w[s + "down_proj.weight"])
            self.shared_gate = w[base + "shared_expert_gate.weight"]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = fused_moe(x, self.w13, self.w2, linear(x, self.router), self.top_k, self.renormalize)
        if self.shared is not None:
            out = out + torch.sigmoid(linear(x, self.shared_gate)) * self.shared(x)
        return out
