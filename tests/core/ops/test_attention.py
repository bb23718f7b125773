"""Paged attention: references vs torch SDPA on per-sequence contiguous K/V (float64); input layout;
sensitivity of cases and tolerances to typical kernel bugs; fake shapes; torch.ops path; errors."""

import random

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from engine.core.ops.attention import paged_attention_decode as decode
from engine.core.ops.attention import paged_attention_prefill as prefill


def _params(op):
    return [pytest.param(c, dt, id=f"{c.name}-{str(dt)[6:]}") for c in op.cases for dt in op.dtypes]


def _contiguous_kv(cache, table_row, n):
    """The first n tokens of one sequence, gathered token by token: [n, Hk, D] float64."""
    bs = cache.shape[1]
    return torch.stack([cache[int(table_row[pos // bs]), pos % bs] for pos in range(n)]).double()


def _sdpa(q, k, v, scale, **kw):
    """q [n_q, Hq, D], k/v [L, Hk, D] -> [n_q, Hq, D] through torch SDPA with GQA."""
    out = F.scaled_dot_product_attention(q.double().transpose(0, 1)[None], k.transpose(0, 1)[None],
                                         v.transpose(0, 1)[None], scale=scale, enable_gqa=True, **kw)
    return out[0].transpose(0, 1)


def _check(got, expected, dtype, op):
    tol = op.tolerances[dtype]
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), expected, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("case,dtype", _params(decode))
def test_decode_matches_sdpa(case, dtype, gen):
    q, kc, vc, bt, lens, scale = decode.make_inputs(case.params, dtype, "cpu", gen)
    expected = torch.stack([
        _sdpa(q[b:b + 1], _contiguous_kv(kc, bt[b], n), _contiguous_kv(vc, bt[b], n), scale)[0]
        for b, n in enumerate(lens.tolist())])
    _check(decode.reference(q, kc, vc, bt, lens, scale), expected, dtype, decode)


@pytest.mark.parametrize("case,dtype", _params(prefill))
def test_prefill_matches_sdpa(case, dtype, gen):
    q, kc, vc, bt, cu, lens, scale = prefill.make_inputs(case.params, dtype, "cpu", gen)
    parts = []
    for b, n in enumerate(lens.tolist()):
        qb = q[int(cu[b]): int(cu[b + 1])]
        k, v = _contiguous_kv(kc, bt[b], n), _contiguous_kv(vc, bt[b], n)
        if qb.shape[0] == n:  # plain prefill: the usual causal mask
            parts.append(_sdpa(qb, k, v, scale, is_causal=True))
        else:  # the last q_len positions: query i sees keys 0 .. n - q_len + i
            i = torch.arange(qb.shape[0])[:, None]
            allowed = torch.arange(n)[None, :] <= n - qb.shape[0] + i
            parts.append(_sdpa(qb, k, v, scale, attn_mask=allowed))
    _check(prefill.reference(q, kc, vc, bt, cu, lens, scale), torch.cat(parts), dtype, prefill)


@pytest.mark.parametrize("case", decode.cases + prefill.cases, ids=lambda c: c.name)
def test_inputs_are_a_real_paged_layout(case, gen):
    op = decode if case in decode.cases else prefill
    args = op.make_inputs(case.params, torch.float32, "cpu", gen)
    kc, bt, lens = args[1], args[3], args[-2]
    bs = case.params["block_size"]
    assert kc.shape[1] == bs and bt.dtype == lens.dtype == torch.int32
    lens = lens.tolist()
    assert any(n % bs for n in lens)
    used = torch.cat([bt[b, : -(-n // bs)] for b, n in enumerate(lens)])
    assert used.unique().numel() == used.numel()  # no block shared between sequences
    assert used.numel() < kc.shape[0]  # spare blocks hold random data too
    assert kc.std() > 0.5
    if op is prefill:
        q_lens = torch.diff(args[4]).tolist()
        assert all(1 <= ql <= n for ql, n in zip(q_lens, lens, strict=True))
        if case.params.get("q_mode", "mixed") == "mixed" and len(lens) > 1:
            assert q_lens[0] == lens[0]


def test_block_tables_are_shuffled(gen):
    params = dict(decode.cases[0].params, batch=8, max_len=200)
    _, _, _, bt, lens, _ = decode.make_inputs(params, torch.float32, "cpu", gen)
    bs = params["block_size"]
    rows = [bt[b, : -(-n // bs)] for b, n in enumerate(lens.tolist())]
    assert any(bool((row[1:] - row[:-1] != 1).any()) for row in rows if row.numel() > 1)


@pytest.mark.parametrize("op", [decode, prefill], ids=["decode", "prefill"])
@pytest.mark.parametrize("case_idx", range(4))
def test_reading_past_seq_len_fails(op, case_idx, gen):
    """A kernel that attends to whole blocks (ignores seq_len inside the last block) must fail the case."""
    args = list(op.make_inputs(op.cases[case_idx].params, torch.float32, "cpu", gen))
    bs = args[1].shape[1]
    good = op.reference(*args)
    args[-2] = (args[-2] + bs - 1) // bs * bs  # rounded up to whole blocks
    tol = op.tolerances[torch.float32]
    assert not torch.allclose(op.reference(*args), good, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("case", [c for c in decode.cases if c.params["hq"] != c.params["hk"]],
                         ids=lambda c: c.name)
def test_wrong_gqa_mapping_fails(case, gen):
    """A kernel that maps query head h to KV head h % Hk instead of h // (Hq/Hk) must fail."""
    q, kc, vc, bt, lens, scale = decode.make_inputs(case.params, torch.bfloat16, "cpu", gen)
    hq, hk = q.shape[1], kc.shape[2]
    group = hq // hk
    # head h of the buggy kernel reads KV head h % hk, i.e. the reference's head (h % hk) * group + h // hk
    src = torch.tensor([(h % hk) * group + h // hk for h in range(hq)])
    inv = torch.argsort(src)
    buggy = decode.reference(q[:, inv], kc, vc, bt, lens, scale)[:, src]
    tol = decode.tolerances[torch.bfloat16]
    assert torch.equal(src[inv], torch.arange(hq))
    good = decode.reference(q, kc, vc, bt, lens, scale)
    assert not torch.allclose(buggy, good, atol=tol.atol, rtol=tol.rtol)


def test_decode_is_prefill_with_one_query(gen):
    q, kc, vc, bt, lens, scale = decode.make_inputs(decode.cases[0].params, torch.float32, "cpu", gen)
    cu = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    torch.testing.assert_close(decode.reference(q, kc, vc, bt, lens, scale),
                               prefill.reference(q, kc, vc, bt, cu, lens, scale), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", decode.dtypes)
def test_fake_shapes(dtype):
    with FakeTensorMode():
        kc = torch.empty(10, 16, 3, 64, dtype=dtype)
        bt, lens = torch.empty(4, 5, dtype=torch.int32), torch.empty(4, dtype=torch.int32)
        out_d = decode.torch_op(torch.empty(4, 9, 64, dtype=dtype), kc, kc, bt, lens, 0.125)
        out_p = prefill.torch_op(torch.empty(21, 9, 64, dtype=dtype), kc, kc, bt,
                                 torch.empty(5, dtype=torch.int32), lens, 0.125)
    assert out_d.shape == (4, 9, 64) and out_p.shape == (21, 9, 64) and out_d.dtype == out_p.dtype == dtype


def test_torch_op_matches_call(gen):
    args = decode.make_inputs(decode.cases[0].params, torch.float16, "cpu", gen)
    assert torch.equal(torch.ops.engine.paged_attention_decode(*args), decode(*args))
    args = prefill.make_inputs(prefill.cases[0].params, torch.float16, "cpu", gen)
    assert torch.equal(torch.ops.engine.paged_attention_prefill(*args), prefill(*args))


def test_bad_inputs(gen):
    q, kc, vc, bt, lens, scale = decode.make_inputs(decode.cases[0].params, torch.float32, "cpu", gen)
    with pytest.raises(TypeError, match="int32"):
        decode.reference(q, kc, vc, bt.long(), lens, scale)
    with pytest.raises(TypeError, match="share one dtype"):
        decode.reference(q, kc.half(), vc, bt, lens, scale)
    with pytest.raises(ValueError, match="multiple of Hk"):
        decode.reference(q[:, :8], kc, vc, bt, lens, scale)
    with pytest.raises(ValueError, match="one query per sequence"):
        decode.reference(q[:-1], kc, vc, bt, lens, scale)
    q, kc, vc, bt, cu, lens, scale = prefill.make_inputs(prefill.cases[0].params, torch.float32, "cpu", gen)
    with pytest.raises(TypeError, match=r"\[B\+1\]"):
        prefill.reference(q, kc, vc, bt, cu[1:], lens, scale)
    with pytest.raises(ValueError, match="q_len <= seq_len"):
        prefill.reference(q, kc, vc, bt, cu, torch.ones_like(lens), scale)
    with pytest.raises(ValueError, match="from 0 to T"):
        prefill.reference(q[1:], kc, vc, bt, cu, lens, scale)


@pytest.mark.parametrize("op", [decode, prefill], ids=["decode", "prefill"])
def test_opcheck(op, gen):
    """torch.library.opcheck: schema, fake impl vs real outputs, tracing with dynamic shapes."""
    torch.library.opcheck(op.torch_op, op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen))


def test_decode_ignores_non_finite_garbage_past_seq_len():
    """A fresh KV cache is uninitialised memory: NaN/inf in slots past seq_len must not reach the output."""
    gen = torch.Generator().manual_seed(random.getrandbits(32))
    b, hq, hk, d, bs = 3, 4, 2, 16, 8
    lens = [5, 8, 13]
    kc = torch.randn(6, bs, hk, d, generator=gen)
    vc = torch.randn(6, bs, hk, d, generator=gen)
    tables = torch.tensor([[0, 5], [1, 4], [2, 3]], dtype=torch.int32)  # 4 and 5 are unused table entries
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(b, hq, d, generator=gen)
    clean = decode(q, kc, vc, tables, seq_lens, d ** -0.5)
    for i, n in enumerate(lens):
        for pos in range(n, tables.shape[1] * bs):
            blk = tables[i, pos // bs].item()
            kc[blk, pos % bs] = float("nan")
            vc[blk, pos % bs] = float("inf")
    poisoned = decode(q, kc, vc, tables, seq_lens, d ** -0.5)
    assert torch.isfinite(poisoned).all()
    torch.testing.assert_close(poisoned, clean)
