"""The rocm platform's AITER adapters (platforms/rocm/aiter_kernels.py) on the CPU: each adapter's arguments, run
through a torch model of the AITER call's documented semantics (aiter/mla.py's mla_decode_fwd over kv_indptr /
kv_indices pages of one token; aiter/ops/gemm_op_a8w8.py's row-scaled and block-scaled FP8 GEMMs), equal the op's
reference on fresh random inputs of the op's own generator; the arch / import gate and what a registration records
without aiter. AITER itself needs an MI300/MI350: not run here."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.fp8 import _expand, fp8_linear
from engine.core.ops.mla import mla_decode
from engine.platforms.rocm import aiter_kernels as ak

GEN_SEED = int.from_bytes(__import__("os").urandom(4), "little")


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(GEN_SEED)


def mla_decode_fwd_model(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                         sm_scale):
    """What aiter.mla.mla_decode_fwd computes with page_size 1: for each sequence b, its query rows
    qo_indptr[b]:qo_indptr[b+1] attend to kv_buffer pages kv_indices[kv_indptr[b]:kv_indptr[b+1]]; the values are the
    first o.shape[-1] channels; the result is written into o."""
    rows = kv_buffer.reshape(kv_buffer.shape[0], -1).float()
    assert kv_buffer.shape[1:3] == (1, 1) and bool((kv_last_page_lens == 1).all()) and max_seqlen_q == 1
    for b in range(qo_indptr.shape[0] - 1):
        kv = rows[kv_indices[kv_indptr[b]:kv_indptr[b + 1]].long()]
        qb = q[qo_indptr[b]:qo_indptr[b + 1]].float()  # [1, H, D]
        p = torch.softmax(torch.einsum("qhd,td->qht", qb, kv) * sm_scale, dim=-1)
        o[qo_indptr[b]:qo_indptr[b + 1]] = torch.einsum("qht,tv->qhv", p, kv[:, :o.shape[-1]]).to(o.dtype)


@pytest.mark.parametrize("case", mla_decode.cases, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mla_adapter_layouts_give_the_reference(case, dtype):
    q, kv_cache, block_tables, seq_lens, scale, v_dim = mla_decode.make_inputs(dict(case.params), dtype, "cpu",
                                                                               _gen())
    args = ak.mla_decode_fwd_args(q, kv_cache, block_tables, seq_lens, scale, v_dim)
    assert args["kv_buffer"].data_ptr() == kv_cache.data_ptr()  # a view of the cache, no copy
    assert args["kv_indices"].dtype == args["kv_indptr"].dtype == args["qo_indptr"].dtype == torch.int32
    mla_decode_fwd_model(**args)
    want = mla_decode.reference(q, kv_cache, block_tables, seq_lens, scale, v_dim)
    tol = mla_decode.tolerances.get(dtype)
    torch.testing.assert_close(args["o"].float(), want.float(), atol=tol.atol, rtol=tol.rtol,
                               msg=lambda m: f"seed {GEN_SEED}: {m}")


def gemm_model(name, args, kwargs):
    """What aiter.gemm_a8w8_CK (x_scale [M, 1], w_scale [1, N]) and aiter.gemm_a8w8_blockscale (x_scale [M, K/128],
    w_scale [N/128, K/128]) compute: the dequantized product, rounded once to ``dtype``."""
    x_q, w_q, xs, ws = args
    (m, k), n = x_q.shape, w_q.shape[0]
    if name == "gemm_a8w8_CK":
        assert xs.shape == (m, 1) and ws.shape == (1, n) and kwargs["bias"] is None
        x, w = x_q.float() * xs, w_q.float() * ws.t()
    else:
        assert xs.shape == (m, -(-k // 128)) and ws.shape == (-(-n // 128), -(-k // 128))
        x, w = x_q.float() * _expand(xs, m, k, 1, 128), w_q.float() * _expand(ws, n, k, 128, 128)
    return (x @ w.t()).to(kwargs["dtype"])


@pytest.mark.parametrize("granularity", ["tensor", "token_channel", "token_tensor", "block"])
@pytest.mark.parametrize("fp8", ["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("mnk", [(1, 128, 256), (7, 256, 384), (33, 384, 128 * 5)], ids=str)
def test_gemm_adapter_layouts_give_the_reference(granularity, fp8, mnk):
    m, n, k = mnk
    p = {"m": m, "n": n, "k": k, "granularity": granularity, "fp8": fp8}
    x_q, xs, w_q, ws, bias, dtype = fp8_linear.make_inputs(p, torch.bfloat16, "cpu", _gen())
    # K = 128 makes 1x128 groups and per-row scales the same thing; the adapter then takes the row-scaled GEMM
    assert ak.gemm_verdict(x_q, xs, w_q, ws, None, torch.bfloat16, x_q.dtype) is True
    name, args, kwargs = ak.gemm_a8w8_args(x_q, xs, w_q, ws, None, torch.bfloat16)
    assert name == ("gemm_a8w8_blockscale" if granularity == "block" else "gemm_a8w8_CK")
    got = gemm_model(name, args, kwargs)
    want = fp8_linear.reference(x_q, xs, w_q, ws, None, torch.bfloat16)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2, msg=lambda m_: f"seed {GEN_SEED}: "
                               f"{m_}")


def test_gemm_verdicts():
    def args(granularity="token_channel", fp8="e4m3fn", m=4, n=128, k=256):
        p = {"m": m, "n": n, "k": k, "granularity": granularity, "fp8": fp8}
        return fp8_linear.make_inputs(p, torch.bfloat16, "cpu", _gen())[:4]

    def verdict(*a, bias=None, out=torch.bfloat16, fp8=torch.float8_e4m3fn):
        return ak.gemm_verdict(*a, bias, out, fp8)

    assert verdict(*args()) is True and verdict(*args(), out=torch.float16) is True
    assert "on the GPU" in ak.gemm_supports_for(torch.float8_e4m3fn)(*args(), None, torch.bfloat16)
    assert "flavour" in verdict(*args(fp8="e4m3fnuz"))
    assert "bf16 or fp16" in verdict(*args(), out=torch.float32)
    assert "bias" in verdict(*args(), bias=torch.zeros(128, dtype=torch.bfloat16))
    assert "multiples of 16" in verdict(*args(n=120))
    assert "multiples of 128" in verdict(*args("block", n=200, k=256))
    x_q, xs, w_q, ws = args("block")
    _, row_xs, _, row_ws = args()
    assert "AITER takes" in verdict(x_q, row_xs, w_q, ws) and "AITER takes" in verdict(x_q, xs, w_q, row_ws)


def test_gate_names_arch_and_import():
    assert ak.aiter_gate("gfx942:sramecc+:xnack-", None)[0]
    assert ak.aiter_gate("gfx950", None)[0]
    ok, why = ak.aiter_gate("gfx90a", None)
    assert not ok and "gfx942, gfx950" in why and "gfx90a" in why
    ok, why = ak.aiter_gate("gfx942", "ModuleNotFoundError: No module named 'aiter'")
    assert not ok and "amd-aiter" in why and "No module named" in why
    assert "not run on AMD hardware here" in ak.aiter_gate("gfx942", None)[1]


def test_registration_without_aiter_records_every_reason():
    # aiter is not installable here (no ROCm build of torch): the registration records why, per op
    reg = KernelRegistry("rocm")
    ak.register(reg, "gfx942", torch.float8_e4m3fnuz)
    skipped = {(s.op, s.name): s.reason for s in reg.skipped()}
    assert set(skipped) == {("mla_decode", "aiter_mla_decode"), ("fp8_linear", "aiter_gemm_a8w8"),
                            ("fused_moe", "aiter_fused_moe")}, skipped
    assert "aiter does not import" in skipped["mla_decode", "aiter_mla_decode"]
    assert "shuffle" in skipped["fused_moe", "aiter_fused_moe"]
    assert not reg.implementations(mla_decode) and not reg.implementations(fp8_linear)
