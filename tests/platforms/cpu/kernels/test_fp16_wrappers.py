"""The cpu kernel wrappers on fp16 storage (RMSNorm, fused add + RMSNorm, SiLU-and-mul, rotary, rotary with the KV
write, paged attention, the KV-cache write, the dense fp16 linear), on every ISA variant of this CPU (what
ENGINE_CPU_ISA selects), against
the ops' references on fresh random inputs: each op's conformance cases (several shapes, contiguous and strided),
through the conformance kit's own check. The ppc platform runs these same wrappers on its VSX build."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops.registry import KernelRegistry
from engine.core.testing.conformance import collect_checks, compare, fresh_seed, run_check
from engine.platforms.cpu.kernels import linear as cpu_linear

STORAGE_OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding", "rotary_write_kv",
               "paged_attention_decode", "paged_attention_prefill", "write_kv_cache")
MAX_LINEAR_MACS = 1 << 22  # the linear cases that stay cheap on the scalar ISA (the "large" one does not)
CPU = torch.device("cpu")


def _fp16_checks(registry, ops, impl_name):
    return [c for c in collect_checks(registry, ops, strided=False)
            if c.dtype == torch.float16 and c.impl.name == impl_name]


def _clone(args, only=None):
    """The arguments with fresh copies of the tensors (of those at the indices ``only``, when given)."""
    return tuple(a.clone() if isinstance(a, torch.Tensor) and (only is None or i in only) else a
                 for i, a in enumerate(args))


def _outputs(op, args, result):
    if op.mutates:
        return [args[i] for i in op.mutates]
    return [result] if isinstance(result, torch.Tensor) else list(result)


@pytest.fixture(scope="module")
def storage_cases(registry):
    """(check, inputs, reference outputs) of every fp16 conformance case the native kernels accept, drawn once (the
    references dominate the cost) and shared by every ISA; the seed is in the failure messages."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    cases, declined = [], []
    for check in _fp16_checks(registry, STORAGE_OPS, "native"):
        op = check.op
        args = op.make_inputs(dict(check.case.params), torch.float16, CPU, gen)
        why = check.impl.verdict(args)
        if why is not None:
            declined.append(f"{check.id}: {why}")
            continue
        ref_args = _clone(args)
        cases.append((check, args, _outputs(op, ref_args, op.reference(*ref_args))))
    # The one fp16 case the kernels leave to the reference: a rotary cos/sin cache in fp16 (the model's is fp32).
    assert all("cos_sin_cache must be" in d for d in declined), declined
    return seed, cases


def test_storage_ops_in_fp16_match_the_references(storage_cases, isa):
    seed, cases = storage_cases
    for check, args, want in cases:
        impl_args = _clone(args, only=check.op.mutates)  # the kernels only read the others
        got = _outputs(check.op, impl_args, check.impl.fn(*impl_args))
        compare(check.op, torch.float16, got, want, f"{check.id} on {isa} (ENGINE_TEST_SEED={seed})")
    assert {c.op.name for c, _, _ in cases} == set(STORAGE_OPS)
    assert min(sum(c.op.name == op for c, _, _ in cases) for op in STORAGE_OPS) >= 2  # several shapes each


def test_native_fp16_linear_matches_the_reference_at_every_m(isa):
    reg = KernelRegistry("cpu")
    cpu_linear.register(reg, cpu_linear.EVERY_M)  # the ppc platform's registration: every M
    checks = [c for c in collect_checks(reg, ("linear",))
              if c.dtype == torch.float16 and c.impl.name == "native_fp16"
              and c.case.params["m"] * c.case.params["n"] * c.case.params["k"] <= MAX_LINEAR_MACS]
    assert {c.case.params["m"] for c in checks} >= {1, 3, 16, 33} and any(c.strided for c in checks)
    seed = fresh_seed()
    for check in checks:  # contiguous and strided views, bias and none
        run_check(check, CPU, seed)


@pytest.mark.parametrize("shape", [(2, 3, 40), (1, 1, 7), (5, 64)], ids=str)
def test_native_fp16_linear_leading_dims_and_strides(isa, shape):
    gen = torch.Generator().manual_seed(fresh_seed())
    k, n = shape[-1], 19
    x = torch.randn(*shape, generator=gen).half()
    w = (torch.randn(n, 2 * k, generator=gen) * k ** -0.5).half()[:, ::2]  # no unit stride: copied
    b = torch.randn(2 * n, generator=gen).half()[::2]
    want = (x.float() @ w.float().T + b.float()).half()
    got = cpu_linear.native_fp16_linear(x, w, b)
    assert got.shape == (*shape[:-1], n) and got.dtype == torch.float16
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(cpu_linear.native_fp16_linear(x, w, None), (x.float() @ w.float().T).half(),
                               atol=2e-3, rtol=2e-3)
