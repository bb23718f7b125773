"""The fused rotary + KV write (platforms/triton_kernels/rotary.py) against its op's reference (every case and dtype,
contiguous and strided); and the attention block on the Triton kernels: it fuses the two ops, keeps q, k and v as
views of the qkv projection, and gives the output and cache of the plain-torch references."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.rotary_kv import rotary_write_kv
from engine.core.testing.conformance import Check, run_check
from tests.core.models.test_attention_views import HIDDEN, attention_layer, prefill_batch, run_attention
from tests.platforms.triton_kernels.conftest import DEVICE

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", rotary_write_kv.cases, ids=lambda c: c.name)
def test_op_cases(triton_registry, case, dtype, strided, seed):
    (impl,) = triton_registry.implementations(rotary_write_kv)
    assert impl.name == "triton_rotary_write_kv"
    run_check(Check(rotary_write_kv, impl, case, dtype, strided=strided), DEVICE, seed)


@pytest.mark.parametrize("tokens", [1, 6])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3"])
def test_attention_fuses_and_takes_views(triton_registry, qk_norm, tokens, gen):
    attn = attention_layer(qk_norm, gen, DEVICE)
    x, batch = torch.randn(tokens, HIDDEN, generator=gen).bfloat16().to(DEVICE), prefill_batch(tokens, DEVICE)
    out, kv, plan = run_attention(attn, triton_registry, x, batch)
    assert plan == (True, True, True)
    want, kv_want, plan_bare = run_attention(attn, KernelRegistry("bare"), x, batch)
    assert plan_bare == (False, False, False)
    tol = dict(atol=2e-2, rtol=2e-2)  # Triton kernels against plain-torch references, bf16
    torch.testing.assert_close(out.float().cpu(), want.float().cpu(), **tol)
    for a, b in zip(kv, kv_want, strict=True):
        torch.testing.assert_close(a.float().cpu(), b.float().cpu(), **tol)
