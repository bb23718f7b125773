"""DeepSeek-V2/V3's mixture of experts: router scores (V3 sigmoid, V2 softmax), experts chosen within the best
expert groups (V3: a learned per-expert bias steers the choice but not the weights), weights (V3: renormalized)
scaled by routed_scaling_factor, plus always-on shared experts.

The routing runs here; the experts run on the platform's ``fused_moe`` (or ``fused_moe_fp8``) kernel, which
routes by softmax over logits and renormalizes the top k: handing it ``log(weight)`` for the chosen experts and a
far lower logit for the rest makes it weight the chosen ones by ``weight / sum(weights)``, and multiplying its
output by ``sum(weights)`` per token restores the weights exactly (up to rounding), with no second MoE kernel per
platform.
"""

from __future__ import annotations

import torch

from .config import ModelConfig
from .experts import Experts
from .layers import Linear
from .mlp import GatedMLP

_UNCHOSEN = -1.0e4  # below log(any weight) by far: exp() of the gap is 0 in fp32


def grouped_topk(router_logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, n_group: int, topk_group: int,
                 renormalize: bool, scaling: float, scoring: str = "sigmoid") -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, top_k] fp32, expert ids [T, top_k]) as DeepSeek routes. V3 (``scoring`` "sigmoid"): groups
    ranked by the sum of their two best biased scores, the top_k biased scores within the best ``topk_group``
    groups, weighted by unbiased scores. V2 ("softmax", no bias): groups ranked by their best score."""
    scores = router_logits.float().sigmoid() if scoring == "sigmoid" else router_logits.float().softmax(-1)
    choice = scores + bias.float() if bias is not None else scores
    t, e = choice.shape
    ranked_by = min(2 if scoring == "sigmoid" else 1, e // n_group)
    group_scores = choice.view(t, n_group, e // n_group).topk(ranked_by, dim=-1)[0].sum(-1)
    groups = group_scores.topk(topk_group, dim=-1, sorted=False)[1]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    choice = choice.masked_fill(~keep.repeat_interleave(e // n_group, dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scaling, ids


class DeepseekMoE:
    def __init__(self, cfg: ModelConfig, w: dict, prefix: str):
        base = prefix + "mlp."
        self.experts = Experts([[w[f"{base}experts.{e}.{n}_proj.weight"] for n in ("gate", "up", "down")]
                                for e in range(cfg.num_experts)])
        if cfg.num_experts % cfg.n_group or cfg.topk_group > cfg.n_group:
            raise ValueError(f"n_group {cfg.n_group} must divide n_routed_experts {cfg.num_experts} and be >= "
                             f"topk_group {cfg.topk_group}")
        self.router = Linear(w[base + "gate.weight"])
        self.bias = w.get(base + "gate.e_score_correction_bias")  # V3 only
        self.scoring = cfg.router_scoring
        self.top_k, self.n_group, self.topk_group = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
        self.renormalize, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor
        s = base + "shared_experts."
        self.shared = (GatedMLP(w[s + "gate_proj.weight"], w[s + "up_proj.weight"], w[s + "down_proj.weight"])
                       if s + "gate_proj.weight" in w else None)

    def __call__(self, key, x: torch.Tensor) -> torch.Tensor:
        weights, ids = grouped_topk(self.router(key, x), self.bias, self.top_k, self.n_group, self.topk_group,
                                    self.renormalize, self.scaling, self.scoring)
        total = weights.sum(-1, keepdim=True)
        logits = torch.full((x.shape[0], self.experts.num_experts), _UNCHOSEN, dtype=torch.float32, device=x.device)
        logits.scatter_(1, ids, (weights / total).clamp_min(1e-30).log())
        out = self.experts(key, x, logits, self.top_k, True) * total.to(x.dtype)
        if self.shared is not None:
            out = out + self.shared(key, x)
        return out
