"""The int4_linear op (core/ops/int4.py): its reference against a plain dequantize-and-matmul, its checks, and the
GGUF form of an INT4 weight (models.weights.int4_as_gguf) decoding to the same matrix."""

from __future__ import annotations

import pytest
import torch

from engine.core.models.layers import stack_int4
from engine.core.models.weights import (
    Int4Weight,
    QuantizedWeight,
    dense_weight,
    gguf_as_int4,
    int4_as_gguf,
    native_int4,
)
from engine.core.ops.gguf_quant import Q4_0, Q4_1, gguf_dequantize
from engine.core.ops.int4 import _int4_linear_inputs, _int4_linear_ref, pack_codes
from engine.core.ops.nvfp4 import unpack as unpack_codes


def _weight(n, k, group, zero, seed, sdt=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    _, packed, scale, z, g, _ = _int4_linear_inputs({"m": 1, "n": n, "k": k, "group": group, "zero": zero,
                                                     "sdt": sdt}, torch.float32, "cpu", gen)
    return Int4Weight(packed, scale, z, g)


@pytest.mark.parametrize("group", [32, 64, 128, 96])
@pytest.mark.parametrize("zero", [False, True])
def test_reference_is_dequantize_then_matmul(group, zero, seed):
    w = _weight(24, 192 if group != 96 else 96, group, zero, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(5, w.shape[1], generator=gen)
    codes = unpack_codes(w.packed).float()
    cols = torch.arange(w.shape[1]) // group
    zeros = torch.full_like(codes, 8.0) if w.zero is None else w.zero.float()[:, cols]
    want = x @ ((codes - zeros) * w.scale.float()[:, cols]).t()
    torch.testing.assert_close(_int4_linear_ref(x, w.packed, w.scale, w.zero, group, None), want)


def test_pack_round_trips(seed):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (7, 64), generator=gen, dtype=torch.uint8)
    assert torch.equal(unpack_codes(pack_codes(codes)), codes)
    assert pack_codes(codes.t().contiguous().t()).is_contiguous()


@pytest.mark.parametrize("zero", [False, True])
def test_gguf_form_decodes_to_the_same_matrix(zero, seed):
    w = _weight(16, 256, 128, zero, seed)
    g = int4_as_gguf(w)
    assert g.qtype == (Q4_1 if zero else Q4_0) and g.shape == w.shape
    got = gguf_dequantize.reference(g.raw, g.qtype, g.cols, torch.float32)
    want = dense_weight(w, torch.float32)
    if zero:  # Q4_1's offset m = -z * s is rounded to fp16
        torch.testing.assert_close(got, want, atol=2e-3 * want.abs().amax().item(), rtol=0)
    else:
        assert torch.equal(got, want)


def test_gguf_form_refuses_bf16_scales_outside_fp16(seed):
    w = _weight(8, 64, 32, False, seed, sdt=torch.bfloat16)
    w.scale[0, 0] = 1e30
    with pytest.raises(ValueError, match="fp16's normal range"):
        int4_as_gguf(w)


def test_stack_writes_out_symmetric_zero_points(seed):
    a, b = _weight(8, 64, 32, True, seed), _weight(4, 64, 32, False, seed + 1)
    s = stack_int4([a, b])
    assert s.shape == (12, 64) and torch.equal(s.zero[8:], torch.full((4, 2), 8, dtype=torch.uint8))
    torch.testing.assert_close(dense_weight(s, torch.float32),
                               torch.cat([dense_weight(a, torch.float32), dense_weight(b, torch.float32)]))
    assert stack_int4([a, _weight(8, 64, 64, True, seed)]) is None  # group sizes differ


@pytest.mark.parametrize("bad,match", [({"group": 48}, "multiples of 32"), ({"k": 80}, "multiples of 32"),
                                       ({"scale_shape": (8, 3)}, "w_scale"), ({"zero_dtype": torch.int32}, "w_zero")])
def test_checks_name_what_is_wrong(bad, match, seed):
    w = _weight(8, 128, 64, True, seed)
    x = torch.randn(2, bad.get("k", 128))
    scale = torch.ones(bad["scale_shape"], dtype=torch.float16) if "scale_shape" in bad else w.scale
    zero = w.zero.to(bad["zero_dtype"]) if "zero_dtype" in bad else w.zero
    packed = torch.zeros((8, 40), dtype=torch.uint8) if "k" in bad else w.packed
    with pytest.raises((TypeError, ValueError), match=match):
        _int4_linear_ref(x, packed, scale, zero, bad.get("group", 64), None)


def test_native_int4_names_the_matrix_it_cannot_convert(seed):
    """On the CPU platform (no int4_linear kernel) every Int4Weight becomes GGUF blocks at load; one whose bf16 scales
    fp16 cannot hold is refused with its name and the way out."""
    from engine.core import plugins

    plugins.activate("cpu")
    good, bad = _weight(8, 64, 32, True, seed), _weight(8, 64, 32, False, seed, sdt=torch.bfloat16)
    out = native_int4({"a.weight": good, "norm": torch.ones(3)})
    assert isinstance(out["a.weight"], QuantizedWeight) and torch.equal(out["norm"], torch.ones(3))
    bad.scale[0, 0] = 1e30
    with pytest.raises(ValueError, match="b.weight: .*int4_linear .*kernel"):
        native_int4({"b.weight": bad})


def _random_q4_0(rows: int, cols: int, seed: int) -> QuantizedWeight:
    """GGUF Q4_0 blocks with random codes and random fp16 scales of both signs (every one finite)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows, cols // 32, 18), generator=gen, dtype=torch.uint8)
    d = (torch.randn(rows, cols // 32, generator=gen) * 0.02).half()
    blocks[..., :2] = d[..., None].view(torch.uint8)
    return QuantizedWeight(blocks.reshape(rows, -1), Q4_0, rows, cols)


@pytest.mark.parametrize("shape", [(8, 32), (24, 256), (5, 96)])
def test_gguf_q4_0_is_an_int4_weight_exactly(shape, seed):
    q = _random_q4_0(*shape, seed)
    w = gguf_as_int4(q)
    assert w.shape == shape and w.group_size == 32 and w.zero is None and w.scale.dtype == torch.float16
    assert torch.equal(dense_weight(w, torch.float32), gguf_dequantize.reference(q.raw, Q4_0, q.cols, torch.float32))
    assert torch.equal(int4_as_gguf(w).raw, q.raw)  # and back to the same bytes


def test_only_q4_0_becomes_int4(seed):
    w = int4_as_gguf(_weight(8, 64, 32, True, seed))
    assert w.qtype == Q4_1
    with pytest.raises(ValueError, match="only GGUF Q4_0"):
        gguf_as_int4(w)


def test_native_int4_keeps_q4_0_linears_as_int4_where_the_platform_has_the_kernel(seed):
    """A platform with an int4_linear kernel reads each Q4_0 matrix a Linear multiplies by as INT4 groups of 32; the
    token embedding, MoE experts, other block types and Q8-activation models keep their GGUF blocks."""
    from engine.core import plugins
    from tests.core.loader.test_hf_int4 import CpuWithTritonInt4

    plugins.activate(CpuWithTritonInt4())
    try:
        q = _random_q4_0(8, 64, seed)
        q41 = int4_as_gguf(_weight(8, 64, 32, True, seed))
        names = ["model.layers.0.mlp.down_proj.weight", "lm_head.weight", "model.embed_tokens.weight",
                 "model.layers.0.mlp.experts.3.up_proj.weight", "model.layers.0.self_attn.q_proj.weight"]
        ws = dict(zip(names, [q, q, q, q, q41], strict=True))
        out = native_int4(ws)
        assert [type(out[n]) for n in names] == [Int4Weight, Int4Weight, QuantizedWeight, QuantizedWeight,
                                                 QuantizedWeight]
        assert native_int4(ws, quantize_activations=True) == ws
    finally:
        plugins.activate("cpu")
