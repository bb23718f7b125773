"""Fixtures for the native CPU kernel tests: every ISA variant of this architecture (the ones this CPU lacks skipped
by name), and 1 or 2 threads."""

import pytest

from engine.core.ops import KernelRegistry
from engine.platforms.cpu import _native
from engine.platforms.cpu.kernels import register
from tests.isa_paths import kernel_isa_params


@pytest.fixture(params=kernel_isa_params(_native.supported_isas()))
def isa(request):
    """Each kernel ISA of this architecture in turn; one this CPU lacks is a skip naming it (tests/isa_paths.py)."""
    before = _native.isa()
    _native.set_isa(request.param)
    assert _native.isa() == request.param
    yield request.param
    _native.set_isa(before)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = _native.num_threads()
    _native.set_num_threads(request.param)
    yield request.param
    _native.set_num_threads(before)


@pytest.fixture(scope="module")
def registry():
    """A registry holding exactly the cpu platform's native kernels (none may be skipped here but the AMX-only one)."""
    reg = KernelRegistry("cpu")
    register(reg)
    assert all(s.name == "bf16_amx_experts" for s in reg.skipped()), reg.skipped()
    return reg
