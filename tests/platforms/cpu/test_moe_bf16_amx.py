"""The AMX-gated bf16 expert loop: the gate on the CPU flag, when it is chosen, and its results against the op's
reference within the bf16 tolerance (random inputs, several shapes)."""

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.moe import distinct_logits, fused_moe
from engine.platforms.cpu import read_cpuinfo
from engine.platforms.cpu.kernels import moe_bf16_amx

AMX = moe_bf16_amx.has_amx_bf16(read_cpuinfo())


def test_gate_reads_the_cpu_flag():
    assert moe_bf16_amx.has_amx_bf16("processor : 0\nflags : fpu avx512f amx_bf16 amx_tile\n")
    assert not moe_bf16_amx.has_amx_bf16("processor : 0\nflags : fpu avx2 avx512f\n")
    assert not moe_bf16_amx.has_amx_bf16("")
    reg = KernelRegistry("cpu")
    moe_bf16_amx.register(reg, "flags : avx2\n")
    assert not reg.implementations(fused_moe) and "AMX-BF16" in reg.skipped(fused_moe)[0].reason


@pytest.mark.parametrize("t,e,k,renorm", [(33, 8, 2, True), (100, 4, 1, False), (64, 6, 3, True)])
def test_matches_reference(t, e, k, renorm, gen):
    hidden, inter = 128, 96
    x = torch.randn(t, hidden, generator=gen).bfloat16()
    w13 = (torch.randn(e, 2 * inter, hidden, generator=gen) * hidden ** -0.5).bfloat16()
    w2 = (torch.randn(e, hidden, inter, generator=gen) * inter ** -0.5).bfloat16()
    logits = distinct_logits(t, e, torch.float32, "cpu", gen)
    got = moe_bf16_amx._experts_bf16(x, w13, w2, logits, k, renorm)
    want = fused_moe.reference(x, w13, w2, logits, k, renorm)
    tol = fused_moe.tolerances[torch.bfloat16]
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.skipif(not AMX, reason="this CPU has no AMX-BF16")
def test_chosen_for_bf16_prefill_only(registry, gen):
    e, hidden, inter = 4, 64, 32
    w13, w2 = torch.randn(e, 2 * inter, hidden).bfloat16(), torch.randn(e, hidden, inter).bfloat16()
    for t, dtype, want in [(64, torch.bfloat16, "bf16_amx_experts"), (8, torch.bfloat16, "native"),
                           (64, torch.float32, "native")]:
        args = (torch.randn(t, hidden).to(dtype), w13.to(dtype), w2.to(dtype), torch.randn(t, e), 2, True)
        assert registry.select(fused_moe, args).name == want
