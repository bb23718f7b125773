"""gguf_dequantize / gguf_linear references vs the gguf package's numpy dequantizer (bit-exact in fp32)
and a float64 matmul; the input generator; fake shapes; the torch.ops path; errors."""


import gguf
import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from engine.core.ops.gguf_quant import (
    ALL_QTYPES,
    GGUF_QTYPES,
    Q4_0,
    Q4_1,
    Q4_K,
    Q8_0,
    gguf_dequantize,
    gguf_linear,
    quantize_gguf,
    random_gguf_weight,
)

QTYPES = [pytest.param(q, id=name) for q, (name, _) in GGUF_QTYPES.items()]
DEQ_PARAMS = [pytest.param(c, dt, id=f"{c.name}-{str(dt)[6:]}") for c in gguf_dequantize.cases
              for dt in gguf_dequantize.dtypes]
LIN_PARAMS = [pytest.param(c, dt, id=f"{c.name}-{str(dt)[6:]}") for c in gguf_linear.cases
              for dt in gguf_linear.dtypes]


def numpy_dequant(raw: torch.Tensor, qtype: int) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType(qtype)))


def test_qtype_values_match_gguf():
    for q, (name, block, block_bytes) in ALL_QTYPES.items():
        assert gguf.GGMLQuantizationType[name].value == q
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(q)] == (block, block_bytes)


@pytest.mark.parametrize("case,dtype", DEQ_PARAMS)
def test_dequantize_matches_gguf_numpy(case, dtype, gen):
    raw, qtype, cols, _ = gguf_dequantize.make_inputs(case.params, dtype, "cpu", gen)
    expected = numpy_dequant(raw, qtype)
    assert expected.shape == (case.params["rows"], cols)
    out = gguf_dequantize.reference(raw, qtype, cols, dtype)
    assert out.dtype == dtype and out.shape == expected.shape
    # fp32 is bit-exact; other dtypes are the exact fp32 value rounded once.
    assert torch.equal(out, expected.to(dtype))


@pytest.mark.parametrize("qtype", QTYPES)
def test_dequantize_recovers_the_weight(qtype, gen):
    # Quantization error is at most one step |d| per element (Q4_0 clips +8 to +7); a wrong nibble
    # order or a wrong offset is off by many steps.
    w = torch.randn(6, 128, generator=gen) * torch.rand(6, 1, generator=gen).add(0.5)
    raw = quantize_gguf(w, qtype)
    got = gguf_dequantize.reference(raw, qtype, 128, torch.float32)
    d = raw.view(6, 4, -1)[..., :2].contiguous().view(torch.float16).float()  # [6, 4, 1]
    err = (got - w).view(6, 4, 32).abs()
    amax = w.abs().view(6, 4, 32).amax(-1, keepdim=True)  # bounds the fp16 rounding of d and m
    assert (err <= d.abs() * 1.01 + amax * 1e-3).all()


@pytest.mark.parametrize("qtype", QTYPES)
def test_generator_gives_real_nonzero_blocks(qtype, gen):
    raw = random_gguf_weight(9, 96, qtype, "cpu", gen)
    name, bb = GGUF_QTYPES[qtype]
    assert raw.dtype == torch.uint8 and raw.shape == (9, 3 * bb)
    d = raw.view(9, 3, bb)[..., :2].contiguous().view(torch.float16).float()
    assert (d != 0).all() and torch.isfinite(d).all()
    assert numpy_dequant(raw, qtype).abs().amax(-1).min() > 0
    if qtype == Q4_1:  # the per-row offset makes m differ from -max|w| of a zero-mean row
        m = raw.view(9, 3, bb)[..., 2:4].contiguous().view(torch.float16).float()
        assert (m != 0).all()


@pytest.mark.parametrize("case,dtype", LIN_PARAMS)
def test_linear_matches_float64(case, dtype, gen):
    x, raw, qtype, cols = gguf_linear.make_inputs(case.params, dtype, "cpu", gen)
    w = numpy_dequant(raw, qtype).double()
    expected = x.double() @ w.T
    out = gguf_linear.reference(x, raw, qtype, cols)
    assert out.dtype == dtype and out.shape == (case.params["m"], case.params["n"])
    # The reference computes in fp32 and rounds the output once: fp32 noise, or half a bf16 step.
    atol, rtol = (1e-5, 1e-5) if dtype == torch.float32 else (1e-5, 2**-8)
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=rtol)


def test_linear_leading_dims(gen):
    raw = random_gguf_weight(12, 64, Q8_0, "cpu", gen)
    x = torch.randn(2, 3, 64, generator=gen)
    out = gguf_linear.reference(x, raw, Q8_0, 64)
    assert out.shape == (2, 3, 12)
    torch.testing.assert_close(out, gguf_linear.reference(x.view(6, 64), raw, Q8_0, 64).view(2, 3, 12))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_shapes(dtype):
    with FakeTensorMode():
        raw = torch.empty(40, 3 * 20, dtype=torch.uint8)
        w = gguf_dequantize.torch_op(raw, Q4_1, 96, dtype)
        y = gguf_linear.torch_op(torch.empty(5, 96, dtype=dtype), raw, Q4_1, 96)
    assert w.shape == (40, 96) and w.dtype == dtype
    assert y.shape == (5, 40) and y.dtype == dtype


def test_torch_op_matches_call(gen):
    raw, qtype, cols, dtype = gguf_dequantize.make_inputs(gguf_dequantize.cases[1].params, torch.bfloat16,
                                                          "cpu", gen)
    assert torch.equal(torch.ops.engine.gguf_dequantize(raw, qtype, cols, dtype),
                       gguf_dequantize(raw, qtype, cols, dtype))
    x, raw, qtype, cols = gguf_linear.make_inputs(gguf_linear.cases[1].params, torch.float32, "cpu", gen)
    via_torch = torch.ops.engine.gguf_linear(x, raw, qtype, cols)
    torch.testing.assert_close(via_torch, gguf_linear(x, raw, qtype, cols), atol=0, rtol=0)


def test_bad_inputs():
    raw = torch.zeros(4, 36, dtype=torch.uint8)  # 2 blocks of Q4_0
    with pytest.raises(ValueError, match="Q4_0=2, Q4_1=3, Q8_0=8"):
        gguf_dequantize.reference(raw, 6, 64, torch.float32)  # Q5_0 is not supported
    with pytest.raises(ValueError, match="multiple of 32"):
        gguf_dequantize.reference(raw, Q4_0, 48, torch.float32)
    with pytest.raises(ValueError, match=r"\[N, 40\]"):
        gguf_dequantize.reference(raw, Q4_1, 64, torch.float32)  # 36 bytes is not 2 Q4_1 blocks
    with pytest.raises(TypeError, match="uint8"):
        gguf_dequantize.reference(raw.view(torch.int8), Q4_0, 64, torch.float32)
    with pytest.raises(ValueError, match="Q4_0=2, Q4_1=3, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14"):
        gguf_dequantize(raw, 7, 64, torch.float32)  # through dispatch (Q5_1): every implementation declines
    with pytest.raises(ValueError, match="multiple of 256 for Q4_K"):
        gguf_dequantize.reference(raw, Q4_K, 64, torch.float32)
    with pytest.raises(ValueError, match=r"\[\.\.\., 64\]"):
        gguf_linear.reference(torch.randn(3, 32), raw, Q4_0, 64)
    with pytest.raises(TypeError, match="floating"):
        gguf_linear.reference(torch.ones(3, 64, dtype=torch.int32), raw, Q4_0, 64)


def test_quantize_rejects_unsupported():
    with pytest.raises(ValueError, match="Q8_0"):
        quantize_gguf(torch.randn(2, 64), 12)
    assert quantize_gguf(torch.randn(2, 64), Q4_0).shape == (2, 36)
    assert np.dtype("uint8") == quantize_gguf(torch.randn(1, 32), Q8_0).numpy().dtype
