"""The references' arithmetic precision.

A reference computes in fp32 (``acc(t)`` widens bf16/fp16 to fp32) unless it is handed float64 tensors: then it
computes in float64. The conformance kit runs every reference both ways; the fp64 run is the oracle its error
bound is measured against (``engine.core.testing.oracle``).
"""

from __future__ import annotations

import torch

REF_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def acc(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the reference's accumulation dtype: float64 stays float64, anything else becomes float32."""
    return t if t.dtype == torch.float64 else t.float()
