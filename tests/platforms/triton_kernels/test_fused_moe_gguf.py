"""Triton fused_moe_gguf (experts as raw GGUF rows, decoded tile by tile) against the op's reference: under the
interpreter on CPU tensors in CI, for real on a GPU."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops import OPS, KernelRegistry
from engine.core.ops.gguf_kquants import Q4_K, Q5_K, Q6_K
from engine.core.ops.gguf_quant import Q4_0, Q4_1, Q8_0
from engine.platforms.triton_kernels import fused_moe_gguf as fmg
from tests.platforms.triton_kernels.conftest import CAPABILITY, DEVICE, run_case
from tests.platforms.triton_kernels.test_fused_moe import _cfg

OP = OPS["fused_moe_gguf"]


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    reg = KernelRegistry("triton")
    fmg.register(reg, DEVICE, CAPABILITY)
    return reg


def _params(w13_qtype, w2_qtype, tokens, hidden, inter, experts, top_k, renormalize=True):
    return dict(w13_qtype=w13_qtype, w2_qtype=w2_qtype, tokens=tokens, hidden=hidden, inter=inter, experts=experts,
                top_k=top_k, renormalize=renormalize)


@pytest.mark.parametrize("dtype", OP.dtypes, ids=str)
@pytest.mark.parametrize("case", OP.cases, ids=lambda c: c.name)
def test_op_cases(registry, case, dtype, seed):
    run_case(registry, "fused_moe_gguf", "triton_fused_moe_gguf", case.params, dtype, seed)


# every type on each side, K tiles that straddle blocks and end partway (hidden 96 with BLOCK_K 64), Q5_K
MORE = {
    "q8_0_odd_hidden": (_params(Q8_0, Q4_1, 7, 96, 32, 6, 3, False), torch.bfloat16),
    "q5_k_both": (_params(Q5_K, Q5_K, 4, 256, 256, 4, 2), torch.float32),
    "q6_k_gate_q4_k_down": (_params(Q6_K, Q4_K, 3, 256, 256, 8, 2), torch.bfloat16),
    "q4_0_many_tokens": (_params(Q4_0, Q4_0, 37, 64, 32, 8, 2), torch.float32),
}


@pytest.mark.parametrize("name", list(MORE))
def test_more_types_and_shapes(registry, name, seed):
    params, dtype = MORE[name]
    run_case(registry, "fused_moe_gguf", "triton_fused_moe_gguf", params, dtype, seed)


@pytest.mark.parametrize("qtype", [Q4_1, Q4_K])
def test_split_k_and_several_k_steps(qtype, gen):
    """Split-K 2 over the second GEMM and K steps of 32 through 64-wide blocks / 256-wide super-blocks: every tile
    starts inside a (super-)block, at its own offset."""
    params = _params(qtype, qtype, 10, 256, 256, 4, 2)
    cfg = _cfg(16, 64, 32, 64, 32, split_k=2)
    args = OP.make_inputs(params, torch.float32, DEVICE, gen)
    got = fmg.triton_fused_moe_gguf(*args, config=cfg)
    want = OP.reference(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)


def test_supports_declines_with_reasons(registry, gen):
    args = list(OP.make_inputs(OP.cases[0].params, torch.float32, DEVICE, gen))
    supports = fmg.make_supports(DEVICE, CAPABILITY)
    assert supports(*args) is True
    bad_type = args.copy()
    bad_type[2] = 99
    assert "qtype 99 is not supported" in supports(*bad_type)
    bad_rows = args.copy()
    bad_rows[3] = args[3][:, :, :-2]
    assert "expert weights" in supports(*bad_rows)
    int_x = args.copy()
    int_x[0] = args[0].to(torch.int32)
    assert "float" in supports(*int_x)
    wrong_device = fmg.make_supports("xpu", None)
    assert "xpu" in wrong_device(*args)
