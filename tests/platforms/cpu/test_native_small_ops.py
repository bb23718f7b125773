"""Native silu_and_mul and rotary_embedding against the ops' references, for every ISA variant this CPU
runs, with 1 and 2 threads; tails around the 8/16-lane widths, strided layouts, refusals and errors."""


import pytest
import torch

from engine.core.ops.activation import silu_and_mul
from engine.core.ops.rotary import build_cos_sin_cache, rotary_embedding

DTYPES = (torch.float32, torch.bfloat16)


def native(registry, op):
    (impl,) = registry.implementations(op)
    return impl


def check(op, impl, args, exact=False):
    assert impl.verdict(args) is None, impl.verdict(args)
    got, want = impl.fn(*args), op.reference(*args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype and g.is_contiguous()
        if exact:
            assert torch.equal(g, w), (g.float() - w.float()).abs().max()
        else:
            tol = op.tolerances[w.dtype]
            torch.testing.assert_close(g, w, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("d", [1, 7, 8, 15, 16, 17, 33, 100, 1536])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_silu_and_mul(d, dtype, isa, threads, registry, gen):
    impl = native(registry, silu_and_mul)
    x = (torch.randn(5, 2 * d, generator=gen) * 4).to(dtype)
    x[0, :4] = torch.tensor([-95.0, 95.0, -30.0, 0.0])[: min(4, 2 * d)].to(dtype)  # exp clamp and saturation
    check(silu_and_mul, impl, (x,))
    check(silu_and_mul, impl, (x.view(5, 1, 2 * d),))  # 3-D
    wide = (torch.randn(4, 2 * d + 6, generator=gen) * 3).to(dtype)[:, 3: 3 + 2 * d]  # rows apart
    check(silu_and_mul, impl, (wide,))
    many = (torch.randn(40, 2 * d, generator=gen) * 3).to(dtype)  # enough rows to split over threads
    check(silu_and_mul, impl, (many,))


def test_silu_and_mul_empty_and_refusals(registry, gen):
    impl = native(registry, silu_and_mul)
    assert impl.fn(torch.randn(0, 8, generator=gen)).shape == (0, 4)
    x = torch.randn(4, 8, generator=gen)
    for why, bad in {"fp64": x.double(), "odd": torch.randn(4, 7, generator=gen),
                     "transposed": x.t(), "permuted 3-D": x.view(2, 2, 8).transpose(0, 1)}.items():
        assert impl.verdict((bad,)) is not None, why
        assert registry.select(silu_and_mul, (bad,)).platform == "core", why


ROTARY_CASES = [  # (hq, hk, head_dim, rot_dim, is_neox): rot/2 off the 8- and 16-lane widths too
    (9, 3, 64, 64, True),
    (8, 2, 128, 128, True),
    (4, 4, 64, 64, False),
    (4, 2, 64, 32, True),
    (3, 1, 128, 64, False),
    (2, 2, 80, 80, True),
    (2, 1, 80, 40, False),
    (3, 2, 64, 20, True),
    (3, 2, 64, 20, False),
    (2, 1, 16, 2, True),
    (2, 1, 16, 2, False),
]


@pytest.mark.parametrize("case", ROTARY_CASES, ids=lambda c: "hq{}_hk{}_d{}_rot{}_{}".format(
    *c[:4], "neox" if c[4] else "gptj"))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_rotary(case, dtype, isa, threads, registry, gen):
    hq, hk, d, rot, neox = case
    impl = native(registry, rotary_embedding)
    cache = build_cos_sin_cache(4096, rot, 10000.0)
    for t in (1, 7, 33, 100):  # 100 tokens: enough to split over 2 threads
        pos = torch.randint(0, 4096, (t,), generator=gen)
        q = torch.randn(t, hq * d, generator=gen).to(dtype)
        k = torch.randn(t, hk * d, generator=gen).to(dtype)
        # Separate products and sum, then one rounding, as the reference: bit-exact.
        check(rotary_embedding, impl, (pos, q, k, cache, d, neox), exact=True)
        check(rotary_embedding, impl, (pos, q.view(t, hq, d), k.view(t, hk, d), cache, d, neox), exact=True)
    # q and k sliced out of one fused qkv row: per-token blocks contiguous, tokens further apart.
    qkv = torch.randn(9, (hq + 2 * hk) * d, generator=gen).to(dtype)
    q, k = qkv[:, : hq * d].view(9, hq, d), qkv[:, hq * d: (hq + hk) * d]
    assert not q.is_contiguous() and not k.is_contiguous()
    check(rotary_embedding, impl, (torch.randint(0, 4096, (9,), generator=gen), q, k, cache, d, neox), exact=True)
    # A layout with no dense per-token block (heads strided): copied first, still right.
    q_heads_apart = torch.randn(5, hq, 2 * d, generator=gen).to(dtype)[:, :, :d]
    k5 = torch.randn(5, hk * d, generator=gen).to(dtype)
    check(rotary_embedding, impl, (torch.randint(0, 4096, (5,), generator=gen), q_heads_apart, k5, cache, d, neox),
          exact=True)


def test_rotary_errors_and_refusals(registry, gen):
    impl = native(registry, rotary_embedding)
    cache = build_cos_sin_cache(64, 32, 10000.0)
    empty = impl.fn(torch.zeros(0, dtype=torch.long), torch.randn(0, 4, 32), torch.randn(0, 2, 32), cache, 32, True)
    assert [t.shape for t in empty] == [(0, 4, 32), (0, 2, 32)]
    q, k = torch.randn(3, 4 * 32, generator=gen), torch.randn(3, 2 * 32, generator=gen)
    pos = torch.tensor([0, 63, 5])
    with pytest.raises(ValueError, match="positions\\[1\\] = 64"):
        impl.fn(torch.tensor([0, 64, 5]), q, k, cache, 32, True)
    with pytest.raises(ValueError, match="positions\\[0\\] = -1"):
        impl.fn(torch.tensor([-1, 6, 5]), q, k, cache, 32, True)
    with pytest.raises(ValueError, match="number of tokens"):
        impl.fn(pos, q, k[:2], cache, 32, True)
    refused = {
        "fp64": (pos, q.double(), k.double(), cache, 32, True),
        "bf16 cache": (pos, q.bfloat16(), k.bfloat16(), cache.bfloat16(), 32, True),
        "rot_dim > head_dim": (pos, q, k, build_cos_sin_cache(64, 64, 1e4), 32, True),
        "int32 positions": (pos.int(), q, k, cache, 32, True),
        "head_dim not dividing": (pos, q, k, cache, 48, True),
    }
    for why, args in refused.items():
        assert impl.verdict(args) is not None, why
