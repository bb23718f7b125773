"""The int8_linear op (core/ops/int8.py): its reference against a plain dequantize-and-matmul and its checks; GGUF Q8_0
blocks and INT8 weights turning into each other exactly (models.weights), 8-bit matrices stacking, and the load-time
choice of form by the active platform (models.weights.native_int4)."""

from __future__ import annotations

import pytest
import torch

from engine.core.models.layers import stack_rows
from engine.core.models.weights import (
    Int8Weight,
    QuantizedWeight,
    dense_weight,
    gguf_as_int8,
    int8_as_gguf,
    native_int4,
)
from engine.core.ops.gguf_quant import Q4_0, Q8_0, gguf_dequantize
from engine.core.ops.int8 import _int8_linear_inputs, _int8_linear_ref


def _weight(n, k, group, zero, seed, sdt=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    _, codes, scale, z, g, _ = _int8_linear_inputs({"m": 1, "n": n, "k": k, "group": group, "zero": zero,
                                                    "sdt": sdt}, torch.float32, "cpu", gen)
    return Int8Weight(codes, scale, z, g)


def _random_q8_0(rows: int, cols: int, seed: int) -> QuantizedWeight:
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows, cols // 32, 34), generator=gen, dtype=torch.uint8)
    d = (torch.randn(rows, cols // 32, generator=gen) * 0.01).half()
    blocks[..., :2] = d[..., None].view(torch.uint8)
    return QuantizedWeight(blocks.reshape(rows, -1), Q8_0, rows, cols)


@pytest.mark.parametrize("group", [32, 64, 128, 96])
@pytest.mark.parametrize("zero", [False, True])
def test_reference_is_dequantize_then_matmul(group, zero, seed):
    w = _weight(24, 192 if group != 96 else 96, group, zero, seed)
    x = torch.randn(5, w.shape[1], generator=torch.Generator().manual_seed(seed + 1))
    cols = torch.arange(w.shape[1]) // group
    zeros = torch.full(w.shape, 128.0) if w.zero is None else w.zero.float()[:, cols]
    want = x @ ((w.codes.float() - zeros) * w.scale.float()[:, cols]).t()
    torch.testing.assert_close(_int8_linear_ref(x, w.codes, w.scale, w.zero, group, None), want)


@pytest.mark.parametrize("bad,match", [({"group": 48}, "multiples of 32"), ({"codes": torch.int8}, "w_codes"),
                                       ({"k": 96}, "K="), ({"zero_dtype": torch.int32}, "w_zero")])
def test_checks_name_what_is_wrong(bad, match, seed):
    w = _weight(8, 128, 64, True, seed)
    x = torch.randn(2, bad.get("k", 128))
    codes = w.codes.to(bad["codes"]) if "codes" in bad else w.codes
    zero = w.zero.to(bad["zero_dtype"]) if "zero_dtype" in bad else w.zero
    with pytest.raises((TypeError, ValueError), match=match):
        _int8_linear_ref(x, codes, w.scale, zero, bad.get("group", 64), None)


@pytest.mark.parametrize("shape", [(8, 32), (24, 256), (5, 96)])
def test_gguf_q8_0_is_an_int8_weight_exactly(shape, seed):
    q = _random_q8_0(*shape, seed)
    w = gguf_as_int8(q)
    assert w.shape == shape and w.group_size == 32 and w.zero is None and w.scale.dtype == torch.float16
    assert torch.equal(dense_weight(w, torch.float32), gguf_dequantize.reference(q.raw, Q8_0, q.cols, torch.float32))
    assert torch.equal(int8_as_gguf(w).raw, q.raw)  # and back to the same bytes


def test_symmetric_int8_becomes_q8_0_and_asymmetric_is_refused(seed):
    w = _weight(16, 256, 128, False, seed)
    g = int8_as_gguf(w)
    assert g.qtype == Q8_0 and g.shape == w.shape
    assert torch.equal(gguf_dequantize.reference(g.raw, Q8_0, g.cols, torch.float32), dense_weight(w, torch.float32))
    with pytest.raises(ValueError, match="zero points"):
        int8_as_gguf(_weight(16, 256, 128, True, seed))
    with pytest.raises(ValueError, match="only GGUF Q8_0"):
        gguf_as_int8(QuantizedWeight(torch.zeros(4, 18, dtype=torch.uint8), Q4_0, 4, 32))


def test_stack_writes_out_symmetric_zero_points(seed):
    a, b = _weight(8, 64, 32, True, seed), _weight(4, 64, 32, False, seed + 1)
    s = stack_rows(a, b)
    assert isinstance(s, Int8Weight) and s.shape == (12, 64)
    assert torch.equal(s.zero[8:], torch.full((4, 2), 128, dtype=torch.uint8))
    torch.testing.assert_close(dense_weight(s, torch.float32),
                               torch.cat([dense_weight(a, torch.float32), dense_weight(b, torch.float32)]))
    assert stack_rows(a, _weight(8, 64, 64, True, seed)) is None  # group sizes differ


def test_native_form_follows_the_platform(seed):
    """cpu (no int8_linear kernel): INT8 weights become Q8_0 blocks, an asymmetric one is refused by name; a platform
    with the kernel (cpu + the Triton kernels under the interpreter) reads Q8_0 linears as INT8 groups of 32."""
    from engine.core import plugins
    from tests.core.loader.test_hf_int4 import CpuWithTritonInt4

    plugins.activate("cpu")
    out = native_int4({"a.weight": _weight(8, 64, 32, False, seed), "norm": torch.ones(3)})
    assert isinstance(out["a.weight"], QuantizedWeight) and out["a.weight"].qtype == Q8_0
    with pytest.raises(ValueError, match="b.weight: .*zero points"):
        native_int4({"b.weight": _weight(8, 64, 32, True, seed)})
    plugins.activate(CpuWithTritonInt4())
    try:
        q = _random_q8_0(8, 64, seed)
        names = ["model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight",
                 "model.layers.0.mlp.experts.1.down_proj.weight"]
        out = native_int4(dict.fromkeys(names, q))
        assert [type(out[n]) for n in names] == [Int8Weight, QuantizedWeight, QuantizedWeight]
        asym = _weight(8, 64, 32, True, seed)
        assert native_int4({"c.weight": asym})["c.weight"] is asym
    finally:
        plugins.activate("cpu")
