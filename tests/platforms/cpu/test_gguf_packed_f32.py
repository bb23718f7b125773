"""The fp32-activation gguf_linear on the row-interleaved copy (csrc/gguf_packed_f32_impl.h): the native packed call
against gguf_linear's reference on fresh random inputs (every qtype x fp32 / bf16 x ISA this CPU runs x 1 and 2
threads, N around the 16-row group, K of 1..48 blocks, M = 1..64 around the tiles, strided x), the fp32 error bound on
long rows, the ISA gate, and the registered "fused" wrapper (one packed copy shared with gguf_linear_q8act, CPU
graphs, the raw-row kernel where the gate says no)."""

import pytest
import torch

from engine.core.ops.gguf_q8act import gguf_linear_q8act
from engine.core.ops.gguf_quant import Q4_0, Q4_1, Q8_0, gguf_dequantize, gguf_linear, random_gguf_weight
from engine.platforms.cpu import _native
from engine.platforms.cpu.graph import capture
from engine.platforms.cpu.kernels import gguf as gguf_kernels

from .test_gguf_packed import IDS, QTYPES, SHAPES, call_packed, check_op, pack


def packed_linear(x, raw, qtype, k, packed):
    return call_packed("gguf_linear_packed", x, raw, qtype, k, packed)


def check(got, x, raw, qtype, k):
    check_op(gguf_linear, got, x, raw, qtype, k)


def fused(registry):
    (impl,) = [i for i in registry.implementations(gguf_linear) if i.name == "fused"]
    return impl


@pytest.mark.parametrize("m", [1, 2, 5, 12, 13, 33, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("qtype", QTYPES, ids=IDS)
def test_packed_f32_matches_reference(qtype, dtype, m, isa, threads, gen):
    assert _native.gguf_packed_f32_variant(), f"no packed fp32 kernel for {isa}"
    for k, n in SHAPES:
        raw = random_gguf_weight(n, k, qtype, "cpu", gen, scale=k ** -0.5)
        x = torch.randn(m, k, generator=gen).to(dtype)
        check(packed_linear(x, raw, qtype, k, pack(raw, qtype, k)), x, raw, qtype, k)


@pytest.mark.parametrize("qtype", QTYPES, ids=IDS)
def test_packed_f32_strided_x_and_extreme_codes(qtype, isa, gen):
    # x rows further apart than k; codes at the ends of their ranges (Q8_0 -128 and 127, nibbles 0 and 15).
    k, n, m = 256, 19, 6
    raw = random_gguf_weight(n, k, qtype, "cpu", gen, scale=k ** -0.5)
    off = 4 if qtype == Q4_1 else 2
    blocks = raw.view(n, k // 32, -1)
    blocks[0, :, off:] = 0x80 if qtype == Q8_0 else 0x00
    blocks[1, :, off:] = 0x7F if qtype == Q8_0 else 0xFF
    x = torch.randn(m, k + 40, generator=gen)[:, :k]
    check(packed_linear(x, raw, qtype, k, pack(raw, qtype, k)), x, raw, qtype, k)


@pytest.mark.parametrize("m", [1, 13])
@pytest.mark.parametrize("qtype", QTYPES, ids=IDS)
def test_packed_f32_accuracy_long_rows(qtype, m, isa, gen):
    # As test_gguf_linear.py: error against the float64 result within 2e-6 of sum |x| |w| (per block
    # d * sum(q x) + m * sum(x) in fp32 rounds differently from the reference's sum of (q d + m) x).
    k = 4096
    raw = random_gguf_weight(9, k, qtype, "cpu", gen, scale=4.0)
    x = torch.randn(m, k, generator=gen) * 10
    w = gguf_dequantize.reference(raw, qtype, k, torch.float32).double()
    exact, scale = x.double() @ w.t(), x.double().abs() @ w.abs().t()
    err = (packed_linear(x, raw, qtype, k, pack(raw, qtype, k)).double() - exact).abs()
    assert (err <= 2e-6 * scale).all(), (err / scale).max()


def test_gate_follows_isa(isa):
    # The fp32 kernels need AVX-512F (no VNNI) on the avx512 ISA; they exist exactly where the Q8 packed ones do.
    want = {"avx512": "avx512", "avx2": "avx2", "scalar": "scalar"}.get(isa, "")
    assert _native.gguf_packed_f32_variant() == want
    assert bool(_native.gguf_packed_variant()) == bool(want)


def test_fused_wrapper_shares_the_packed_copy(isa, registry, gen, monkeypatch):
    impl = fused(registry)
    k, n = 96, 40
    raw = random_gguf_weight(n, k, Q4_1, "cpu", gen, scale=k ** -0.5)
    for shape in ((3, k), (1, k), (2, 2, k), (gguf_kernels.FUSED_MAX_M, k), (gguf_kernels.FUSED_MAX_M + 1, k)):
        x = torch.randn(*shape, generator=gen)
        got = impl.fn(x, raw, Q4_1, k)
        check(got.reshape(-1, n), x.reshape(-1, k), raw, Q4_1, k)
    xh = torch.randn(2, k, generator=gen).half()  # fp16 through fp32
    torch.testing.assert_close(impl.fn(xh, raw, Q4_1, k), gguf_linear.reference(xh.float(), raw, Q4_1, k).half(),
                               atol=1e-3, rtol=1e-3)
    entry = gguf_kernels._PACKED[id(raw)]
    assert (entry[3] is not None) == bool(_native.gguf_packed_f32_variant())
    # The Q8-activation op on the same weight finds the same copy: never two.
    (q8,) = [i for i in registry.implementations(gguf_linear_q8act) if i.name == "native"]
    x = torch.randn(3, k, generator=gen)
    q8.fn(x, raw, Q4_1, k)
    assert gguf_kernels._PACKED[id(raw)] is entry

    # Where the ISA has no packed kernel (NEON, VSX, RVV; none on this host), nothing is packed and the raw-row
    # fused kernel runs: the gate's answer stood in for here, the kernels run for real.
    monkeypatch.setattr(_native, "gguf_packed_variant", lambda: "")
    raw = random_gguf_weight(n, k, Q4_0, "cpu", gen, scale=k ** -0.5)
    check(impl.fn(x, raw, Q4_0, k), x, raw, Q4_0, k)
    assert gguf_kernels._PACKED[id(raw)][3] is None


def test_cpu_graph_records_the_packed_call(registry, gen):
    impl = fused(registry)
    k, n = 576, 40
    with torch.inference_mode():
        raw = random_gguf_weight(n, k, Q8_0, "cpu", gen, scale=k ** -0.5)
        x = torch.randn(2, k, generator=gen)
        replay, out = capture(lambda: impl.fn(x, raw, Q8_0, k))
        assert replay.num_calls == 1
        for _ in range(2):
            x.copy_(torch.randn(2, k, generator=gen))
            replay()
            check(out, x, raw, Q8_0, k)


def test_argument_errors():
    raw = torch.zeros(1, 40, dtype=torch.uint8)
    x, y = torch.zeros(1, 64), torch.zeros(1, 1)
    f32 = gguf_kernels.DTYPE_CODE[torch.float32]
    args = (Q4_1, x.data_ptr(), 64, 1, 64, raw.data_ptr(), 40, 1, y.data_ptr(), 1, f32)
    with pytest.raises(ValueError, match="packed is null"):
        _native.gguf_linear_packed(*args, 0)
    with pytest.raises(ValueError, match="multiple of 32"):
        _native.gguf_linear_packed(Q4_1, x.data_ptr(), 64, 1, 48, raw.data_ptr(), 40, 1, y.data_ptr(), 1, f32,
                                   pack(raw, Q4_1, 64).data_ptr())
