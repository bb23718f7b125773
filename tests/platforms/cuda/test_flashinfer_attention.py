"""The FlashInfer adapter (platforms/cuda/flashinfer_attention.py) without FlashInfer or a GPU: our page table ->
FlashInfer's CSR page table against FlashInfer's documented contract, an attention oracle written from that contract
agreeing with the op references (decode, and prefill with FlashInfer's bottom-right causal mask), and the gate."""

from __future__ import annotations

import math

import pytest
import torch

from engine.core.ops import OPS, KernelRegistry
from engine.core.ops.attention import make_paged_layout, paged_attention_decode, paged_attention_prefill
from engine.platforms.cuda import flashinfer_attention as fi


def _flashinfer_seq_lens(indptr, last_page_len, page_size):
    """FlashInfer's get_seq_lens: (num_pages - 1) * page_size + last_page_len, 0 for a request without pages."""
    pages = indptr[1:] - indptr[:-1]
    return torch.where(pages > 0, (pages - 1) * page_size + last_page_len, torch.zeros_like(pages))


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_metadata_follows_the_flashinfer_contract(block_size, gen):
    lens = [1, block_size, block_size + 1, 3 * block_size, 77, 5]
    table, _ = make_paged_layout(lens, block_size, gen, spare_columns=2)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    indptr, indices, last = fi.paged_kv_metadata(table, seq_lens, block_size)
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    assert indptr.shape == (len(lens) + 1,) and last.shape == (len(lens),) and indices.shape == (int(indptr[-1]),)
    assert indptr[0] == 0 and bool((indptr[1:] >= indptr[:-1]).all())
    assert bool(((last >= 1) & (last <= block_size)).all())  # documented: 1 <= kv_last_page_len <= page_size
    assert _flashinfer_seq_lens(indptr, last, block_size).tolist() == lens
    for b, n in enumerate(lens):
        pages = math.ceil(n / block_size)
        assert indices[indptr[b]: indptr[b + 1]].tolist() == table[b, :pages].tolist()
    # strided inputs and a seq_len past the table are clamped to max_blocks * block_size, as the reference does
    wide = torch.zeros(table.shape[0], 2 * table.shape[1], dtype=torch.int32)
    wide[:, ::2] = table
    over = seq_lens.clone()
    over[0] = table.shape[1] * block_size + 5
    indptr2, indices2, last2 = fi.paged_kv_metadata(wide[:, ::2], over, block_size)
    assert int(indptr2[1]) == table.shape[1] and int(last2[0]) == block_size
    assert indices2[: table.shape[1]].tolist() == table[0].tolist()


def _gather(cache, indptr, indices, last, b, page_size):
    """Request b's K or V rows the way FlashInfer reads an NHD paged cache: its pages in order, the last one cut."""
    pages = indices[indptr[b]: indptr[b + 1]].long()
    rows = cache[pages].flatten(0, 1)  # [n_pages * page_size, Hk, D]
    return rows[: int(_flashinfer_seq_lens(indptr, last, page_size)[b])]


def _oracle(q, kc, vc, indptr, indices, last, page_size, scale, cu=None):
    """Attention as FlashInfer defines it on (indptr, indices, last_page_len): decode (one query per request) or,
    with ``cu`` (qo_indptr), causal prefill with the bottom-right mask tril(diagonal=kv_len - qo_len)."""
    hq, hk = q.shape[1], kc.shape[2]
    out = torch.empty_like(q)
    for b in range(indptr.shape[0] - 1):
        k = _gather(kc, indptr, indices, last, b, page_size).float().repeat_interleave(hq // hk, 1)
        v = _gather(vc, indptr, indices, last, b, page_size).float().repeat_interleave(hq // hk, 1)
        rows = slice(b, b + 1) if cu is None else slice(int(cu[b]), int(cu[b + 1]))
        qb = q[rows].float()
        if qb.shape[0] == 0:
            continue
        s = torch.einsum("qhd,khd->hqk", qb, k) * scale
        if cu is not None:
            qo_len, kv_len = qb.shape[0], k.shape[0]
            mask = torch.tril(torch.ones(qo_len, kv_len, dtype=torch.bool), diagonal=kv_len - qo_len)
            s = s.masked_fill(~mask, float("-inf"))
        out[rows] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).to(q.dtype)
    return out


@pytest.mark.parametrize("op", [paged_attention_decode, paged_attention_prefill], ids=lambda o: o.name)
def test_converted_metadata_computes_the_op(op, gen):
    """Every conformance case of the op: the reference on our page table == the FlashInfer-contract oracle on the
    converted one (so FlashInfer, fed paged_kv_metadata's output, computes our op)."""
    for case in OPS[op.name].cases:
        args = op.make_inputs(dict(case.params), torch.float32, "cpu", gen)
        kc, bt = args[1], args[3]
        seq_lens, cu = (args[4], None) if op is paged_attention_decode else (args[5], args[4])
        indptr, indices, last = fi.paged_kv_metadata(bt, seq_lens, kc.shape[1])
        got = _oracle(args[0], kc, args[2], indptr, indices, last, kc.shape[1], args[-1], cu)
        torch.testing.assert_close(got, op.reference(*args), atol=1e-5, rtol=1e-5)


def test_gate_records_why(monkeypatch):
    reg = KernelRegistry("cuda")
    monkeypatch.setattr(fi.importlib.util, "find_spec", lambda name: None)
    fi.register(reg, "cuda", (9, 0))
    assert not reg.implementations(paged_attention_decode)
    reasons = {s.name: s.reason for s in reg.skipped()}
    assert set(reasons) == {"flashinfer_paged_decode", "flashinfer_paged_prefill"}
    assert all("not installed" in r for r in reasons.values())
    monkeypatch.setattr(fi, "flashinfer_available", lambda: True)
    assert "capability" in fi.gate((7, 5)) and fi.gate((9, 0)) is None
    reg = KernelRegistry("cuda")
    fi.register(reg, "cpu", None)
    assert all("cuda" in s.reason for s in reg.skipped())


def test_supports_declines_with_a_reason():
    sd, sp = fi.make_supports((9, 0))
    q = torch.randn(2, 8, 128, dtype=torch.bfloat16)
    kc = torch.randn(4, 16, 2, 128, dtype=torch.bfloat16)
    bt, lens = torch.zeros(2, 2, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    assert "cuda" in sd(q, kc, kc, bt, lens, 0.1)  # cpu tensors
    meta = [t.to("meta") for t in (q, kc, kc, bt, lens)]
    assert "cuda" in sd(*meta, 0.1)
    # no GPU needed to check the dtype / shape predicates: fake cuda tensors
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        cq = torch.empty(2, 8, 128, dtype=torch.bfloat16, device="cuda")
        ckc = torch.empty(4, 16, 2, 128, dtype=torch.bfloat16, device="cuda")
        cbt = torch.zeros(2, 2, dtype=torch.int32, device="cuda")
        clens = torch.ones(2, dtype=torch.int32, device="cuda")
        cu = torch.zeros(3, dtype=torch.int32, device="cuda")
        assert sd(cq, ckc, ckc, cbt, clens, 0.1) is True
        assert sp(cq, ckc, ckc, cbt, cu, clens, 0.1) is True
        assert "fp16, bf16" in sd(cq.float(), ckc.float(), ckc.float(), cbt, clens, 0.1)
        odd = torch.empty(2, 8, 80, dtype=torch.bfloat16, device="cuda")
        okc = torch.empty(4, 16, 2, 80, dtype=torch.bfloat16, device="cuda")
        assert "head_dim" in sd(odd, okc, okc, cbt, clens, 0.1)
        assert "cu_seqlens_q" in sp(cq, ckc, ckc, cbt, torch.zeros(2, dtype=torch.int32, device="cuda"), clens, 0.1)
        assert "capability" in fi.make_supports((7, 5))[0](cq, ckc, ckc, cbt, clens, 0.1)
