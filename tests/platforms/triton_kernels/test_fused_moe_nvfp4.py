"""Triton fused_moe_nvfp4 (experts kept packed, decoded tile by tile) against the op's reference: under the
interpreter on CPU tensors in CI, for real on a GPU."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops import OPS, KernelRegistry
from engine.platforms.triton_kernels import fp4_values
from engine.platforms.triton_kernels import fused_moe_nvfp4 as fmn
from tests.platforms.triton_kernels.conftest import CAPABILITY, DEVICE, run_case
from tests.platforms.triton_kernels.test_fused_moe import _cfg

OP = OPS["fused_moe_nvfp4"]


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    reg = KernelRegistry("triton")
    fmn.register(reg, DEVICE, CAPABILITY)
    return reg


@pytest.mark.parametrize("dtype", OP.dtypes, ids=str)
@pytest.mark.parametrize("case", OP.cases, ids=lambda c: c.name)
def test_op_cases(registry, case, dtype, seed):
    run_case(registry, "fused_moe_nvfp4", "triton_fused_moe_nvfp4", case.params, dtype, seed)


def test_split_k_and_k_tiles_across_scale_blocks(gen):
    """Split-K 2 in the second GEMM, K steps of 32 (two scale blocks each) with a partial last tile (hidden 80)."""
    params = dict(tokens=10, hidden=80, inter=96, experts=4, top_k=2, renormalize=True)
    args = OP.make_inputs(params, torch.float32, DEVICE, gen)
    got = fmn.triton_fused_moe_nvfp4(*args, config=_cfg(16, 64, 32, 64, 32, split_k=2))
    want = OP.reference(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)


def test_every_code_and_scale_decodes_exactly():
    """All 16 e2m1 codes and all 127 finite non-negative e4m3 scales (normal and subnormal) as the reference reads
    them, through the kernel's bit decoding."""
    import triton
    import triton.language as tl

    @triton.jit
    def decode(c_ptr, s_ptr, out_c, out_s):
        i = tl.arange(0, 128)
        tl.store(out_c + i, fp4_values.e2m1_values(tl.load(c_ptr + i, mask=i < 16, other=0)), mask=i < 16)
        tl.store(out_s + i, fp4_values.e4m3_values(tl.load(s_ptr + i, mask=i < 127, other=0)), mask=i < 127)

    codes = torch.arange(16, dtype=torch.int32, device=DEVICE)
    scale_bytes = torch.arange(127, dtype=torch.int32, device=DEVICE)
    out_c = torch.empty(16, device=DEVICE)
    out_s = torch.empty(127, device=DEVICE)
    decode[(1,)](codes, scale_bytes, out_c, out_s)
    from engine.core.ops.nvfp4 import e2m1_decode

    assert torch.equal(out_c.cpu(), e2m1_decode(codes.cpu().to(torch.uint8)))
    assert torch.equal(out_s.cpu(), scale_bytes.cpu().to(torch.uint8).view(torch.float8_e4m3fn).float())


def test_supports_declines_with_reasons(gen):
    args = list(OP.make_inputs(OP.cases[0].params, torch.float32, DEVICE, gen))
    supports = fmn.make_supports(DEVICE, CAPABILITY)
    assert supports(*args) is True
    one_global = args.copy()
    one_global[3] = args[3][:, 0]  # a per-expert scale: the op wants one per row
    assert "global_scale must be" in supports(*one_global)
    wrong_scales = args.copy()
    wrong_scales[2] = args[2].float()
    assert "float8_e4m3fn block scales" in supports(*wrong_scales)
    assert "xpu" in fmn.make_supports("xpu", None)(*args)
