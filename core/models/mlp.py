"""Feed-forward blocks: the gated SiLU MLP and the sparse mixture of experts (Mixtral, Qwen2/3-MoE)."""

from __future__ import annotations

import torch

from engine.core.ops.activation import silu_and_mul
from engine.core.ops.registry import CallSite

from .config import ModelConfig
from .experts import Experts
from .layers import Linear, stack_rows


class GatedMLP:
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, gate, up, down):
        stacked = stack_rows(gate, up)  # one [2I, H] GEMM for gate and up where they can share one
        self.gate_up = [Linear(stacked)] if stacked is not None else [Linear(gate), Linear(up)]
        self.down = Linear(down)
        self.act = CallSite(silu_and_mul)

    def __call__(self, key, x: torch.Tensor) -> torch.Tensor:
        """``key``: the step's shape key (see CallSite)."""
        if len(self.gate_up) == 1:
            gu = self.gate_up[0](key, x)
        else:  # mixed quantization types: two GEMMs
            gu = torch.cat([lin(key, x) for lin in self.gate_up], dim=-1)
        return self.down(key, self.act(key, gu))


class SparseMoE:
    """Top-k routed experts (fused_moe), plus Qwen2-MoE's sigmoid-gated shared expert when present."""

    def __init__(self, cfg: ModelConfig, w: dict, prefix: str):
        mixtral = prefix + "block_sparse_moe.gate.weight" in w
        base = prefix + ("block_sparse_moe." if mixtral else "mlp.")
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        self.experts = Experts([[w[f"{base}experts.{e}.{n}.weight"] for n in names] for e in range(cfg.num_experts)])
        self.router = Linear(w[base + "gate.weight"])
        self.top_k = cfg.num_experts_per_tok
        self.renormalize = True if mixtral else cfg.norm_topk_prob
        self.shared = None
        if base + "shared_expert.gate_proj.weight" in w:
            s = base + "shared_expert."
            self.shared = GatedMLP(w[s + "gate_proj.weight"], w[s + "up_proj.weight"], w[s + "down_proj.weight"])
            self.shared_gate = Linear(w[base + "shared_expert_gate.weight"])

    def __call__(self, key, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(key, x, self.router(key, x), self.top_k, self.renormalize)
        if self.shared is not None:
            out = out + torch.sigmoid(self.shared_gate(key, x)) * self.shared(key, x)
        return out
