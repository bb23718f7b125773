"""fp16 activations through the cpu GGUF wrappers (the default model in fp16 on the ppc platform): x widened to fp32
for the native kernels, y rounded to fp16 once, against the ops' references (which define the result that way) on
fresh random inputs: every conformance case (decode rows, SmolLM2's shapes, the Q8_0 head, prefills above the
64-row switch to dequantize + GEMM), and the fp16 dequantize."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops.gguf_kquants import K_QTYPES
from engine.core.ops.gguf_q8act import gguf_linear_q8act
from engine.core.ops.gguf_quant import gguf_dequantize, gguf_linear
from engine.core.testing.conformance import fresh_seed

FP16 = torch.float16
LINEAR_TOL = dict(atol=2e-3, rtol=2e-3)  # one fp16 rounding of O(1) outputs, fp32 sums in another order


@pytest.mark.parametrize("op,impl,kquants", [(gguf_linear, "fused", False), (gguf_linear, "kquant", True),
                                             (gguf_linear, "dequant_matmul", None),
                                             (gguf_linear_q8act, "native", False)],
                         ids=lambda v: getattr(v, "name", v))
def test_gguf_linears_take_fp16_activations(registry, op, impl, kquants):
    """Each implementation on the op's cases of the types it is for (kquants: the K-quants only, False: none of
    them, None: all)."""
    kernel = next(i for i in registry.implementations(op) if i.name == impl)
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    cases = [c for c in op.cases if kquants is None or (c.params["qtype"] in K_QTYPES) == kquants]
    assert cases
    for case in cases:
        x, raw, qtype, cols = op.make_inputs(dict(case.params), FP16, "cpu", gen)
        assert kernel.verdict((x, raw, qtype, cols)) is None, case.name
        got = kernel.fn(x, raw, qtype, cols)
        assert got.dtype == FP16 and got.shape == (x.shape[0], raw.shape[0]), case.name
        torch.testing.assert_close(got, op.reference(x, raw, qtype, cols), **LINEAR_TOL,
                                   msg=lambda m, c=case.name: f"{c} (ENGINE_TEST_SEED={seed}): {m}")
    assert registry.select(op, (x, raw, qtype, cols)).platform == "cpu"


def test_gguf_dequantize_to_fp16(registry):
    gen = torch.Generator().manual_seed(fresh_seed())
    tol = gguf_dequantize.tolerances[FP16]
    for case in gguf_dequantize.cases:
        args = gguf_dequantize.make_inputs(dict(case.params), FP16, "cpu", gen)
        impl = registry.select(gguf_dequantize, args)
        assert impl.name == "native", case.name
        torch.testing.assert_close(impl.fn(*args), gguf_dequantize.reference(*args), atol=tol.atol, rtol=tol.rtol)
