"""Triton MLA decode (platforms/triton_kernels/mla.py) against the op reference: DeepSeek's latent (512 + 64) and a
small one, heads fewer than, equal to and more than a program's 16 (a partial chunk), pages of 1, 16 and 64,
contexts off page multiples, split-KV forced into several partitions (and partitions past a sequence's end),
v_dim equal to Dqk (no rotary rest), fp32, bf16 and fp16; supports() declining with a reason. Under the Triton
interpreter on CPU when there is no GPU (small shapes)."""

from __future__ import annotations

import functools

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.mla import mla_decode
from engine.platforms.triton_kernels import mla as kmod
from tests.platforms.triton_kernels.conftest import CAPABILITY, DEVICE, run_case

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    reg = KernelRegistry("triton")
    kmod.register(reg, DEVICE, CAPABILITY)
    supports = kmod.make_supports(DEVICE, CAPABILITY)
    reg.register(mla_decode, functools.partial(kmod.mla_decode, partition_tokens=32), name="split32",
                 supports=supports)
    return reg


CASES = [  # (impl, params)
    ("triton_mla_decode", {"batch": 3, "heads": 16, "page_size": 16, "max_len": 70}),  # DeepSeek's 512 + 64
    ("triton_mla_decode", {"batch": 2, "heads": 20, "page_size": 64, "max_len": 100}),  # a partial head chunk
    ("triton_mla_decode", {"batch": 4, "heads": 4, "page_size": 1, "max_len": 24, "kv_lora_rank": 64,
                           "rope_dim": 32, "scale": 96 ** -0.5}),
    ("split32", {"batch": 3, "heads": 8, "page_size": 16, "max_len": 150, "kv_lora_rank": 128, "rope_dim": 32}),
    ("split32", {"batch": 5, "heads": 16, "page_size": 16, "max_len": 90, "min_len": 1}),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("impl,params", CASES, ids=lambda x: x if isinstance(x, str) else "-".join(
    f"{k}{v}" for k, v in x.items() if k in ("heads", "page_size", "max_len")))
def test_matches_reference(registry, impl, params, dtype, seed):
    run_case(registry, "mla_decode", impl, params, dtype, seed)


def test_values_are_the_whole_row_when_v_dim_is_dqk(registry, seed):
    """v_dim == Dqk: no rotary rest (the kernel's R_DIM = 0 path), as a model without decoupled rope would have."""
    from engine.core.ops.mla import _mla_decode_inputs, _mla_decode_ref

    gen = torch.Generator().manual_seed(seed)
    q, kv, bt, lens, scale, _ = _mla_decode_inputs({"batch": 2, "heads": 4, "page_size": 16, "max_len": 40,
                                                    "kv_lora_rank": 64, "rope_dim": 0}, torch.float32, DEVICE, gen)
    got = kmod.mla_decode(q, kv, bt, lens, scale, 64)
    torch.testing.assert_close(got, _mla_decode_ref(q, kv, bt, lens, scale, 64), atol=2e-5, rtol=2e-5)


def test_supports_declines_with_reasons(seed):
    from engine.core.ops.mla import _mla_decode_inputs

    supports = kmod.make_supports(DEVICE, CAPABILITY)
    gen = torch.Generator().manual_seed(seed)
    q, kv, bt, lens, scale, v = _mla_decode_inputs({"batch": 2, "heads": 4, "page_size": 16, "max_len": 20},
                                                   torch.float32, DEVICE, gen)
    assert supports(q, kv, bt, lens, scale, v) is True
    assert "device" in kmod.make_supports("xpu")(q, kv, bt, lens, scale, v)
    assert "dtypes" in supports(q.double(), kv.double(), bt, lens, scale, v)
    assert "v_dim" in supports(q, kv, bt, lens, scale, 2048)
    assert "int32" in supports(q, kv, bt.long(), lens, scale, v)
    assert "one entry per" in supports(q, kv, bt, lens[:1], scale, v)
    assert "kv_cache" in supports(q, kv[..., :100], bt, lens, scale, v)
