"""A MoE layer's routed experts as one stacked set of weights, run by ``fused_moe``; by ``fused_moe_fp8`` for experts
kept in FP8 (W8A8 checkpoints with per-tensor or per-channel weight scales and dynamic per-token activations, or
128x128 blocks); by ``fused_moe_gguf`` for experts kept as GGUF blocks (INT4 GPTQ / AWQ / compressed-tensors
checkpoints, repacked to Q4_0 / Q4_1 at load); by ``fused_moe_nvfp4`` for ModelOpt NVFP4 experts (W4A16)."""

from __future__ import annotations

import torch

from engine.core.ops.fp8 import BLOCK_K
from engine.core.ops.moe import fused_moe
from engine.core.ops.moe_fp8 import fused_moe_fp8
from engine.core.ops.moe_gguf import fused_moe_gguf
from engine.core.ops.moe_nvfp4 import fused_moe_nvfp4
from engine.core.ops.registry import CallSite

from .weights import Fp8Weight, Nvfp4Weight, QuantizedWeight, Weight


def _block_scales(w: Fp8Weight) -> torch.Tensor:
    return w.scale


def _row_scales(w: Fp8Weight) -> torch.Tensor:
    """The weight's scale as one fp32 scale per output row, [rows, 1] (a per-tensor scale repeated)."""
    return w.scale.float().reshape(-1, 1).expand(w.q.shape[0], 1)


class Experts:
    """``experts[e] = [gate, up, down]`` weights; ``__call__(key, x, router_logits, top_k, renormalize)``."""

    def __init__(self, experts: list[list[Weight]]):
        flat = [t for ex in experts for t in ex]
        self.fp8 = all(isinstance(t, Fp8Weight) for t in flat)
        self.gguf = all(isinstance(t, QuantizedWeight) for t in flat)
        self.nvfp4 = all(isinstance(t, Nvfp4Weight) for t in flat)
        if self.gguf:
            self._stack_gguf(experts)
        elif self.nvfp4:
            self._stack_nvfp4(experts)
        elif self.fp8:
            blocks = all(t.granularity == "block" and t.act_group == BLOCK_K and t.input_scale is None
                         and not any(d % BLOCK_K for d in t.shape) for t in flat)
            if not blocks and any(t.granularity == "block" or t.input_scale is not None or t.act_group for t in flat):
                raise ValueError("FP8 experts run with per-tensor or per-channel weight scales and dynamic per-token "
                                 "activations, or all with whole 128x128 blocks and 1x128 activation groups; the "
                                 "loader dequantizes others")
            # block scales stack as they are (gate's and up's blocks meet at row I, a multiple of 128)
            scales = _block_scales if blocks else _row_scales
            self.w13 = torch.stack([torch.cat([g.q, u.q]) for g, u, _ in experts])
            self.w13_scale = torch.stack([torch.cat([scales(g), scales(u)]) for g, u, _ in experts])
            self.w2 = torch.stack([d.q for _, _, d in experts])
            self.w2_scale = torch.stack([scales(d) for _, _, d in experts])
            self.site = CallSite(fused_moe_fp8)
        elif all(isinstance(t, torch.Tensor) for t in flat):
            self.w13 = torch.stack([torch.cat([g, u]) for g, u, _ in experts])
            self.w2 = torch.stack([d for _, _, d in experts])
            self.site = CallSite(fused_moe)
        else:
            kinds = sorted({type(t).__name__ for t in flat})
            raise ValueError(f"MoE experts of these weight kinds are not supported: {kinds}; load the model with "
                             "dequantize=True")

    def _stack_gguf(self, experts: list[list[QuantizedWeight]]) -> None:
        """w13 [E, 2I, row bytes] (gate rows then up rows) and w2 [E, hidden, row bytes], each of one GGUF type."""
        types13 = {t.qtype for g, u, _ in experts for t in (g, u)}
        types2 = {d.qtype for _, _, d in experts}
        if len(types13) != 1 or len(types2) != 1:
            raise ValueError(f"GGUF experts need one type for every gate and up projection and one for every down "
                             f"projection, got {sorted(types13)} and {sorted(types2)}; load the model with "
                             "dequantize=True")
        self.w13_qtype, self.w2_qtype = types13.pop(), types2.pop()
        self.w13 = torch.stack([torch.cat([g.raw, u.raw]) for g, u, _ in experts])
        self.w2 = torch.stack([d.raw for _, _, d in experts])
        self.site = CallSite(fused_moe_gguf)

    def _stack_nvfp4(self, experts: list[list[Nvfp4Weight]]) -> None:
        """Codes and block scales stacked as [E, rows, ...]; each projection's global scale repeated over its rows
        ([E, 2I] for gate then up, [E, hidden]), since gate and up may be calibrated apart."""
        def rows(w: Nvfp4Weight) -> torch.Tensor:
            return w.global_scale.float().reshape(1).expand(w.packed.shape[0])

        self.w13 = torch.stack([torch.cat([g.packed, u.packed]) for g, u, _ in experts])
        self.w13_scale = torch.stack([torch.cat([g.block_scale, u.block_scale]) for g, u, _ in experts])
        self.w13_global = torch.stack([torch.cat([rows(g), rows(u)]) for g, u, _ in experts])
        self.w2 = torch.stack([d.packed for _, _, d in experts])
        self.w2_scale = torch.stack([d.block_scale for _, _, d in experts])
        self.w2_global = torch.stack([rows(d) for _, _, d in experts])
        self.site = CallSite(fused_moe_nvfp4)

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    def __call__(self, key, x: torch.Tensor, router_logits: torch.Tensor, top_k: int, renormalize: bool):
        if self.nvfp4:
            return self.site(key, x, self.w13, self.w13_scale, self.w13_global, self.w2, self.w2_scale,
                             self.w2_global, router_logits, top_k, renormalize)
        if self.gguf:
            return self.site(key, x, self.w13, self.w13_qtype, self.w2, self.w2_qtype, router_logits, top_k,
                             renormalize)
        if self.fp8:
            return self.site(key, x, self.w13, self.w13_scale, self.w2, self.w2_scale, router_logits, top_k,
                             renormalize)
        return self.site(key, x, self.w13, self.w2, router_logits, top_k, renormalize)
