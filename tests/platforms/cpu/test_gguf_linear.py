"""The cpu platform's fused gguf_linear kernel against the op's reference: every qtype x dtype x ISA variant
this CPU runs x 1 and 2 threads x batch sizes around the kernel's tiles; layouts; refusals that fall back."""


import pytest
import torch

from engine.core.ops.gguf_quant import GGUF_QTYPES, Q4_0, Q4_1, Q8_0, gguf_dequantize, gguf_linear, random_gguf_weight
from engine.platforms.cpu import _native
from engine.platforms.cpu.kernels import gguf as gguf_kernels
from engine.platforms.cpu.kernels import onednn_gemm
from engine.platforms.cpu.kernels.gguf import FUSED_MAX_M, FUSED_RAW_MAX_M
from tests import needs

QTYPES = (Q4_0, Q4_1, Q8_0)
DTYPES = (torch.float32, torch.bfloat16)
# (K, N): odd N (tails of the 4-row panels and of the 64-row M = 1 chunks); N = 1001 at K = 576 is
# enough work to be split between two threads, at every M.
SHAPES = [(32, 1), (64, 7), (576, 37), (576, 1001), (1536, 13)]


def fused(registry):
    (impl,) = [i for i in registry.implementations(gguf_linear) if i.name == "fused"]
    return impl


def weight(n, k, qtype, gen):
    return random_gguf_weight(n, k, qtype, "cpu", gen, scale=k ** -0.5)  # outputs of order 1, as the op's cases


def check(impl, x, raw, qtype, k):
    got, want = impl.fn(x, raw, qtype, k), gguf_linear.reference(x, raw, qtype, k)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = gguf_linear.tolerances[x.dtype]
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("m", [1, 2, 3, 7, 32, 65])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("qtype", QTYPES, ids=["q4_0", "q4_1", "q8_0"])
def test_matches_reference(qtype, dtype, m, isa, threads, registry, gen):
    for k, n in SHAPES:
        raw = weight(n, k, qtype, gen)
        x = torch.randn(m, k, generator=gen).to(dtype)
        impl = registry.select(gguf_linear, (x, raw, qtype, k))
        assert impl.name == "fused", registry.explain(gguf_linear, (x, raw, qtype, k))
        check(impl, x, raw, qtype, k)


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("qtype", QTYPES, ids=["q4_0", "q4_1", "q8_0"])
def test_fp32_accuracy_long_rows(qtype, m, isa, registry, gen):
    # Long rows, unscaled values: an output can be near 0 while its terms are large, so compare with the
    # exact (float64) result within a bound relative to sum |x| |w| (fp32 summation error is of that order).
    k = 4096
    raw = random_gguf_weight(9, k, qtype, "cpu", gen, scale=4.0)
    x = torch.randn(m, k, generator=gen) * 10
    w = gguf_dequantize.reference(raw, qtype, k, torch.float32).double()
    exact, scale = x.double() @ w.t(), x.double().abs() @ w.abs().t()
    err = (fused(registry).fn(x, raw, qtype, k).double() - exact).abs()
    assert (err <= 2e-6 * scale).all(), (err / scale).max()


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_layouts(dtype, isa, registry, gen):
    impl, k = fused(registry), 64
    raw = weight(11, k, Q4_1, gen)
    check(impl, torch.randn(2, 3, k, generator=gen).to(dtype), raw, Q4_1, k)  # 3-D x: leading dims kept
    wide = torch.randn(5, k + 9, generator=gen).to(dtype)[:, 3:3 + k]  # rows further apart than k
    check(impl, wide, raw, Q4_1, k)
    check(impl, torch.randn(k, 4, generator=gen).to(dtype).t(), raw, Q4_1, k)  # column-major x: copied
    check(impl, torch.randn(k, generator=gen).to(dtype), raw, Q4_1, k)  # 1-D x -> [N]
    padded = torch.cat([raw, raw[:, :5]], dim=1)[:, :raw.shape[1]]  # weight rows 5 bytes further apart
    assert padded.stride(0) != raw.shape[1] and impl.verdict((wide, padded, Q4_1, k)) is None
    check(impl, wide, padded, Q4_1, k)
    strided = raw.t().contiguous().t()  # same values, column-major bytes: refused, but a direct call copies
    assert impl.verdict((wide, strided, Q4_1, k)) is not None
    check(impl, wide, strided, Q4_1, k)


def test_empty_and_prefill_sizes(registry, gen):
    impl, k = fused(registry), 64
    raw = weight(6, k, Q8_0, gen)
    assert impl.fn(torch.randn(0, k), raw, Q8_0, k).shape == (0, 6)
    assert impl.fn(torch.randn(3, k), raw[:0], Q8_0, k).shape == (3, 0)
    check(impl, torch.randn(FUSED_MAX_M + 1, k, generator=gen), raw, Q8_0, k)  # raw-row kernel or torch matmul
    check(impl, torch.randn(FUSED_RAW_MAX_M + 1, k, generator=gen), raw, Q8_0, k)  # dequantize + GEMM


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "torch_gemm"])
def test_prefill_rows_follow_the_vendor_rule(onednn, isa, registry, gen, monkeypatch):
    # The raw-row kernel takes prefill-sized M only where it was measured to beat the fallback: AMD with AVX-512 when
    # the fallback's GEMM is torch's own (no oneDNN). The rule is read at each call, so it follows the ISA in use.
    # Which kernel ran is seen on the modules, where the wrappers look them up (the kernels run for real).
    if onednn and not onednn_gemm.onednn_active():
        needs.unavailable("this torch has no working oneDNN linear (torch.ops.mkldnn._linear_pointwise)")
    monkeypatch.setattr(gguf_kernels, "onednn_active", lambda: onednn)
    monkeypatch.setattr(onednn_gemm, "_state", {"ok": onednn})
    amd512 = gguf_kernels._cpu_vendor() == "AuthenticAMD" and isa == "avx512" and not onednn
    assert gguf_kernels.fused_raw_max_m() == (FUSED_RAW_MAX_M if amd512 else FUSED_MAX_M)
    assert FUSED_RAW_MAX_M == (2048 if gguf_kernels._cpu_vendor() == "AuthenticAMD" else FUSED_MAX_M)
    raw_calls, onednn_calls = [], []
    real, real_onednn = _native.gguf_linear, onednn_gemm._onednn
    monkeypatch.setattr(_native, "gguf_linear", lambda *a: raw_calls.append(a[3]) or real(*a))
    monkeypatch.setattr(onednn_gemm, "_onednn", lambda x, w: onednn_calls.append(x.shape[0]) or real_onednn(x, w))
    impl, k = fused(registry), 64
    raw = weight(6, k, Q4_1, gen)
    check(impl, torch.randn(FUSED_MAX_M + 1, k, generator=gen), raw, Q4_1, k)
    assert raw_calls == ([FUSED_MAX_M + 1] if amd512 else [])
    assert onednn_calls == ([FUSED_MAX_M + 1] if onednn else [])


@pytest.mark.parametrize("m", [126, 127, 300])
@pytest.mark.parametrize("qtype", QTYPES, ids=["q4_0", "q4_1", "q8_0"])
def test_raw_row_kernel_prefill_sizes(qtype, m, isa, threads, gen):
    # The raw-row kernel goes through x 126 rows at a time (csrc/gguf_linear.cpp kRowChunk): the rows of a chunk's
    # edge and of the last, partial one against the reference, called as the wrapper calls it (fp32 and bf16 x,
    # rows further apart than k, y rows further apart than n).
    for k, n in ((64, 7), (576, 37), (1536, 13)):
        raw = weight(n, k, qtype, gen)
        for dtype in DTYPES:
            x = torch.randn(m, k + 5, generator=gen).to(dtype)[:, :k]
            y = torch.full((m, n + 3), float("nan"), dtype=dtype)
            _native.gguf_linear(qtype, x.data_ptr(), x.stride(0), m, k, raw.data_ptr(), raw.stride(0), n,
                                y.data_ptr(), y.stride(0), _native.DTYPE_F32 if dtype == torch.float32
                                else _native.DTYPE_BF16)
            want = gguf_linear.reference(x, raw, qtype, k)
            tol = gguf_linear.tolerances[dtype]
            torch.testing.assert_close(y[:, :n], want, atol=tol.atol, rtol=tol.rtol)
            assert y[:, n:].isnan().all()  # nothing written past n


def test_refusals_fall_back_to_reference(registry, gen):
    k = 64
    raw = weight(5, k, Q4_0, gen)
    x = torch.randn(2, k, generator=gen)
    impl = fused(registry)
    refused = [
        (x.double(), raw, Q4_0, k),  # dtype (fp16 is taken: kernels/test_gguf_fp16.py)
        (x, raw, 6, k),  # qtype (Q5_0)
        (torch.randn(2, 48), torch.zeros(5, 27, dtype=torch.uint8), Q4_0, 48),  # cols % 32
        (torch.randn(2, 96), raw, Q4_0, 96),  # raw rows hold 64 columns
        (x, raw.view(torch.int8), Q4_0, k),  # raw dtype
        (x.to("meta"), raw, Q4_0, k),  # device
    ]
    for args in refused:
        assert isinstance(impl.verdict(args), str)
        assert registry.select(gguf_linear, args) is gguf_linear.reference_impl
    assert set(GGUF_QTYPES) == set(QTYPES)  # a new qtype in the op must be added to the kernel and here


def test_native_argument_errors():
    x, y, w = torch.zeros(64), torch.zeros(1), torch.zeros(40, dtype=torch.uint8)
    good = dict(qtype=Q4_1, x=x.data_ptr(), x_stride=64, m=1, k=64, w=w.data_ptr(), w_stride=40, n=1,
                y=y.data_ptr(), y_stride=1, dtype=_native.DTYPE_F32)
    _native.gguf_linear(**good)
    for bad in (dict(qtype=6), dict(k=48), dict(w_stride=39), dict(x_stride=32), dict(dtype=7), dict(m=-1)):
        with pytest.raises(ValueError):
            _native.gguf_linear(**{**good, **bad})


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_dequantize_then_gemm_reuses_one_buffer_for_weights_of_one_shape(dtype, gen):
    """Prefill's dequantize + GEMM writes each weight into this thread's buffer for its size (no fresh pages per
    call): two different weights of one shape, used in turn, each still give their own product, and the buffer is
    the same memory both times."""
    k, n, m = 64, 48, 130
    a, b = weight(n, k, Q4_1, gen), weight(n, k, Q4_1, gen)
    x = torch.randn(m, k, generator=gen).to(dtype)
    tol = gguf_linear.tolerances[dtype]
    for raw in (a, b, a):
        got = gguf_kernels._dequant_matmul(x, raw, Q4_1, k)
        torch.testing.assert_close(got, gguf_linear.reference(x, raw, Q4_1, k), atol=tol.atol, rtol=tol.rtol)
    first = gguf_kernels._dequant(a, Q4_1, k, dtype, scratch=True)
    assert gguf_kernels._dequant(b, Q4_1, k, dtype, scratch=True).data_ptr() == first.data_ptr()
    assert torch.equal(gguf_kernels._dequant(a, Q4_1, k, dtype), gguf_dequantize.reference(a, Q4_1, k, dtype))
