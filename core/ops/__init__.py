"""Kernel contracts: every op the models call, with its reference implementation.

``from engine.core import ops; ops.rms_norm(x, w, eps)`` dispatches to the selected platform's
best implementation (see :mod:`engine.core.ops.registry`). Importing this package declares every op.
"""

from .activation import silu_and_mul
from .attention import paged_attention_decode, paged_attention_prefill
from .comm import all_gather, all_reduce, broadcast
from .fp8 import fp8_linear
from .fp8_quant import fp8_quantize_per_token
from .gguf_q8act import gguf_linear_q8act
from .gguf_quant import gguf_dequantize, gguf_linear
from .int4 import int4_linear
from .int8 import int8_linear
from .kv_cache import write_kv_cache
from .linear import linear
from .mla import mla_decode
from .moe import fused_moe
from .moe_fp8 import fused_moe_fp8
from .moe_gguf import fused_moe_gguf
from .moe_nvfp4 import fused_moe_nvfp4
from .norm import fused_add_rms_norm, rms_norm
from .nvfp4 import nvfp4_linear, nvfp4_linear_w4a4, nvfp4_quantize
from .registry import OPS, Case, KernelRegistry, OpDef, Tolerance, active_registry
from .rotary import build_cos_sin_cache, rotary_embedding
from .rotary_kv import rotary_write_kv

__all__ = [
    "OPS", "Case", "KernelRegistry", "OpDef", "Tolerance", "active_registry",
    "all_gather", "all_reduce", "broadcast", "build_cos_sin_cache", "fp8_linear", "fused_add_rms_norm", "fused_moe",
    "fused_moe_fp8",
    "fused_moe_gguf", "fused_moe_nvfp4",
    "gguf_dequantize", "gguf_linear", "gguf_linear_q8act", "int4_linear", "int8_linear", "linear", "mla_decode",
    "nvfp4_linear", "nvfp4_linear_w4a4",
    "nvfp4_quantize",
    "paged_attention_decode", "paged_attention_prefill",
    "fp8_quantize_per_token", "rms_norm", "rotary_embedding", "rotary_write_kv", "silu_and_mul", "write_kv_cache",
]
