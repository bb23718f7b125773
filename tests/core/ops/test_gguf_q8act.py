"""The Q8-activation reference: its quantizer against the rules it states, and the op against an independent
float64 computation (and within the quantization bound of the unquantized gguf_linear)."""

import pytest
import torch

from engine.core.ops.gguf_q8act import gguf_linear_q8act, quantize_q8_blocks
from engine.core.ops.gguf_quant import Q4_0, Q4_1, Q8_0, gguf_dequantize, gguf_linear, random_gguf_weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantizer_rules(dtype, gen):
    x = (torch.randn(3, 5, 64, generator=gen) * torch.rand(3, 5, 1, generator=gen) * 10).to(dtype)
    x[0, 0, :32] = 0  # a zero block
    q, d = quantize_q8_blocks(x)
    assert q.dtype == torch.int8 and q.shape == x.shape and d.shape == (3, 5, 2) and d.dtype == torch.float32
    xb, qb = x.float().reshape(3, 5, 2, 32), q.reshape(3, 5, 2, 32).float()
    assert torch.equal(d, xb.abs().amax(-1) / 127)
    assert (qb.abs() <= 127).all() and (qb[0, 0, 0] == 0).all() and d[0, 0, 0] == 0
    nonzero = d > 0
    assert (qb.abs().amax(-1)[nonzero] == 127).all()  # the largest magnitude maps to +-127
    # Each code is the nearest integer to x / d (within fp32 rounding of 1/d and the product).
    ratio = (xb.double() / d.double()[..., None]).nan_to_num(0)
    assert ((qb.double() - ratio).abs() <= 0.5 + 1e-4).all()


def test_quantizer_ties_round_to_even():
    # d = 127 / 127 = 1 exactly, so x * (1 / d) = x: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> -0, -1.5 -> -2.
    x = torch.zeros(32)
    x[0], x[1:6] = 127, torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5])
    q, d = quantize_q8_blocks(x)
    assert d.item() == 1.0 and q[:6].tolist() == [127, 0, 2, 2, 0, -2]


def test_quantizer_rejects_ragged_rows():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_blocks(torch.randn(2, 48))


@pytest.mark.parametrize("qtype", [Q4_0, Q4_1, Q8_0])
def test_reference_against_float64(qtype, gen):
    k, n = 576, 40
    raw = random_gguf_weight(n, k, qtype, "cpu", gen, scale=k ** -0.5)
    x = torch.randn(6, k, generator=gen)
    q, d = quantize_q8_blocks(x)
    xq = q.double().reshape(6, -1, 32) * d.double()[..., None]
    w = gguf_dequantize.reference(raw, qtype, k, torch.float32).double()
    exact = xq.reshape(6, k) @ w.t()
    got = gguf_linear_q8act.reference(x, raw, qtype, k).double()
    assert ((got - exact).abs() <= 1e-5 * (xq.reshape(6, k).abs() @ w.abs().t())).all()
    # Against the unquantized op: each element of x moved by at most d / 2.
    bound = (d.double() / 2).repeat_interleave(32, dim=-1) @ w.abs().t()
    unquantized = gguf_linear.reference(x, raw, qtype, k).double()
    assert ((got - unquantized).abs() <= bound * 1.001 + 1e-5).all()


def test_reference_input_errors(gen):
    raw = random_gguf_weight(3, 64, Q4_0, "cpu", gen)
    with pytest.raises(ValueError, match=r"\[\.\.\., 64\]"):
        gguf_linear_q8act.reference(torch.randn(2, 32), raw, Q4_0, 64)
    with pytest.raises(TypeError, match="floating-point"):
        gguf_linear_q8act.reference(torch.ones(2, 64, dtype=torch.int32), raw, Q4_0, 64)
