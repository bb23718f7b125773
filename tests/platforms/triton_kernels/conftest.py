"""Fixtures for the portable Triton kernels: on a GPU they run for real; without one (CI) they run
under the Triton interpreter on CPU tensors, which must be switched on before any kernel is defined."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # also set by tests/conftest.py, before any test module is collected
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton", reason="the Triton kernel tests need triton (pip install -e '.[test]')")

from engine.core.ops import OPS, Case, KernelRegistry  # noqa: E402
from engine.core.testing.conformance import Check, run_check  # noqa: E402
from engine.platforms import triton_kernels  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CAPABILITY = torch.cuda.get_device_capability() if DEVICE == "cuda" else None


@pytest.fixture(scope="session")
def triton_registry() -> KernelRegistry:
    """Every portable Triton kernel, registered for this run's device (cpu under the interpreter)."""
    reg = KernelRegistry("triton")
    triton_kernels.register(reg, DEVICE, CAPABILITY)
    # only capability-gated native paths may be missing (the FP4 tensor-core path below Blackwell, torch._scaled_mm
    # off CUDA)
    assert all(s.name.startswith("native_") or s.name == "scaled_mm" for s in reg.skipped()), reg.skipped()
    return reg


def run_case(registry: KernelRegistry, op_name: str, impl_name: str, params: dict, dtype, seed: int) -> float:
    """Check one implementation against its op's reference on the inputs the op generates for ``params``;
    returns the max abs error (raises ConformanceFailure, or Unsupported if supports() declines)."""
    op = OPS[op_name]
    impl = next((i for i in registry.implementations(op) if i.name == impl_name), None)
    assert impl is not None, f"{impl_name} is not registered for {op_name}: {registry.implementations(op)}"
    return run_check(Check(op, impl, Case("test", params), dtype), DEVICE, seed)


# Gaps of older Triton interpreters (not of the kernels): Triton 3.6's interpreter turns a one-element array into an
# index with int(), which numpy >= 2.4 refuses, and has no float8_e4m3fnuz. Triton 3.9 (torch 2.13) has neither gap;
# a GPU runs the kernels compiled, never interpreted.
INTERPRETER_GAPS = ("only 0-dimensional arrays can be converted to Python scalars",
                    "fail to convert fp8e4b8 to ir type")


def interpreter_gap(exc: BaseException) -> str | None:
    """The interpreter gap ``exc`` (or an exception it was raised from) reports, if any."""
    while exc is not None:
        if type(exc).__name__ == "InterpreterError" and (gap := next(
                (g for g in INTERPRETER_GAPS if g in str(exc)), None)):
            return gap
        exc = exc.__cause__ or exc.__context__
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Under the interpreter, a test stopped by a known gap of this Triton's interpreter skips with its words; under
    CI (which installs a Triton without them) it fails."""
    try:
        return (yield)
    except Exception as exc:
        gap = interpreter_gap(exc) if os.environ.get("TRITON_INTERPRET") == "1" else None
        if gap is None or os.environ.get("CI"):
            raise
        pytest.skip(f"Triton {triton.__version__}'s interpreter cannot run this (numpy {np.__version__}): {gap}; "
                    f"Triton 3.9 (with torch 2.13) can")


