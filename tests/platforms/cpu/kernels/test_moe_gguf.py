"""The CPU's fused_moe_gguf: tokens grouped by expert, each expert's GEMMs on the native GGUF kernels."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops import OPS, Case
from engine.core.testing.conformance import Check, run_check

OP = OPS["fused_moe_gguf"]


def _impl(registry):
    return next(i for i in registry.implementations(OP) if i.name == "native_per_expert")


@pytest.mark.parametrize("dtype", OP.dtypes, ids=str)
@pytest.mark.parametrize("case", OP.cases, ids=lambda c: c.name)
def test_op_cases_on_every_isa(registry, isa, case, dtype, seed):
    run_check(Check(OP, _impl(registry), Case("test", case.params), dtype), "cpu", seed)


def test_each_expert_runs_on_a_native_gguf_kernel_not_a_reference(registry, gen):
    """The per-expert GEMMs go to the registry's native gguf_linear (decode: the M = 1 GEMV), and the answer is the
    reference's."""
    params = dict(OP.cases[0].params, tokens=1)
    args = OP.make_inputs(params, torch.float32, "cpu", gen)
    impl = _impl(registry)
    assert impl.supports(*args) is True
    got = impl.fn(*args)
    torch.testing.assert_close(got, OP.reference(*args), atol=1e-4, rtol=1e-4)
    x, w13, qtype = args[0], args[1], args[2]
    chosen = registry.select(OPS["gguf_linear"], (x, w13[0], qtype, x.shape[1]))
    assert chosen.name != "reference" and chosen.fn is not OPS["gguf_linear"].reference


def test_declines_with_reasons(registry, gen):
    args = list(OP.make_inputs(OP.cases[0].params, torch.float32, "cpu", gen))
    supports = _impl(registry).supports
    half = args.copy()
    half[0] = args[0].half()
    assert "fp32 or bf16" in supports(*half)
    mismatched = args.copy()
    mismatched[4] = 14  # Q6_K: 256-wide super-blocks, but I = 96
    assert "multiple of 256" in supports(*mismatched)
    too_many = args.copy()
    too_many[6] = 99
    assert "top_k must be an int in [1, 8]" in supports(*too_many)
