"""fused_moe / route against an independent per-token float64 loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.core.ops import moe

DTYPES = [torch.float32, torch.bfloat16]


def _loop_moe(x, w13, w2, logits, top_k, renormalize):
    """Per token: float64 softmax, pick the top_k by sorting, SwiGLU each chosen expert, weighted sum."""
    x, w13, w2, logits = (t.double().numpy() for t in (x, w13, w2, logits))
    inter = w13.shape[1] // 2
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        exps = [math.exp(v - max(logits[t])) for v in logits[t]]
        probs = [v / sum(exps) for v in exps]
        chosen = sorted(range(len(probs)), key=lambda e: -probs[e])[:top_k]
        norm = sum(probs[e] for e in chosen) if renormalize else 1.0
        for e in chosen:
            gate = w13[e, :inter] @ x[t]
            up = w13[e, inter:] @ x[t]
            h = gate / (1.0 + np.exp(-gate)) * up
            out[t] += probs[e] / norm * (w2[e] @ h)
    return torch.from_numpy(out)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", moe.fused_moe.cases, ids=lambda c: c.name)
def test_fused_moe_matches_per_token_loop(case, dtype, gen):
    args = moe.fused_moe.make_inputs(case.params, dtype, "cpu", gen)
    got = moe.fused_moe.reference(*args)
    assert got.dtype == dtype and got.shape == args[0].shape
    want = _loop_moe(*args)
    # fp32: summation order only; bf16: one final rounding of the exact result (half a bf16 ulp, 2**-9).
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-3, rtol=2**-8)
    torch.testing.assert_close(got.double(), want, **tol)


@pytest.mark.parametrize("renormalize", [True, False])
def test_route_against_float64(renormalize, gen):
    logits = moe.distinct_logits(11, 8, torch.bfloat16, "cpu", gen)
    weights, ids = moe.route(logits, 3, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64 and ids.shape == (11, 3)
    lg = logits.double().numpy()
    for t in range(lg.shape[0]):
        probs = np.exp(lg[t] - lg[t].max())
        probs /= probs.sum()
        top = np.argsort(-probs)[:3]
        assert ids[t].tolist() == top.tolist()
        want = probs[top] / (probs[top].sum() if renormalize else 1.0)
        np.testing.assert_allclose(weights[t].double().numpy(), want, rtol=1e-6)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(11))


def test_generated_logits_have_no_near_ties(gen):
    for dtype in DTYPES:
        logits = moe.distinct_logits(50, 16, dtype, "cpu", gen).float()
        gaps = logits.sort(dim=-1).values.diff(dim=-1)
        assert gaps.min() > 0.1


def test_torch_op_and_fake(gen):
    args = moe.fused_moe.make_inputs(moe.fused_moe.cases[0].params, torch.bfloat16, "cpu", gen)
    torch.testing.assert_close(torch.ops.engine.fused_moe(*args), moe.fused_moe(*args), atol=0, rtol=0)
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    out = moe.fused_moe.torch_op(*meta)
    assert out.shape == args[0].shape and out.dtype == torch.bfloat16 and out.device.type == "meta"
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        out = moe.fused_moe.torch_op(*fake)
        assert out.shape == args[0].shape and out.dtype == torch.bfloat16


def test_bad_inputs_raise(gen):
    op = moe.fused_moe
    x, w13, w2, logits, k, rn = op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen)
    with pytest.raises(ValueError, match="top_k"):
        moe.fused_moe.reference(x, w13, w2, logits, 9, rn)
    with pytest.raises(ValueError, match="w2"):
        moe.fused_moe.reference(x, w13, w2.transpose(1, 2), logits, k, rn)
    with pytest.raises(ValueError, match="router_logits"):
        moe.fused_moe.reference(x, w13, w2, logits[:, :4], k, rn)
    with pytest.raises(ValueError, match="w13"):
        moe.fused_moe.reference(x, w13[:, :, :10], w2, logits, k, rn)
    with pytest.raises(TypeError, match="dtype"):
        moe.fused_moe.reference(x.bfloat16(), w13, w2, logits, k, rn)
