"""A GGUF-quantized embedding table looks up the rows of any shape of ids: the dequantized rows of exactly those
tokens (the lookup gathers raw block rows with index_select; see Embedding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from engine.core.models.layers import Embedding
from engine.core.models.weights import QuantizedWeight
from engine.core.ops import registry as reg_mod
from engine.core.ops.registry import KernelRegistry
from engine.platforms.cpu.platform import CpuPlatform

VOCAB, COLS = 300, 64


@pytest.fixture
def cpu_registry():
    registry = KernelRegistry()
    CpuPlatform().register_kernels(registry)
    before = reg_mod._ACTIVE
    reg_mod.set_active_registry(registry)
    yield registry
    reg_mod.set_active_registry(before)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_1])
@pytest.mark.parametrize("ids_shape", [(1,), (10,), (64,), (3, 7)])
def test_quantized_lookup_equals_the_dequantized_rows(cpu_registry, qtype, ids_shape):
    values = np.random.default_rng().standard_normal((VOCAB, COLS)).astype(np.float32)
    raw = torch.from_numpy(quants.quantize(values, qtype))
    table = torch.from_numpy(quants.dequantize(raw.numpy(), qtype).reshape(VOCAB, COLS).copy())
    emb = Embedding(QuantizedWeight(raw, int(qtype), VOCAB, COLS), torch.float32)
    ids = torch.randint(0, VOCAB, ids_shape)
    got = emb(("test", ids_shape), ids)
    assert got.shape == (*ids_shape, COLS)
    torch.testing.assert_close(got, table[ids], rtol=1e-6, atol=1e-6)
