"""GGUF linear with activations quantized on the fly to Q8 blocks (llama.cpp's CPU arithmetic).

``gguf_linear_q8act(x, raw, qtype, cols)`` computes ``y = q8(x) @ dequant(raw)^T`` where ``q8`` rounds each
row of x, in blocks of 32 along ``cols``, to int8 with one fp32 scale per block, exactly as
:func:`quantize_q8_blocks` does. Integer dot products then do the work (VNNI, dotprod), and the result
differs from :func:`~engine.core.ops.gguf_quant.gguf_linear` by the rounding of x: about 0.4% of a block's
largest value per element, i.e. a relative error of order 1e-3 on the outputs of a typical layer. Because
the quantization is specified to the bit, implementations agree with the reference up to the order of the
fp32 sums, and the op keeps a tight tolerance. Models use it only when asked to or when the platform has a
kernel for it (see ``DecoderModel``'s ``activation_quant``).
"""

from __future__ import annotations

import torch

from .gguf_quant import (
    BLOCK,
    GGUF_QTYPES,
    LINEAR_CASES,
    Q8_0,
    _gguf_dequantize_ref,
    _linear_inputs,
    check_linear_x,
    draw_linear,
    qtype_name,
)
from .precision import acc
from .registry import Case, OpDef, Tolerance


def quantize_q8_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8 blocks of x [..., K] (K a multiple of 32): returns (q int8 [..., K], d fp32 [..., K/32]).

    Per block of 32: ``d = max|x| / 127`` and ``q = round_half_even(x * (1/d))`` (q = 0 where d = 0), each step
    one fp32 operation (x is widened to fp32 first, exactly for bf16/fp16), so the codes are reproducible to
    the bit by any implementation that performs the same operations."""
    if x.shape[-1] % BLOCK:
        raise ValueError(f"Q8 blocks need a last dimension that is a multiple of {BLOCK}, got {x.shape[-1]}")
    blocks = acc(x).reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    d = blocks.abs().amax(dim=-1) / 127
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv[..., None]).clamp_(-127, 127).to(torch.int8)
    return q.reshape(x.shape), d


def q8_round(x: torch.Tensor) -> torch.Tensor:
    """x as the op sees it: rounded to Q8 blocks (:func:`quantize_q8_blocks`) and back, fp32 q * d."""
    q, d = quantize_q8_blocks(x)
    return (q.float().reshape(*d.shape, BLOCK) * d[..., None]).reshape(x.shape)


def _gguf_linear_q8act_ref(x: torch.Tensor, raw: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    check_linear_x("gguf_linear_q8act", x, cols)
    if qtype not in GGUF_QTYPES:
        raise ValueError(f"gguf_linear_q8act takes Q4_0, Q4_1 and Q8_0 weights, not {qtype_name(qtype)}; "
                         "run K-quant weights through gguf_linear (activations unquantized)")
    w = _gguf_dequantize_ref(raw, qtype, cols, torch.float32)
    xq = q8_round(x)
    return (xq @ w.t().to(xq.dtype)).to(x.dtype)


def _gguf_linear_q8act_fake(x, raw, qtype, cols):
    return x.new_empty((*x.shape[:-1], raw.shape[0]))


gguf_linear_q8act = OpDef(
    name="gguf_linear_q8act",
    quantizes_intermediates=True,
    schema="(Tensor x, Tensor raw, int qtype, int cols) -> Tensor",
    reference=_gguf_linear_q8act_ref,
    fake=_gguf_linear_q8act_fake,
    make_inputs=_linear_inputs,
    draw=lambda rng, budget: draw_linear(rng, budget, kquants=False),
    cases=[*(c for c in LINEAR_CASES if c.params["qtype"] in GGUF_QTYPES),
           Case("q8_0_one_block", {"qtype": Q8_0, "m": 2, "n": 9, "k": 32})],
    # fp32: the same codes and scales as the reference, so only the order of the fp32 sums differs.
    tolerances={torch.float32: Tolerance(1e-4, 1e-4), torch.bfloat16: Tolerance(5e-2, 2e-2)},
    doc="y = q8(x) @ dequant(raw)^T: x [..., cols] rounded to Q8 blocks (quantize_q8_blocks), raw GGUF "
        "[N, row_bytes] -> [..., N] in x.dtype, fp32 accumulation of exact integer block dots.",
)
