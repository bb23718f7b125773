"""The kit's shape generators: the same cases for the same seed, and no tensor past MAX_TENSOR_ELEMENTS at an
accelerator's budget (a device run once drew 2^31-element expert weights and ran out of memory)."""

from __future__ import annotations

import random

import pytest

from engine.core.ops import OPS
from engine.core.ops.shapes import MAX_TENSOR_ELEMENTS, elements
from engine.core.testing.conformance import DEVICE_BUDGET, HOST_BUDGET, op_cases


def test_element_budget_is_capped_on_an_accelerator_only():
    assert elements(HOST_BUDGET) == HOST_BUDGET >> 5
    assert elements(DEVICE_BUDGET) == MAX_TENSOR_ELEMENTS < DEVICE_BUDGET >> 5


@pytest.mark.parametrize("name", sorted(OPS))
def test_draws_repeat_for_a_seed(name):
    seed = random.SystemRandom().randrange(2**31)
    first = [(c.name, c.params) for c in op_cases(OPS[name], seed, DEVICE_BUDGET)]
    assert first == [(c.name, c.params) for c in op_cases(OPS[name], seed, DEVICE_BUDGET)]


@pytest.mark.parametrize("name", ["fused_moe", "fused_moe_fp8", "fused_moe_gguf", "fused_moe_nvfp4"])
def test_expert_weights_fit_on_an_accelerator(name):
    for _ in range(20):
        seed = random.SystemRandom().randrange(2**31)
        for case in op_cases(OPS[name], seed, DEVICE_BUDGET):
            p = case.params
            assert 3 * p["experts"] * p["hidden"] * p["inter"] <= 2 * MAX_TENSOR_ELEMENTS, (seed, case.name, p)


@pytest.mark.parametrize("name", ["linear", "fp8_linear", "nvfp4_linear", "gguf_linear_q8act"])
def test_weights_fit_on_an_accelerator(name):
    for _ in range(20):
        seed = random.SystemRandom().randrange(2**31)
        for case in op_cases(OPS[name], seed, DEVICE_BUDGET):
            p = case.params
            if "n" in p and "k" in p:
                assert p["n"] * p["k"] <= MAX_TENSOR_ELEMENTS, (seed, case.name, p)
