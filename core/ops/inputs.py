"""Helpers for op input generators: fresh random tensors from a seeded generator.

Generators draw from the torch.Generator they are given (seeded freshly on every test run, the
seed printed on failure), never zeros or constants, so that a kernel cannot pass by accident.
"""

from __future__ import annotations

import torch


def randn(shape, dtype: torch.dtype, device, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Standard-normal values (times ``scale``) drawn in fp32 on the CPU, then cast and moved."""
    t = torch.randn(tuple(shape), generator=gen, dtype=torch.float32) * scale
    return t.to(dtype=dtype, device=device)


def randint(low: int, high: int, shape, device, gen: torch.Generator, dtype=torch.int64) -> torch.Tensor:
    return torch.randint(low, high, tuple(shape), generator=gen).to(dtype=dtype, device=device)


def uniform(shape, low: float, high: float, dtype: torch.dtype, device, gen: torch.Generator) -> torch.Tensor:
    t = torch.rand(tuple(shape), generator=gen, dtype=torch.float32) * (high - low) + low
    return t.to(dtype=dtype, device=device)
