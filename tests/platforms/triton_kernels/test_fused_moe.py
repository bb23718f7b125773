"""Triton fused MoE (fused_moe, fused_moe_fp8) against the ops' references: under the interpreter on CPU tensors in
CI, for real on a GPU. Shapes are small (the interpreter runs every program in numpy)."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops import OPS, Case, KernelRegistry
from engine.core.ops import fp8 as fp8_ops
from engine.core.ops import moe as moe_ops
from engine.core.testing.conformance import Check, ConformanceFailure, run_check
from engine.platforms.triton_kernels import fused_moe as fm
from tests.platforms.triton_kernels.conftest import CAPABILITY, DEVICE, run_case

MOE = OPS["fused_moe"]
FP8 = OPS["fused_moe_fp8"]


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    # this module alone (the conftest's triton_registry imports every kernel module of the package)
    reg = KernelRegistry("triton")
    fm.register(reg, DEVICE, CAPABILITY)
    return reg


def _moe(tokens, hidden, inter, experts, top_k, renormalize):
    return dict(tokens=tokens, hidden=hidden, inter=inter, experts=experts, top_k=top_k, renormalize=renormalize)


def _fp8(tokens, hidden, inter, experts, top_k, renormalize, fp8="e4m3fn", granularity="channel"):
    return dict(_moe(tokens, hidden, inter, experts, top_k, renormalize), fp8=fp8, granularity=granularity)


# ---------------------------------------------------------------------------------------------------------- fused_moe

@pytest.mark.parametrize("dtype", MOE.dtypes, ids=str)
@pytest.mark.parametrize("case", MOE.cases, ids=lambda c: c.name)
def test_fused_moe_op_cases(registry, case, dtype, seed):
    run_case(registry, "fused_moe", "triton_fused_moe", case.params, dtype, seed)


EXTRA_SHAPES = {
    "tokens_lt_experts_e16": (_moe(3, 32, 48, 16, 2, False), torch.float32),
    "not_multiple_of_block_m": (_moe(37, 48, 40, 8, 2, True), torch.bfloat16),
    "top1_renorm": (_moe(19, 32, 32, 8, 1, True), torch.float32),
    "top4_e8_no_renorm": (_moe(11, 64, 24, 8, 4, False), torch.bfloat16),
    "top_k_equals_experts": (_moe(5, 16, 16, 4, 4, True), torch.float32),
    "odd_sizes": (_moe(9, 40, 20, 6, 3, False), torch.bfloat16),
}


@pytest.mark.parametrize("name", list(EXTRA_SHAPES))
def test_fused_moe_more_shapes(registry, name, seed):
    params, dtype = EXTRA_SHAPES[name]
    run_case(registry, "fused_moe", "triton_fused_moe", params, dtype, seed)


@pytest.mark.parametrize("case", [MOE.cases[0], MOE.cases[3], MOE.cases[5]], ids=lambda c: c.name)
def test_fused_moe_fp16(case, gen):
    """fp16 is not among the op's conformance dtypes (its tolerances list fp32 and bf16); the kernel takes it."""
    args = MOE.make_inputs(case.params, torch.float16, DEVICE, gen)
    got = fm.triton_fused_moe(*args)
    want = MOE.reference(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=5e-3, rtol=5e-3)


@pytest.mark.parametrize("op_name, impl, params, dtype", [
    ("fused_moe", "triton_fused_moe", _moe(13, 48, 40, 8, 2, True), torch.bfloat16),
    ("fused_moe_fp8", "triton_fused_moe_fp8", _fp8(13, 48, 40, 8, 2, True), torch.float32),
], ids=["bf16", "fp8"])
def test_strided_inputs(registry, op_name, impl, params, dtype, seed):
    """Non-contiguous views of every input (the conformance kit's strided variant): computed right, not declined."""
    op = OPS[op_name]
    impl = next(i for i in registry.implementations(op) if i.name == impl)
    run_check(Check(op, impl, Case("strided", params), dtype, strided=True), DEVICE, seed)


def _cfg(block_m, bn1, bk1, bn2, bk2, group_m=1, split_k=None):
    return fm.MoeConfig(block_m, fm.GemmConfig(bn1, bk1, group_m, 4, 2), fm.GemmConfig(bn2, bk2, group_m, 4, 2),
                        split_k)


CONFIGS = {
    # several K steps in both GEMMs, partial last K tile, L2 grouping of 4 blocks
    "bm32_group4_ksteps": (_cfg(32, 32, 16, 16, 16, group_m=4), _moe(45, 40, 36, 8, 2, True)),
    # split-K 3 over 3 K tiles of the second GEMM (uneven: 40 = 16 + 16 + 8), top-1 through the reduction
    "split3_top1": (_cfg(16, 32, 32, 32, 16, split_k=3), _moe(21, 32, 40, 4, 1, False)),
    # split-K 2 with top-4, BLOCK_M 64 (one block holds several experts' padding)
    "bm64_split2_top4": (_cfg(64, 64, 32, 64, 16, group_m=2, split_k=2), _moe(10, 64, 32, 16, 4, True)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_moe_configs(name, gen):
    cfg, params = CONFIGS[name]
    for dtype in (torch.float32, torch.bfloat16):
        args = MOE.make_inputs(params, dtype, DEVICE, gen)
        got = fm.triton_fused_moe(*args, config=cfg)
        want = MOE.reference(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
        tol = MOE.tolerances[dtype]
        torch.testing.assert_close(got.cpu(), want, atol=tol.atol, rtol=tol.rtol)


def test_zero_tokens():
    x = torch.empty((0, 32), device=DEVICE)
    w13 = torch.randn(4, 64, 32, device=DEVICE)
    w2 = torch.randn(4, 32, 32, device=DEVICE)
    out = fm.triton_fused_moe(x, w13, w2, torch.empty((0, 4), device=DEVICE), 2, True)
    assert out.shape == (0, 32)


# ------------------------------------------------------------------------------------------------------ fused_moe_fp8

@pytest.mark.parametrize("dtype", FP8.dtypes, ids=str)
@pytest.mark.parametrize("case", FP8.cases, ids=lambda c: c.name)
def test_fused_moe_fp8_op_cases(registry, case, dtype, seed):
    if fp8_ops.FP8_DTYPES[case.params["fp8"]] not in _fp8_formats():
        pytest.skip(f"float8_{case.params['fp8']} is not this device's flavour")
    if case.name == "block_partial_edges":  # partial 128-blocks are the reference's alone: the kernel says so
        impl = next(i for i in registry.implementations(FP8) if i.name == "triton_fused_moe_fp8")
        args = FP8.make_inputs(dict(case.params), dtype, DEVICE, torch.Generator().manual_seed(seed))
        assert "whole 128-wide blocks" in impl.verdict(args)
        return
    run_case(registry, "fused_moe_fp8", "triton_fused_moe_fp8", case.params, dtype, seed)


FP8_EXACT = {
    "channel_fn_bf16": (_fp8(12, 48, 40, 8, 2, True), torch.bfloat16),
    "tensor_fnuz_fp32": (_fp8(7, 32, 24, 16, 4, False, "e4m3fnuz", "tensor"), torch.float32),
    "tensor3d_fn_fp16_top1": (_fp8(9, 40, 32, 4, 1, False, "e4m3fn", "tensor3d"), torch.float16),
    "block_fn_bf16": (_fp8(6, 256, 128, 8, 2, True, "e4m3fn", "block"), torch.bfloat16),
}


@pytest.mark.skipif(DEVICE != "cpu", reason="exact agreement is an interpreter property (GPUs sum differently)")
@pytest.mark.parametrize("name", list(FP8_EXACT))
def test_fp8_matches_reference_quantization_exactly(name, gen):
    """Under the interpreter the kernels make the reference's quantization decisions (same scales, same
    nearest-even FP8 and bf16 roundings): the results agree to float rounding, far inside the op tolerance,
    which is what shows the activation scales, FP8 rounding and intermediate dtype are the contract's."""
    params, dtype = FP8_EXACT[name]
    args = FP8.make_inputs(params, dtype, DEVICE, gen)
    got = fm.triton_fused_moe_fp8(*args)
    want = FP8.reference(*args)
    ulp = {torch.float32: 1e-5, torch.bfloat16: 2**-7, torch.float16: 2**-9}[dtype]
    tight = ((got.float() - want.float()).abs() <= 1e-4 + ulp * want.float().abs()).all(dim=1)
    # A different fp32 summation order can tip one intermediate rounding (~1 run in 300 here): that token's row
    # may then move by an FP8 step, never more than one row, and everything stays within the op tolerance.
    assert int((~tight).sum()) <= 1, f"{int((~tight).sum())} of {tight.numel()} token rows differ"
    tol = FP8.tolerances[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol.atol, rtol=tol.rtol)


def test_fp8_config_split_k(gen):
    params = _fp8(25, 32, 48, 8, 2, True)
    args = FP8.make_inputs(params, torch.bfloat16, DEVICE, gen)
    # an FP8 tl.dot takes K >= 32 on GPUs (16 is enough under the interpreter)
    got = fm.triton_fused_moe_fp8(*args, config=_cfg(32, 32, 32, 32, 32, group_m=2, split_k=2))
    want = FP8.reference(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    tol = FP8.tolerances[torch.bfloat16]
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=tol.atol, rtol=tol.rtol)


def _fp8_formats():
    if DEVICE == "cpu":
        return (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
    return (torch.float8_e4m3fnuz,) if torch.version.hip else (torch.float8_e4m3fn,)


@pytest.mark.parametrize("fp8", _fp8_formats(), ids=str)
def test_quantize_rows_bit_exact(fp8, gen):
    """Scales and codes equal quantize_fp8's bit for bit: every FP8 value and every midpoint between neighbours
    (ties go to the even code) at scale 1, and random rows of mixed magnitudes, strided. (The interpreter's own
    fp32 -> fp8 cast gets carries wrong: there the kernel rounds first.)"""
    qmax = torch.finfo(fp8).max
    codes = torch.arange(256, dtype=torch.uint8).view(fp8).float()
    codes = codes[torch.isfinite(codes)].unique()
    row = torch.cat([codes, (codes[1:] + codes[:-1]) / 2])
    row[0] = -qmax  # the row's amax is exactly fp8_max: scale 1
    rows = torch.randn(7, 300, generator=gen) * torch.exp2(torch.randint(-12, 12, (7, 1), generator=gen).float())
    for x in (row.clamp(-qmax, qmax)[None], rows, rows.to(torch.bfloat16)):
        x = x.to(DEVICE)
        wide = torch.zeros((x.shape[0], 2 * x.shape[1]), dtype=x.dtype, device=DEVICE)
        wide[:, ::2] = x
        for src in (x, wide[:, ::2]):
            q, s = fm._quantize_rows(src, fp8)
            q_ref, s_ref = fp8_ops.quantize_fp8(x, "token", fp8)
            assert torch.equal(s, s_ref[:, 0]), (s, s_ref)
            assert torch.equal(q.float(), q_ref.float())


# ------------------------------------------------------------------------------------------------ routing, alignment

@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("experts, top_k", [(8, 2), (6, 3), (16, 1)])
def test_route_kernel(experts, top_k, renormalize, gen):
    logits = moe_ops.distinct_logits(37, experts, torch.bfloat16, DEVICE, gen)
    weights, ids = fm._route(logits, top_k, renormalize)
    want_w, want_ids = moe_ops.route(logits.cpu(), top_k, renormalize)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids.cpu().long(), want_ids)
    torch.testing.assert_close(weights.cpu(), want_w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("tokens, experts, top_k, block_m, chunk", [
    (1, 8, 2, 16, None), (3, 16, 2, 16, None), (50, 8, 2, 16, 32), (33, 5, 3, 32, 16), (64, 64, 4, 16, None),
    (200, 8, 1, 64, 64),
])
def test_align(tokens, experts, top_k, block_m, chunk, gen):
    # larger batches leave the last two experts empty
    ids = torch.randint(0, experts - (2 if tokens > 20 else 0), (tokens, top_k), generator=gen, dtype=torch.int32)
    sorted_ids, block_expert, num_padded, max_padded = fm.align(ids.to(DEVICE), experts, block_m, chunk=chunk)
    sorted_ids, block_expert, total = sorted_ids.cpu(), block_expert.cpu(), int(num_padded.item())
    pairs = ids.numel()
    counts = torch.bincount(ids.reshape(-1).long(), minlength=experts)
    assert total == int(sum((c + block_m - 1) // block_m * block_m for c in counts.tolist()))
    assert max_padded >= total and max_padded % block_m == 0 and sorted_ids.shape == (max_padded,)
    valid = sorted_ids[sorted_ids < pairs]
    assert sorted(valid.tolist()) == list(range(pairs))  # every pair once
    assert bool((sorted_ids[total:] == pairs).all())
    flat = ids.reshape(-1)
    start = 0
    for e in range(experts):
        n, padded = counts[e].item(), (counts[e].item() + block_m - 1) // block_m * block_m
        seg = sorted_ids[start:start + padded]
        assert seg[:n].tolist() == (flat == e).nonzero().flatten().tolist()  # this expert's pairs, ascending
        assert bool((seg[n:] == pairs).all())
        assert block_expert[start // block_m:(start + padded) // block_m].tolist() == [e] * (padded // block_m)
        start += padded
    assert bool((block_expert[total // block_m:] == -1).all())


# ------------------------------------------------------------------------------------------- supports, registration

def _args(gen, dtype=torch.bfloat16, device=DEVICE):
    return MOE.make_inputs(MOE.cases[0].params, dtype, device, gen)


def test_supports_moe(gen):
    supports, _ = fm.make_supports(DEVICE, CAPABILITY)
    x, w13, w2, logits, k, rn = _args(gen)
    assert supports(x, w13, w2, logits, k, rn) is True
    assert supports(x.half(), w13.half(), w2.half(), logits, k, rn) is True
    assert "dtype" in supports(x.float(), w13, w2, logits, k, rn)
    assert "int" in supports(x, w13, w2, logits, 9, rn)
    assert "int" in supports(x, w13, w2, logits, True, rn)
    assert "router_logits" in supports(x, w13, w2, logits[:, :3], k, rn)
    assert "w2" in supports(x, w13, w2.transpose(1, 2), logits, k, rn)
    other = "cuda" if DEVICE == "cpu" else "cpu"
    assert "device" in fm.make_supports(other, None)[0](x, w13, w2, logits, k, rn)
    old, _ = fm.make_supports(DEVICE, (7, 5))
    assert "8.0" in old(x, w13, w2, logits, k, rn) and old(x.half(), w13.half(), w2.half(), logits, k, rn) is True
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in (x, w13, w2, logits, k, rn)]
    assert supports(*meta) is not True  # looks at metadata only: never reads values


def test_supports_fp8(gen, monkeypatch):
    args = FP8.make_inputs(FP8.cases[0].params, torch.bfloat16, DEVICE, gen)  # e4m3fn, per-channel
    fnuz = FP8.make_inputs(FP8.cases[2].params, torch.bfloat16, DEVICE, gen)  # e4m3fnuz
    x, w13_q, w13_s, w2_q, w2_s, logits, k, rn = args
    interp = fm.make_supports(DEVICE, CAPABILITY)[1]
    assert interp(*args) is True
    if DEVICE == "cpu":
        assert interp(*fnuz) is True  # the interpreter multiplies both formats
    assert "float32" in interp(x, w13_q, w13_s.half(), w2_q, w2_s, logits, k, rn)
    assert "shape" in interp(x, w13_q, w13_s[:, :3], w2_q, w2_s, logits, k, rn)
    assert "float8" in interp(x, w13_q, w13_s, w2_q.float().to(torch.float8_e4m3fnuz), w2_s, logits, k, rn)
    assert "dtype" in interp(x.double(), w13_q, w13_s, w2_q, w2_s, logits, k, rn)

    def verdict(device_type, capability, dtype):
        return fm._fp8_verdict(device_type, capability, dtype, torch.device(device_type))

    fn, fnuz8 = torch.float8_e4m3fn, torch.float8_e4m3fnuz
    assert verdict("cpu", None, fn) is True and verdict("cpu", None, fnuz8) is True  # the interpreter
    monkeypatch.setattr(torch.version, "hip", None)
    assert verdict("cuda", (9, 0), fn) is True and "8.9" in verdict("cuda", (8, 0), fn)
    assert "e4m3fn" in verdict("cuda", (9, 0), fnuz8) and "8.9" in verdict("cuda", None, fn)
    assert "xpu" in verdict("xpu", None, fn)
    monkeypatch.setattr(torch.version, "hip", "6.4")
    assert verdict("cuda", (9, 4), fnuz8) is True and verdict("cuda", (9, 4), fn) is not True
    assert verdict("cuda", (9, 5), fn) is True and verdict("cuda", (9, 5), fnuz8) is not True
    monkeypatch.setattr(fm, "_hip_arch", lambda device: "gfx942")  # rocm registers with capability None
    assert verdict("cuda", None, fnuz8) is True and verdict("cuda", None, fn) is not True
    monkeypatch.setattr(fm, "_hip_arch", lambda device: "gfx90a")
    assert "gfx90a" in verdict("cuda", None, fnuz8)


def test_register_and_dispatch(registry, gen):
    names = {(i.op, i.name) for op in ("fused_moe", "fused_moe_fp8") for i in registry.implementations(op)}
    assert names == {("fused_moe", "triton_fused_moe"), ("fused_moe_fp8", "triton_fused_moe_fp8")}
    assert registry.select(MOE, _args(gen)).name == "triton_fused_moe"
    fp8_args = FP8.make_inputs(FP8.cases[0].params, torch.float32, DEVICE, gen)
    assert registry.select(FP8, fp8_args).name == "triton_fused_moe_fp8"
    # a declined call goes to the reference
    assert registry.select(MOE, _args(gen, device="meta")).name == "reference"


def test_conformance_failure_is_caught(registry, seed, monkeypatch):
    """The harness used above does fail a wrong kernel (here: routing weights not applied)."""
    monkeypatch.setattr(fm, "_route", lambda lg, k, rn: (torch.ones(lg.shape[0], k, device=lg.device),
                                                         torch.topk(lg.float(), k, dim=-1)[1].to(torch.int32)))
    with pytest.raises(ConformanceFailure):
        run_case(registry, "fused_moe", "triton_fused_moe", MOE.cases[0].params, torch.float32, seed)


# ------------------------------------------------------------------------------------------------------- GPU only

@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
def test_cuda_graph_capture_and_replay(gen):
    """No host sync anywhere: the op captures into a CUDA graph, and a replay on new inputs is right."""
    params = _moe(24, 128, 256, 8, 2, True)
    x, w13, w2, logits, k, rn = MOE.make_inputs(params, torch.bfloat16, DEVICE, gen)
    fm.triton_fused_moe(x, w13, w2, logits, k, rn)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fm.triton_fused_moe(x, w13, w2, logits, k, rn)
    x2, _, _, logits2, _, _ = MOE.make_inputs(params, torch.bfloat16, DEVICE, gen)
    x.copy_(x2)
    logits.copy_(logits2)
    graph.replay()
    want = MOE.reference(x.cpu(), w13.cpu(), w2.cpu(), logits.cpu(), k, rn)
    torch.testing.assert_close(out.cpu(), want, atol=2e-2, rtol=2e-2)
