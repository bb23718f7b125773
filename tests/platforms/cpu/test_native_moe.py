"""Native fused_moe against the op's reference for every ISA variant this CPU runs, with 1 and 2 threads:
decode, experts without tokens, top-1/2/4, renormalize on and off, sizes off the 8/16-lane widths, the dot
and gemm kernels (few and many rows per expert), several token chunks, strided and non-contiguous layouts,
the routing step alone, refusals and errors."""

import pytest
import torch

from engine.core.ops.moe import _fused_moe_inputs, distinct_logits, fused_moe, route
from engine.platforms.cpu import _native

DTYPES = (torch.float32, torch.bfloat16)
# fp32: the same fp32 math with the sums in another order (k <= 130 terms of O(1) values): ~1e-6.
# bf16: that fp32 result, then one rounding, as the reference: at most one bf16 ulp (2^-7 relative) apart.
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-5, rtol=2 ** -7)}

SHAPES = [  # tokens, hidden, inter, experts, top_k, renormalize
    (1, 64, 96, 8, 2, True),  # decode: 6 of 8 experts idle
    (6, 64, 96, 8, 2, True),
    (9, 48, 32, 16, 4, False),
    (40, 32, 40, 4, 1, False),
    (17, 80, 56, 16, 4, True),
    (5, 33, 19, 3, 1, True),  # hidden and inter off every vector width
    (3, 7, 5, 3, 3, False),  # shorter than one vector
    (70, 130, 24, 8, 2, True),  # tokens enough for every thread; hidden % 16 = 2
    (26, 40, 24, 2, 1, True),  # about 13 rows per expert: gemm for fp32 (from 12 rows), dot for bf16 (< 24)
    (100, 20, 36, 2, 2, False),  # 100 rows per expert: the gemm kernel, 48 + 48 + 16 padded columns
    (600, 24, 40, 4, 2, False),  # two token chunks (kMoeChunkPairs / top_k tokens each)
]


def native(registry):
    (impl,) = [i for i in registry.implementations(fused_moe) if i.name == "native"]
    return impl


def check(impl, args):
    assert impl.verdict(args) is None, impl.verdict(args)
    got, want = impl.fn(*args), fused_moe.reference(*args)
    assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
    torch.testing.assert_close(got, want, **TOL[want.dtype])


def inputs(shape, dtype, gen):
    t, h, i, e, k, renorm = shape
    return _fused_moe_inputs(dict(tokens=t, hidden=h, inter=i, experts=e, top_k=k, renormalize=renorm), dtype,
                             "cpu", gen)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}_H{}_I{}_E{}_k{}_{}".format(
    *s[:5], "renorm" if s[5] else "raw"))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_matches_reference(shape, dtype, isa, threads, registry, gen):
    check(native(registry), inputs(shape, dtype, gen))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_layouts(dtype, isa, registry, gen):
    impl = native(registry)
    x, w13, w2, logits, k, renorm = inputs((11, 40, 24, 6, 2, True), dtype, gen)
    wide = torch.zeros(11, 50, dtype=dtype)
    wide[:, 5:45] = x  # rows 50 apart: passed with their stride
    padded_w2 = torch.zeros(6, 40, 30, dtype=dtype)
    padded_w2[:, :, :24] = w2  # w2 rows 30 apart
    w13_t = w13.transpose(1, 2).contiguous().transpose(1, 2)  # last stride != 1: copied
    every_other = torch.zeros(6, 96, 40, dtype=dtype)
    every_other[:, ::2] = w13  # w13 rows two rows apart
    for lg in (logits, logits.float(), logits.double(), logits.half(), logits.bfloat16(),
               torch.cat([logits, logits], dim=1)[:, :6], logits.t().contiguous().t()):
        check(impl, (x, w13, w2, lg, k, renorm))
    check(impl, (wide[:, 5:45], every_other[:, ::2], padded_w2[:, :, :24], logits, k, renorm))
    check(impl, (x, w13_t, w2, logits, k, renorm))
    check(impl, (x.t().contiguous().t(), w13, w2.transpose(0, 1).contiguous().transpose(0, 1), logits, k, renorm))


@pytest.mark.parametrize("logits_dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("renorm", [True, False])
def test_route(logits_dtype, renorm, gen):
    for t, e, k in ((1, 8, 2), (33, 16, 4), (7, 3, 3), (5, 60, 1)):
        logits = distinct_logits(t, e, logits_dtype, "cpu", gen)
        weights, ids = torch.empty(t, k), torch.empty(t, k, dtype=torch.int64)
        _native.moe_route(logits.data_ptr(), e, _native.DTYPE_F32 if logits_dtype == torch.float32
                          else _native.DTYPE_BF16, t, e, k, renorm, weights.data_ptr(), ids.data_ptr())
        want_w, want_ids = route(logits, k, renorm)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(weights, want_w, atol=1e-6, rtol=1e-5)


def test_dispatch_empty_and_refusals(registry, gen):
    impl = native(registry)
    x, w13, w2, logits, k, renorm = inputs((4, 32, 16, 4, 2, True), torch.float32, gen)
    assert registry.select(fused_moe, (x, w13, w2, logits, k, renorm)) is impl
    empty = impl.fn(x[:0], w13, w2, logits[:0], k, renorm)
    assert empty.shape == (0, 32) and empty.dtype == torch.float32
    refused = {
        "fp16": (x.half(), w13.half(), w2.half(), logits, k, renorm),
        "mixed dtypes": (x, w13.bfloat16(), w2, logits, k, renorm),
        "int logits": (x, w13, w2, logits.int(), k, renorm),
        "top_k > experts": (x, w13, w2, logits, 5, renorm),
        "top_k = 0": (x, w13, w2, logits, 0, renorm),
        "w2 shape": (x, w13, w2[:, :, :8], logits, k, renorm),
        "odd 2*I": (x, w13[:, :31], w2, logits, k, renorm),
        "logits shape": (x, w13, w2, logits[:, :3], k, renorm),
        "x 3-D": (x.view(2, 2, 32), w13, w2, logits, k, renorm),
    }
    for why, args in refused.items():
        assert impl.verdict(args) is not None, why
        assert registry.select(fused_moe, args).platform == "core", why


def test_errors(registry, gen):
    impl = native(registry)
    x, w13, w2, logits, _, _ = inputs((4, 32, 16, 4, 2, True), torch.float32, gen)
    for k in (0, 5):  # refused by supports(); called directly, the C++ side says why
        with pytest.raises(ValueError, match=r"top_k must be in \[1, 4\]"):
            impl.fn(x, w13, w2, logits, k, True)
    out = torch.empty(4, 32)
    ptrs = dict(x=x.data_ptr(), w13=w13.data_ptr(), w2=w2.data_ptr(), logits=logits.data_ptr(), out=out.data_ptr())
    good = dict(x_stride=32, w13_expert_stride=1024, w13_row_stride=32, w2_expert_stride=512, w2_row_stride=16,
                logits_stride=4, logits_dtype=0, out_stride=32, tokens=4, hidden=32, inter=16, experts=4, top_k=2,
                renormalize=True, dtype=0)
    _native.fused_moe(**ptrs, **good)
    torch.testing.assert_close(out, fused_moe.reference(x, w13, w2, logits, 2, True), **TOL[torch.float32])
    for bad, match in ((dict(x_stride=31), "row stride of x"), (dict(w2_row_stride=8), "w2 rows"),
                       (dict(dtype=2), "dtype code"), (dict(inter=0), "inter"), (dict(logits_stride=3), "logits")):
        with pytest.raises(ValueError, match=match):
            _native.fused_moe(**ptrs, **{**good, **bad})
    with pytest.raises(ValueError, match="null"):
        _native.fused_moe(**{**ptrs, "x": 0}, **good)
