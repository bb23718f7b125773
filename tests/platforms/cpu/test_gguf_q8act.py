"""The cpu platform's gguf_linear_q8act kernels against the op's reference: every qtype x dtype x ISA variant this
CPU runs x 1 and 2 threads x batch sizes around the kernels' tiles (1..4 rows of x per tile) and odd block counts
(the AVX-512 kernel's pair tail); layouts; the VNNI gate; refusals; argument errors."""

import pytest
import torch

from engine.core.ops.gguf_q8act import gguf_linear_q8act
from engine.core.ops.gguf_quant import Q4_0, Q4_1, Q8_0, gguf_dequantize, random_gguf_weight
from engine.platforms.cpu import _native
from engine.platforms.cpu.kernels.gguf import Q8ACT_MAX_M

QTYPES = (Q4_0, Q4_1, Q8_0)
DTYPES = (torch.float32, torch.bfloat16)
# (K, N): 1 and 3 blocks (odd: a lone last block), N not a multiple of the 4-row panel, N = 1001 split over threads.
SHAPES = [(32, 1), (96, 7), (576, 37), (576, 1001), (1536, 13)]


def native(registry):
    (impl,) = [i for i in registry.implementations(gguf_linear_q8act) if i.name == "native"]
    return impl


def check(impl, x, raw, qtype, k):
    got, want = impl.fn(x, raw, qtype, k), gguf_linear_q8act.reference(x, raw, qtype, k)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = gguf_linear_q8act.tolerances[x.dtype]
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9, 32, Q8ACT_MAX_M + 1])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("qtype", QTYPES, ids=["q4_0", "q4_1", "q8_0"])
def test_matches_reference(qtype, dtype, m, isa, threads, registry, gen):
    for k, n in SHAPES:
        raw = random_gguf_weight(n, k, qtype, "cpu", gen, scale=k ** -0.5)
        x = torch.randn(m, k, generator=gen).to(dtype)
        impl = registry.select(gguf_linear_q8act, (x, raw, qtype, k))
        assert impl.name == "native", registry.explain(gguf_linear_q8act, (x, raw, qtype, k))
        check(impl, x, raw, qtype, k)


@pytest.mark.parametrize("qtype", QTYPES, ids=["q4_0", "q4_1", "q8_0"])
def test_extreme_blocks(qtype, isa, registry, gen):
    # All-zero blocks (d = 0), one huge value per block, exact ties at .5 steps and blocks of equal magnitudes.
    k = 256
    raw = random_gguf_weight(10, k, qtype, "cpu", gen, scale=0.1)
    x = torch.randn(4, k, generator=gen)
    x[0, :64] = 0
    x[1, ::32] = 1e4
    x[2] = torch.arange(k, dtype=torch.float32).remainder(64).sub(31.5) * (127 / 31.5) / 127  # q ties at .5
    x[3] = torch.where(torch.rand(k, generator=gen) < 0.5, -3.0, 3.0)
    impl = native(registry)
    got, want = impl.fn(x, raw, qtype, k), gguf_linear_q8act.reference(x, raw, qtype, k)
    # The 1e4 row's block products (~1e3 each) cancel, so the order of fp32 adds decides the last few ULPs of
    # their magnitude: bound the error by the sum of |terms| (a few fp32 ULPs of it), not by the small result.
    w = gguf_dequantize.reference(raw, qtype, k, torch.float32)
    terms = x.abs() @ w.abs().t()
    tol = gguf_linear_q8act.tolerances[x.dtype]
    assert ((got - want).abs() <= tol.atol + tol.rtol * want.abs() + 1e-6 * terms).all(), (got - want).abs().max()


def test_layouts(isa, registry, gen):
    impl, k = native(registry), 64
    raw = random_gguf_weight(11, k, Q4_1, "cpu", gen, scale=k ** -0.5)
    check(impl, torch.randn(2, 3, k, generator=gen), raw, Q4_1, k)
    check(impl, torch.randn(5, k + 9, generator=gen)[:, 3:3 + k], raw, Q4_1, k)  # rows further apart than k
    check(impl, torch.randn(k, 4, generator=gen).t(), raw, Q4_1, k)  # column-major x: copied
    check(impl, torch.randn(k, generator=gen), raw, Q4_1, k)
    padded = torch.cat([raw, raw[:, :5]], dim=1)[:, :raw.shape[1]]  # weight rows 5 bytes further apart
    check(impl, torch.randn(3, k, generator=gen), padded, Q4_1, k)


def cpu_flags() -> set[str]:
    """/proc/cpuinfo's feature flags of the first CPU (empty where there is none)."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def test_variant_follows_isa_and_vnni(isa):
    flags = cpu_flags()
    want = {"avx512": "avx512_vnni" if "avx512_vnni" in flags else "avx2", "avx2": "avx2", "scalar": "scalar",
            "neon": "neon_dotprod" if _native.has_dotprod() else "neon"}[isa]
    assert _native.gguf_q8act_variant() == want


def test_refusals_fall_back_to_reference(registry, gen):
    k = 64
    raw = random_gguf_weight(5, k, Q4_0, "cpu", gen)
    x = torch.randn(2, k, generator=gen)
    for args in [(x.double(), raw, Q4_0, k), (x, raw, 6, k), (torch.randn(2, 96), raw, Q4_0, 96),
                 (x.to("meta"), raw, Q4_0, k)]:
        assert isinstance(native(registry).verdict(args), str)
        assert registry.select(gguf_linear_q8act, args) is gguf_linear_q8act.reference_impl


def test_native_argument_errors():
    x, y, w = torch.zeros(64), torch.zeros(1), torch.zeros(40, dtype=torch.uint8)
    good = dict(qtype=Q4_1, x=x.data_ptr(), x_stride=64, m=1, k=64, w=w.data_ptr(), w_stride=40, n=1,
                y=y.data_ptr(), y_stride=1, dtype=_native.DTYPE_F32)
    _native.gguf_linear_q8act(**good)
    for bad in (dict(qtype=6), dict(k=48), dict(w_stride=39), dict(x_stride=32), dict(dtype=7), dict(m=-1)):
        with pytest.raises(ValueError, match="qtype|multiple of 32|stride|dtype|m and n"):
            _native.gguf_linear_q8act(**{**good, **bad})
