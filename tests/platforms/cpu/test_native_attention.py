"""Native paged attention (decode, prefill) and write_kv_cache against the ops' references, for every ISA
variant this CPU runs, with 1 and 2 threads. Every cache slot no sequence owns is poisoned with NaN/inf:
the kernels must never read past seq_len (a fresh cache holds arbitrary bits)."""

import math

import pytest
import torch

from engine.core.ops.attention import (
    make_paged_layout,
    paged_attention_decode,
    paged_attention_prefill,
    random_seq_lens,
)
from engine.core.ops.kv_cache import write_kv_cache

DTYPES = (torch.float32, torch.bfloat16)


def native(registry, op):
    (impl,) = registry.implementations(op)
    return impl


def poisoned_paged_kv(lens, block_size, hk, d, dtype, gen, spare_columns=1):
    """Caches holding random K/V at every position < seq_len of each sequence and NaN / +inf / -inf in
    every other slot (spare blocks, block tails, the slots unused table entries point at)."""
    table, nb = make_paged_layout(lens, block_size, gen, spare_columns=spare_columns)
    owned = torch.zeros(nb * block_size, dtype=torch.bool)
    for b, n in enumerate(lens):
        pos = torch.arange(n)
        owned[table[b, pos // block_size].long() * block_size + pos % block_size] = True
    caches = []
    for _ in range(2):
        c = torch.randn(nb * block_size, hk, d, generator=gen)
        poison = torch.tensor([math.nan, math.inf, -math.inf])[torch.arange(nb * block_size) % 3]
        c[~owned] = poison[~owned][:, None, None]
        caches.append(c.view(nb, block_size, hk, d).to(dtype))
    return caches[0], caches[1], table


def check(op, impl, args):
    got, want = impl.fn(*args), op.reference(*args)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.isfinite(got).all(), "the kernel read a poisoned slot"
    tol = op.tolerances[want.dtype]
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


# (batch, hq, hk, head_dim, block_size, max_len): SmolLM2 heads, MHA and GQA 3, head dims 16..256 (80 is
# not a power of two), a long context (key partitions with 2 threads), lengths off block multiples.
DECODE_SHAPES = [
    (4, 9, 3, 64, 16, 300),
    (3, 9, 3, 64, 32, 77),
    (3, 4, 4, 128, 32, 100),
    (2, 6, 2, 80, 16, 50),
    (5, 3, 1, 16, 16, 40),
    (2, 2, 2, 256, 32, 70),
    (1, 9, 3, 64, 16, 1500),
    (32, 9, 3, 64, 16, 60),
]


@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=lambda s: "b{}_hq{}_hk{}_d{}_bs{}_len{}".format(*s))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_decode(shape, dtype, isa, threads, registry, gen):
    b, hq, hk, d, bs, max_len = shape
    lens = random_seq_lens(b, max_len, bs, gen)
    lens[-1] = max_len if max_len % bs else max_len - 1  # the longest, off a block multiple
    kc, vc, table = poisoned_paged_kv(lens, bs, hk, d, dtype, gen)
    q = torch.randn(b, hq, d, generator=gen).to(dtype)
    args = (q, kc, vc, table, torch.tensor(lens, dtype=torch.int32), d ** -0.5)
    impl = registry.select(paged_attention_decode, args)
    assert impl.platform == "cpu", registry.explain(paged_attention_decode, args)
    check(paged_attention_decode, impl, args)


def _prefill_args(lens, q_lens, hq, hk, d, bs, dtype, gen):
    kc, vc, table = poisoned_paged_kv(lens, bs, hk, d, dtype, gen)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return q, kc, vc, table, cu, torch.tensor(lens, dtype=torch.int32), d ** -0.5


PREFILL_CASES = [  # (seq_lens, q_lens, hq, hk, head_dim, block_size)
    ([70, 33, 100], [70, 5, 1], 9, 3, 64, 16),  # full prefill, a chunk, a single query
    ([45, 64], [45, 20], 4, 4, 128, 32),
    ([130], [130], 6, 2, 80, 16),  # many query tiles, causal edges inside the last key chunks
    ([17, 9, 40], [0, 9, 23], 3, 1, 32, 16),  # a sequence with no new tokens
    ([300], [77], 9, 3, 64, 32),  # prefix-cache hit: queries start deep in the context
]


@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: "lens{}_q{}_hq{}_hk{}_d{}_bs{}".format(*c))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_prefill(case, dtype, isa, threads, registry, gen):
    lens, q_lens, hq, hk, d, bs = case
    args = _prefill_args(lens, q_lens, hq, hk, d, bs, dtype, gen)
    impl = registry.select(paged_attention_prefill, args)
    assert impl.platform == "cpu", registry.explain(paged_attention_prefill, args)
    check(paged_attention_prefill, impl, args)


def test_prefill_of_one_token_is_decode(isa, registry, gen):
    lens = [37, 64, 5]
    args = _prefill_args(lens, [1, 1, 1], 9, 3, 64, 16, torch.float32, gen)
    q, kc, vc, table, _, seq_lens, scale = args
    pre = native(registry, paged_attention_prefill).fn(*args)
    dec = native(registry, paged_attention_decode).fn(q, kc, vc, table, seq_lens, scale)
    torch.testing.assert_close(pre, dec, atol=1e-6, rtol=1e-6)


def test_empty_batch(threads, registry, gen):
    kc = torch.randn(4, 16, 3, 64, generator=gen)
    table, sl = torch.zeros(0, 2, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)
    out = native(registry, paged_attention_decode).fn(torch.randn(0, 9, 64), kc, kc, table, sl, 0.1)
    assert out.shape == (0, 9, 64)
    out = native(registry, paged_attention_prefill).fn(torch.randn(0, 9, 64), kc, kc, table,
                                                       torch.zeros(1, dtype=torch.int32), sl, 0.1)
    assert out.shape == (0, 9, 64)


def test_strided_block_table(registry, gen):
    lens = [50, 20]
    kc, vc, table = poisoned_paged_kv(lens, 16, 3, 64, torch.float32, gen)
    wide = torch.full((2, 2 * table.shape[1] + 1), -7, dtype=torch.int32)
    wide[:, ::2][:, : table.shape[1]] = table
    strided = wide[:, ::2][:, : table.shape[1]]
    assert not strided.is_contiguous() and torch.equal(strided, table)
    q = torch.randn(2, 9, 64, generator=gen)
    args = (q, kc, vc, strided, torch.tensor(lens, dtype=torch.int32), 0.125)
    assert native(registry, paged_attention_decode).verdict(args) is None
    check(paged_attention_decode, native(registry, paged_attention_decode), args)


def test_bad_indices_raise_instead_of_reading(registry, gen):
    lens = [40, 20]
    kc, vc, table = poisoned_paged_kv(lens, 16, 3, 64, torch.float32, gen)
    q = torch.randn(2, 9, 64, generator=gen)
    decode = native(registry, paged_attention_decode).fn
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    bad_table = table.clone()
    bad_table[0, 2] = kc.shape[0]  # block 2 holds positions 32..39 of sequence 0
    with pytest.raises(ValueError, match="block_tables"):
        decode(q, kc, vc, bad_table, seq_lens, 0.125)
    bad_table[0, 2] = -1
    with pytest.raises(ValueError, match="block_tables"):
        decode(q, kc, vc, bad_table, seq_lens, 0.125)
    with pytest.raises(ValueError, match="seq_len"):
        decode(q, kc, vc, table, torch.tensor([40, table.shape[1] * 16 + 1], dtype=torch.int32), 0.125)
    with pytest.raises(ValueError, match="seq_len"):
        decode(q, kc, vc, table, torch.tensor([40, 0], dtype=torch.int32), 0.125)
    with pytest.raises(ValueError, match="one query per sequence"):
        decode(q[:1], kc, vc, table, seq_lens, 0.125)
    with pytest.raises(ValueError, match="same number of blocks"):
        decode(q, kc, vc[:-1], table, seq_lens, 0.125)
    prefill = native(registry, paged_attention_prefill).fn
    args = list(_prefill_args(lens, [40, 20], 9, 3, 64, 16, torch.float32, gen))
    args[4] = torch.tensor([0, 45, 60], dtype=torch.int32)  # 45 queries for a sequence of 40
    with pytest.raises(ValueError, match="q_len <= seq_len"):
        prefill(*args)
    args[4] = torch.tensor([0, 40, 59], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        prefill(*args)


def test_unsupported_inputs_fall_back_to_reference(registry, gen):
    lens = [20, 9]
    kc, vc, table = poisoned_paged_kv(lens, 16, 2, 64, torch.float32, gen)
    q = torch.randn(2, 4, 64, generator=gen)
    sl = torch.tensor(lens, dtype=torch.int32)
    k72 = torch.randn(kc.shape[0], 16, 2, 72, generator=gen)
    k320 = torch.randn(kc.shape[0], 16, 2, 320, generator=gen)
    refused = {
        "fp64": (q.double(), kc.double(), vc.double(), table, sl, 0.1),
        "head_dim 72": (torch.randn(2, 4, 72, generator=gen), k72, k72, table, sl, 0.1),
        "head_dim 320": (torch.randn(2, 4, 320, generator=gen), k320, k320, table, sl, 0.1),
        "non-contiguous q": (torch.randn(4, 2, 64, generator=gen).transpose(0, 1), kc, vc, table, sl, 0.1),
        "int64 seq_lens": (q, kc, vc, table, sl.long(), 0.1),
    }
    impl = native(registry, paged_attention_decode)
    for why, args in refused.items():
        assert impl.verdict(args) is not None, why
        assert registry.select(paged_attention_decode, args).platform == "core", why
    kv = torch.randn(3, 2, 64, generator=gen)
    slots = torch.tensor([1, 5, 7])
    impl = native(registry, write_kv_cache)
    assert impl.verdict((kv.double(), kv.double(), kc.double(), vc.double(), slots)) is not None
    assert impl.verdict((kv.transpose(0, 1).contiguous().transpose(0, 1), kv, kc, vc, slots)) is not None
    assert impl.verdict((kv, kv, kc, vc, slots.int())) is not None


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("tokens,padding", [(1, 0), (9, 0), (40, 5)])
def test_write_kv_cache(dtype, tokens, padding, registry, gen):
    nb, bs, hk, d = 6, 16, 3, 64
    slots = torch.randperm(nb * bs, generator=gen)[:tokens]
    slots[torch.randperm(tokens, generator=gen)[:padding]] = -1
    key = torch.randn(tokens, hk, d, generator=gen).to(dtype)
    value = torch.randn(tokens, hk, d, generator=gen).to(dtype)
    kc, vc = (torch.randn(nb, bs, hk, d, generator=gen).to(dtype) for _ in range(2))
    want_k, want_v = kc.clone(), vc.clone()
    write_kv_cache.reference(key, value, want_k, want_v, slots)
    impl = native(registry, write_kv_cache)
    assert impl.verdict((key, value, kc, vc, slots)) is None
    impl.fn(key, value, kc, vc, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


def test_write_kv_cache_bad_slot_writes_nothing(registry, gen):
    key = torch.randn(3, 2, 16, generator=gen)
    kc, vc = torch.zeros(2, 16, 2, 16), torch.zeros(2, 16, 2, 16)
    fn = native(registry, write_kv_cache).fn
    with pytest.raises(ValueError, match="slot_mapping\\[2\\] = 32"):
        fn(key, key, kc, vc, torch.tensor([0, 5, 32]))
    assert not kc.any() and not vc.any()
    with pytest.raises(ValueError, match="number of tokens"):
        fn(key, key[:2], kc, vc, torch.tensor([0, 5, 6]))
