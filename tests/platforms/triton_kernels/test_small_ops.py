"""The per-row Triton kernels against the ops' references: rms_norm, fused_add_rms_norm (norm.py), silu_and_mul
(activation.py), rotary_embedding (rotary.py), write_kv_cache (kv_cache.py).

Every conformance case in every dtype (contiguous and strided inputs, through the kit's run_case), then what the
cases do not reach: sizes around and above each block-size switch, odd sizes, 3-D inputs, views with a row stride
(slices of a fused projection), padding slots, refusals with reasons; on CUDA, capture in a graph.
"""

from __future__ import annotations

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.activation import silu_and_mul
from engine.core.ops.kv_cache import write_kv_cache
from engine.core.ops.norm import fused_add_rms_norm, rms_norm
from engine.core.ops.rotary import build_cos_sin_cache, rotary_embedding
from engine.core.testing.conformance import compare
from engine.platforms.triton_kernels import activation, kv_cache, norm, rotary
from tests.platforms.triton_kernels.conftest import CAPABILITY, DEVICE, run_case

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
IMPL = {"rms_norm": "triton_rms_norm", "fused_add_rms_norm": "triton_fused_add_rms_norm",
        "silu_and_mul": "triton_silu_and_mul", "rotary_embedding": "triton_rotary",
        "write_kv_cache": "triton_write_kv_cache"}
OPS = {op.name: op for op in (rms_norm, fused_add_rms_norm, silu_and_mul, rotary_embedding, write_kv_cache)}


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    reg = KernelRegistry("triton")
    for mod in (norm, activation, rotary, kv_cache):
        mod.register(reg, DEVICE, CAPABILITY)
    return reg


def impl_of(registry, op):
    (impl,) = registry.implementations(op)
    assert impl.name == IMPL[op.name]
    return impl


def check(registry, op, args, dtype):
    """The implementation (which must accept ``args``) against the reference on contiguous host copies."""
    impl = impl_of(registry, op)
    assert impl.verdict(args) is None, impl.verdict(args)
    ref_args = [a.cpu().contiguous().clone() if isinstance(a, torch.Tensor) else a for a in args]
    want = op.reference(*ref_args)
    got = impl.fn(*args)
    if op.mutates:
        got, want = [args[i] for i in op.mutates], [ref_args[i] for i in op.mutates]
    else:
        got, want = (list(got), list(want)) if isinstance(got, tuple) else ([got], [want])
    assert all(g.is_contiguous() for g in got)
    compare(op, dtype, got, want, op.name)


def randn(*shape, dtype, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op_case", [(op.name, c) for op in OPS.values() for c in op.cases],
                         ids=lambda oc: f"{oc[0]}-{oc[1].name}")
def test_op_cases(registry, op_case, dtype, seed):
    name, case = op_case
    run_case(registry, name, IMPL[name], case.params, dtype, seed)


# ------------------------------------------------------------------------------------------- RMSNorm

HIDDEN = [1, 7, 100, 1025, norm.MAX_BLOCK, norm.MAX_BLOCK + 100]  # ... the largest single block, then the loop


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_sizes(registry, hidden, dtype, seed):
    for name in ("rms_norm", "fused_add_rms_norm"):
        run_case(registry, name, IMPL[name], {"tokens": 3, "hidden": hidden}, dtype, seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rms_norm_layouts(registry, dtype, gen):
    h = 96
    w = randn(h, dtype=dtype, gen=gen, scale=0.5) + 1
    x3 = randn(2, 5, h, dtype=dtype, gen=gen)
    wide = randn(6, 3 * h, dtype=dtype, gen=gen)[:, h: 2 * h]  # rows 3*h apart
    res = randn(6, h, dtype=dtype, gen=gen)
    check(registry, rms_norm, (x3, w, 1e-6), dtype)
    check(registry, rms_norm, (wide, w, 1e-5), dtype)
    check(registry, rms_norm, (wide, w.float(), 1e-5), dtype)  # an fp32 weight with bf16 activations
    check(registry, fused_add_rms_norm, (x3, randn(2, 5, h, dtype=dtype, gen=gen), w, 1e-6), dtype)
    check(registry, fused_add_rms_norm, (wide, res, w, 1e-6), dtype)
    check(registry, fused_add_rms_norm, (res, wide, w, 1e-6), dtype)  # the strided one as the residual
    empty = torch.empty(0, h, dtype=dtype, device=DEVICE)
    assert impl_of(registry, rms_norm).fn(empty, w, 1e-6).shape == (0, h)


def test_rms_norm_declines(registry, gen):
    x, w = randn(4, 64, dtype=torch.float32, gen=gen), randn(64, dtype=torch.float32, gen=gen)
    rn, fa = impl_of(registry, rms_norm), impl_of(registry, fused_add_rms_norm)
    for why, args in {"weight size": (x, w[:32], 1e-6), "weight 2-D": (x, w[None], 1e-6),
                      "int": (x.int(), w, 1e-6), "fp64": (x.double(), w, 1e-6)}.items():
        assert isinstance(rn.verdict(args), str), why
    assert isinstance(fa.verdict((x, x[:2], w, 1e-6)), str)
    assert isinstance(fa.verdict((x, x.double(), w, 1e-6)), str)


# ------------------------------------------------------------------------------------------- silu_and_mul


@pytest.mark.parametrize("d", [1, 7, 100, activation.MAX_BLOCK, activation.MAX_BLOCK + 1, 3000])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul_sizes(registry, d, dtype, seed):
    run_case(registry, "silu_and_mul", IMPL["silu_and_mul"], {"lead": (3,), "d": d}, dtype, seed)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # numpy, under the interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_silu_and_mul_layouts(registry, dtype, gen):
    x = randn(4, 3, 2 * 50, dtype=dtype, gen=gen, scale=3)
    x[0, 0, :4] = torch.tensor([-95.0, 95.0, -30.0, 0.0], dtype=dtype)  # exp overflow and saturation
    check(registry, silu_and_mul, (x,), dtype)
    check(registry, silu_and_mul, (randn(5, 300, dtype=dtype, gen=gen)[:, 50:250],), dtype)  # rows 300 apart
    check(registry, silu_and_mul, (randn(7, 64, dtype=dtype, gen=gen).t().contiguous().t(),), dtype)  # columns
    assert impl_of(registry, silu_and_mul).fn(torch.empty(0, 8, dtype=dtype, device=DEVICE)).shape == (0, 4)


def test_silu_and_mul_declines(registry, gen):
    impl = impl_of(registry, silu_and_mul)
    x = randn(4, 8, dtype=torch.float32, gen=gen)
    for why, bad in {"odd": x[:, :7], "int": x.int(), "fp64": x.double()}.items():
        assert isinstance(impl.verdict((bad,)), str), why


# ------------------------------------------------------------------------------------------- rotary

ROTARY = [  # (hq, hk, head_dim, rot_dim, is_neox)
    (9, 3, 64, 64, True), (4, 4, 64, 64, False), (2, 1, 80, 80, True), (3, 2, 64, 20, True),
    (3, 2, 64, 20, False), (2, 1, 16, 2, False), (32, 8, 128, 128, True), (1, 1, 128, 64, True),
]


@pytest.mark.parametrize("case", ROTARY, ids=lambda c: "hq{}_hk{}_d{}_rot{}_{}".format(
    *c[:4], "neox" if c[4] else "gptj"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rotary_shapes(registry, case, dtype, seed):
    hq, hk, d, rot, neox = case
    params = {"tokens": 5, "hq": hq, "hk": hk, "head_dim": d, "rot_dim": rot, "is_neox": neox}
    run_case(registry, "rotary_embedding", IMPL["rotary_embedding"], params, dtype, seed)


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rotary_layouts(registry, neox, dtype, gen):
    t, hq, hk, d = 6, 4, 2, 64
    cache = build_cos_sin_cache(512, d, 10000.0, device=DEVICE)
    pos = torch.randint(0, 512, (t,), generator=gen).to(DEVICE)
    qkv = randn(t, (hq + 2 * hk) * d, dtype=dtype, gen=gen)
    q, k = qkv[:, : hq * d], qkv[:, hq * d: (hq + hk) * d]  # slices of a fused projection: rows apart
    check(registry, rotary_embedding, (pos, q, k, cache, d, neox), dtype)
    q3, k3 = q.view(t, hq, d), k.reshape(t, hk, d)  # 3-D, one of them strided
    check(registry, rotary_embedding, (pos, q3, k3, cache, d, neox), dtype)
    check(registry, rotary_embedding, (pos, q, k, cache.to(dtype), d, neox), dtype)  # cache in q's dtype
    q1, k1 = q[:1], k[:1]
    check(registry, rotary_embedding, (pos[:1], q1, k1, cache, d, neox), dtype)
    before = qkv.clone()
    impl_of(registry, rotary_embedding).fn(pos, q, k, cache, d, neox)
    assert torch.equal(qkv, before)  # out of place: the inputs stay as they were
    empty = impl_of(registry, rotary_embedding).fn(pos[:0], q[:0], k[:0], cache, d, neox)
    assert empty[0].shape == (0, hq * d) and empty[1].shape == (0, hk * d)


def test_rotary_declines(registry, gen):
    impl = impl_of(registry, rotary_embedding)
    d = 64
    cache = build_cos_sin_cache(64, d, 10000.0, device=DEVICE)
    pos = torch.randint(0, 64, (3,), generator=gen).to(DEVICE)
    q, k = randn(3, 2 * d, dtype=torch.float32, gen=gen), randn(3, d, dtype=torch.float32, gen=gen)
    bad = {"int32 positions": (pos.int(), q, k, cache, d, True), "q/k dtypes": (pos, q, k.half(), cache, d, True),
           "rot > head_dim": (pos, q, k, build_cos_sin_cache(64, 96, 1e4, device=DEVICE), d, True),
           "odd rot": (pos, q, k, cache[:, :63], d, True), "head_dim": (pos, q, k, cache[:, :32], 48, True),
           "tokens": (pos[:2], q, k, cache, d, True), "cache dtype": (pos, q, k, cache.double(), d, True)}
    for why, args in bad.items():
        assert isinstance(impl.verdict(args), str), why


# ------------------------------------------------------------------------------------------- write_kv_cache


@pytest.mark.parametrize("params", [
    {"tokens": 7, "hk": 64, "head_dim": 128, "block_size": 16, "num_blocks": 2},  # more heads than one program
    {"tokens": 5, "hk": 3, "head_dim": 80, "block_size": 8, "num_blocks": 4, "padding": 2},  # D not a power of 2
    {"tokens": 4, "hk": 1, "head_dim": 576, "block_size": 16, "num_blocks": 2, "padding": 4},  # mostly padding
])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_write_kv_cache_shapes(registry, params, dtype, seed):
    run_case(registry, "write_kv_cache", IMPL["write_kv_cache"], params, dtype, seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_write_kv_cache_views_and_padding(registry, dtype, gen):
    t, hq, hk, d, bs, nb = 6, 4, 2, 64, 4, 5
    qkv = randn(t, hq + 2 * hk, d, dtype=dtype, gen=gen)
    key, value = qkv[:, hq: hq + hk], qkv[:, hq + hk:]  # token stride (hq + 2hk) * d
    slots = torch.tensor([3, -1, 17, 0, -1, 19]).to(DEVICE)
    kc, vc = randn(nb, bs, hk, d, dtype=dtype, gen=gen), randn(nb, bs, hk, d, dtype=dtype, gen=gen)
    kc0 = kc.clone()
    check(registry, write_kv_cache, (key, value, kc, vc, slots), dtype)
    written = torch.zeros(nb * bs, dtype=torch.bool)
    written[[3, 17, 0, 19]] = True
    assert torch.equal(kc.view(-1, hk, d)[~written.to(DEVICE)], kc0.view(-1, hk, d)[~written.to(DEVICE)])
    assert torch.equal(vc.view(-1, hk, d)[3], value[0])
    impl = impl_of(registry, write_kv_cache)
    kc1, vc1 = kc.clone(), vc.clone()
    impl.fn(key, value, kc, vc, torch.full((t,), -1, device=DEVICE))  # all padding: nothing changes
    impl.fn(key[:0], value[:0], kc, vc, slots[:0])  # no tokens
    assert torch.equal(kc, kc1) and torch.equal(vc, vc1)


def test_write_kv_cache_declines(registry, gen):
    impl = impl_of(registry, write_kv_cache)
    k = randn(3, 2, 16, dtype=torch.float32, gen=gen)
    kc = randn(2, 4, 2, 16, dtype=torch.float32, gen=gen)
    slots = torch.tensor([0, 1, 2]).to(DEVICE)
    bad = {"int32 slots": (k, k, kc, kc.clone(), slots.int()), "dtype": (k, k.half(), kc, kc.clone(), slots),
           "strided cache": (k, k, kc.transpose(1, 2).contiguous().transpose(1, 2), kc.clone(), slots),
           "heads": (k[:, :1], k[:, :1], kc, kc.clone(), slots), "tokens": (k, k, kc, kc.clone(), slots[:2])}
    for why, args in bad.items():
        assert isinstance(impl.verdict(args), str), why


# ------------------------------------------------------------------------------------------- CUDA graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="graph capture needs CUDA")
def test_small_ops_capture_in_a_cuda_graph(registry, gen):
    """No kernel reads back to the host: one step of all five captures, and a replay equals a fresh eager run."""
    t, h, hq, hk, d = 8, 256, 4, 2, 64
    x, res = randn(t, h, dtype=torch.bfloat16, gen=gen), randn(t, h, dtype=torch.bfloat16, gen=gen)
    w = randn(h, dtype=torch.bfloat16, gen=gen)
    gate_up = randn(t, 2 * h, dtype=torch.bfloat16, gen=gen)
    q, k = randn(t, hq * d, dtype=torch.bfloat16, gen=gen), randn(t, hk * d, dtype=torch.bfloat16, gen=gen)
    cache = build_cos_sin_cache(256, d, 1e4, device=DEVICE)
    pos = torch.arange(t, device=DEVICE)
    kc = torch.zeros(4, 16, hk, d, dtype=torch.bfloat16, device=DEVICE)
    vc = torch.zeros_like(kc)
    slots = torch.arange(t, device=DEVICE) * 3
    fns = {op: impl_of(registry, OPS[op]).fn for op in OPS}

    def step():
        y = fns["rms_norm"](x, w, 1e-6)
        y2, s = fns["fused_add_rms_norm"](x, res, w, 1e-6)
        a = fns["silu_and_mul"](gate_up)
        qr, kr = fns["rotary_embedding"](pos, q, k, cache, d, True)
        fns["write_kv_cache"](kr.view(t, hk, d), kr.view(t, hk, d), kc, vc, slots)
        return y, y2, s, a, qr, kr

    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = step()
    for buf in (x, res, gate_up, q, k):
        buf.copy_(torch.randn(buf.shape, generator=gen).to(buf.dtype))
    pos.add_(5)
    g.replay()
    kc_graph = kc.clone()
    fresh = step()
    for o, f in zip(outs, fresh, strict=True):
        assert torch.equal(o, f)
    assert torch.equal(kc, kc_graph)
