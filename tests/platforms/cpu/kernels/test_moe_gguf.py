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


def test_each_expert_runs_on_the_native_gguf_kernel(registry, gen, monkeypatch):
    """Decode (one token, top-2): two experts, each one native raw-row GGUF GEMM for gate/up and one for down; the
    answer is the reference's."""
    from engine.platforms.cpu import _native

    calls = []
    native = _native.gguf_linear
    monkeypatch.setattr(_native, "gguf_linear", lambda *a: calls.append(a[3]) or native(*a))
    args = OP.make_inputs(dict(OP.cases[0].params, tokens=1), torch.float32, "cpu", gen)
    impl = _impl(registry)
    assert impl.supports(*args) is True
    torch.testing.assert_close(impl.fn(*args), OP.reference(*args), atol=1e-4, rtol=1e-4)
    assert calls == [1, 1, 1, 1]  # M = 1 for each of the 2 experts' 2 GEMMs


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


def test_repeated_calls_make_no_weight_copies(registry, gen):
    """Expert slices are new tensors every call: a kernel keyed by the tensor (the packed copies of the dense layers)
    would copy every expert on every call, into memory that is never given back."""
    from engine.platforms.cpu.kernels import gguf

    args = OP.make_inputs(dict(OP.cases[0].params, tokens=3), torch.float32, "cpu", gen)
    impl = _impl(registry)
    impl.fn(*args)
    arena_before, packed_before = gguf._arena[1], len(gguf._PACKED)
    for _ in range(3):
        impl.fn(*args)
    assert (gguf._arena[1], len(gguf._PACKED)) == (arena_before, packed_before)
