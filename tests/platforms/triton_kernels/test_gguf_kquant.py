"""Triton K-quant kernels (platforms/triton_kernels/gguf_kquant.py) against the op references on fresh random
super-blocks: Q4_K, Q5_K and Q6_K, every dtype the module claims, decode and prefill rows, odd N, several
super-blocks per row; the dequantize bit-exact; supports() declining the 32-element types and bad shapes. Under the
Triton interpreter on CPU when there is no GPU."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.gguf_kquants import K_QTYPES, Q4_K
from engine.core.ops.gguf_quant import Q4_0, _gguf_dequantize_ref, random_gguf_weight
from engine.platforms.triton_kernels import gguf_kquant as kmod
from tests.platforms.triton_kernels.conftest import CAPABILITY, DEVICE, run_case

QNAME = {q: name for q, (name, _) in K_QTYPES.items()}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    reg = KernelRegistry("triton")
    kmod.register(reg, DEVICE, CAPABILITY)
    return reg


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("qtype", list(K_QTYPES), ids=QNAME.get)
def test_dequantize_is_bit_exact(qtype, dtype, seed):
    raw = random_gguf_weight(37, 768, qtype, DEVICE, torch.Generator().manual_seed(seed))
    got = kmod.dequantize(raw, qtype, 768, dtype)
    want = _gguf_dequantize_ref(raw, qtype, 768, dtype)
    assert got.dtype == dtype and torch.equal(got, want), f"seed {seed}: {(got.float() - want.float()).abs().max()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("qtype", list(K_QTYPES), ids=QNAME.get)
@pytest.mark.parametrize("m,n,k", [(1, 40, 512), (3, 33, 256), (70, 64, 768)])
def test_linear_matches_reference(registry, qtype, m, n, k, dtype, seed):
    run_case(registry, "gguf_linear", "triton_gguf_kquant_linear", {"qtype": qtype, "m": m, "n": n, "k": k}, dtype,
             seed)


def test_linear_takes_fp16_and_leading_dims(seed):
    gen = torch.Generator().manual_seed(seed)
    raw = random_gguf_weight(24, 512, Q4_K, DEVICE, gen, scale=512 ** -0.5)
    x = torch.randn(2, 3, 512, generator=gen).to(DEVICE, torch.float16)
    got = kmod.linear(x, raw, Q4_K, 512)
    want = x.float() @ _gguf_dequantize_ref(raw, Q4_K, 512, torch.float32).t()
    assert got.shape == (2, 3, 24) and got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


def test_supports_declines_what_it_does_not_take(registry):
    from engine.core.ops.gguf_quant import gguf_linear

    impl = next(i for i in registry.implementations(gguf_linear) if i.name == "triton_gguf_kquant_linear")
    x = torch.randn(2, 256, device=DEVICE)
    raw = torch.zeros(3, 144, dtype=torch.uint8, device=DEVICE)
    assert impl.verdict((x, raw, Q4_K, 256)) is None
    assert "qtype 2 not supported (Q4_K=12, Q5_K=13, Q6_K=14)" in impl.verdict((x, raw, Q4_0, 256))
    assert "does not hold" in impl.verdict((x, raw[:, :100], Q4_K, 256))
    assert "x must be" in impl.verdict((x[:, :128], raw, Q4_K, 256))
