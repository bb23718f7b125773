"""GGUF block-quantized weights: dequantize, and the quantized linear layer.

A GGUF weight of logical shape [N, cols] is stored as raw bytes [N, row_bytes]: each row is
cols/32 blocks of 32 elements (``qtype`` is the ``gguf.GGMLQuantizationType`` integer value):

* Q4_0 (2): 18 bytes {fp16 d; 16 bytes of nibbles}; value = (q - 8) * d
* Q4_1 (3): 20 bytes {fp16 d; fp16 m; 16 bytes of nibbles}; value = q * d + m
* Q8_0 (8): 34 bytes {fp16 d; int8 q[32]}; value = q * d

In the nibble formats the low nibble of byte j is element j and the high nibble element j + 16.
The K-quants Q4_K (12), Q5_K (13) and Q6_K (14) hold super-blocks of 256 elements (gguf_kquants.py).
The reference computes each value in fp32 exactly as written (one multiply, then one add for
Q4_1; no fused multiply-add), then rounds to the requested dtype.
"""

from __future__ import annotations

import numpy as np
import torch

from .gguf_kquants import K_QTYPES, Q4_K, Q5_K, Q6_K, QK_K, dequantize_k, random_k_blocks
from .inputs import randn, uniform
from .precision import acc
from .registry import Case, OpDef, Tolerance
from .shapes import HIDDEN, matmul_cases, special_rows

Q4_0, Q4_1, Q8_0 = 2, 3, 8
BLOCK = 32
# qtype -> (name, bytes per block of 32): the simple formats, which the block kernels take
GGUF_QTYPES = {Q4_0: ("Q4_0", 18), Q4_1: ("Q4_1", 20), Q8_0: ("Q8_0", 34)}
# every type the ops take: qtype -> (name, elements per block, bytes per block)
ALL_QTYPES = {**{q: (name, BLOCK, size) for q, (name, size) in GGUF_QTYPES.items()},
              **{q: (name, QK_K, size) for q, (name, size) in K_QTYPES.items()}}


def _supported() -> str:
    return ", ".join(f"{v[0]}={k}" for k, v in ALL_QTYPES.items())


def qtype_name(qtype: int) -> str:
    return ALL_QTYPES[qtype][0] if qtype in ALL_QTYPES else f"type {qtype}"


def gguf_row_bytes(qtype: int, cols: int) -> int:
    """Bytes of one quantized row of ``cols`` elements; ValueError for what the ops do not support."""
    if qtype not in ALL_QTYPES:
        raise ValueError(f"GGUF qtype {qtype} is not supported; supported qtypes: {_supported()}")
    name, block, size = ALL_QTYPES[qtype]
    if cols <= 0 or cols % block:
        raise ValueError(f"cols must be a positive multiple of {block} for {name} blocks, got {cols}")
    return cols // block * size


def check_gguf_raw(raw: torch.Tensor, qtype: int, cols: int) -> None:
    """Validate raw GGUF bytes [N, row_bytes] against ``qtype`` and ``cols``."""
    row_bytes = gguf_row_bytes(qtype, cols)
    if raw.dtype != torch.uint8:
        raise TypeError(f"raw GGUF weight must be uint8 bytes, got {raw.dtype}")
    if raw.dim() != 2 or raw.shape[1] != row_bytes:
        raise ValueError(f"raw {qtype_name(qtype)} weight of {cols} columns must have shape "
                         f"[N, {row_bytes}], got {list(raw.shape)}")


def _gguf_dequantize_ref(raw: torch.Tensor, qtype: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    check_gguf_raw(raw, qtype, cols)
    n = raw.shape[0]
    if qtype in K_QTYPES:
        return dequantize_k(raw.reshape(n, cols // QK_K, K_QTYPES[qtype][1]), qtype).reshape(n, cols).to(dtype)
    blocks = raw.reshape(n, cols // BLOCK, GGUF_QTYPES[qtype][1])
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [n, nb, 1]
    if qtype == Q8_0:
        q = blocks[..., 2:].contiguous().view(torch.int8).float()
        w = q * d
    else:
        qs = blocks[..., -16:]
        q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).float()  # elements 0..15 then 16..31
        if qtype == Q4_0:
            w = (q - 8) * d
        else:
            m = blocks[..., 2:4].contiguous().view(torch.float16).float()
            w = q * d + m
    return w.reshape(n, cols).to(dtype)


def _gguf_dequantize_fake(raw, qtype, cols, dtype):
    return raw.new_empty((raw.shape[0], cols), dtype=dtype)


def quantize_gguf(w: torch.Tensor, qtype: int) -> torch.Tensor:
    """Quantize a float [N, cols] weight to raw GGUF bytes with the ``gguf`` package (llama.cpp's rules)."""
    import gguf

    if qtype not in GGUF_QTYPES:  # the gguf package quantizes none of the K-quants
        raise ValueError(f"quantize_gguf: cannot write {qtype_name(qtype)}; it writes "
                         + ", ".join(f"{v[0]}={k}" for k, v in GGUF_QTYPES.items()))
    gguf_row_bytes(qtype, w.shape[-1])
    raw = gguf.quants.quantize(w.detach().float().cpu().numpy(), gguf.GGMLQuantizationType(qtype))
    return torch.from_numpy(np.ascontiguousarray(raw)).to(w.device)


def random_gguf_weight(n: int, cols: int, qtype: int, device, gen: torch.Generator,
                       scale: float = 1.0) -> torch.Tensor:
    """Random GGUF bytes [n, row_bytes]: normal values with a random scale per row (and, for Q4_1, a
    random offset per row, so that m is not just -max), quantized by the gguf package; K-quants (which the package
    cannot quantize) as random super-blocks (gguf_kquants.random_k_blocks)."""
    if qtype in K_QTYPES:
        return random_k_blocks(n, cols, qtype, gen, scale).to(device)
    w = randn((n, cols), torch.float32, "cpu", gen)
    w = w * uniform((n, 1), 0.25, 2.0, torch.float32, "cpu", gen) * scale
    if qtype == Q4_1:
        w = w + randn((n, 1), torch.float32, "cpu", gen, scale=scale)
    return quantize_gguf(w, qtype).to(device)


def _dequant_inputs(p, dtype, device, gen):
    qtype = p["qtype"]
    return random_gguf_weight(p["rows"], p["cols"], qtype, device, gen), qtype, p["cols"], dtype


gguf_dequantize = OpDef(
    name="gguf_dequantize",
    schema="(Tensor raw, int qtype, int cols, ScalarType dtype) -> Tensor",
    reference=_gguf_dequantize_ref,
    fake=_gguf_dequantize_fake,
    make_inputs=_dequant_inputs,
    draw=lambda rng, budget: matmul_cases(rng, budget, lambda m, n, k: {
        "qtype": draw_qtype(rng, k), "rows": n, "cols": k}),
    cases=[Case("q4_0_tiny", {"qtype": Q4_0, "rows": 3, "cols": 64}),
           Case("q4_1_smollm", {"qtype": Q4_1, "rows": 24, "cols": 576}),
           Case("q8_0_odd", {"qtype": Q8_0, "rows": 5, "cols": 96}),
           Case("q4_0_wide", {"qtype": Q4_0, "rows": 8, "cols": 1536}),
           Case("q8_0_smollm", {"qtype": Q8_0, "rows": 17, "cols": 576}),
           Case("q4_1_one", {"qtype": Q4_1, "rows": 1, "cols": 32}),
           Case("q4_k_two_blocks", {"qtype": Q4_K, "rows": 5, "cols": 512}),
           Case("q5_k_three_blocks", {"qtype": Q5_K, "rows": 7, "cols": 768}),
           Case("q6_k_one_block", {"qtype": Q6_K, "rows": 3, "cols": 256})],
    # fp32 is exact up to a fused multiply-add in Q4_1 (one ulp); bf16/fp16 up to one rounding step.
    rounded_outputs=True,
    tolerances={torch.float32: Tolerance(1e-6, 1e-6), torch.bfloat16: Tolerance(1e-6, 8e-3),
                torch.float16: Tolerance(1e-6, 1e-3)},
    doc="Raw GGUF bytes [N, row_bytes] (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) -> weight [N, cols] in dtype (fp32 "
        "math).",
)


def check_linear_x(op: str, x: torch.Tensor, cols: int) -> None:
    """x of a GGUF linear op: floating point, [..., cols]."""
    if not x.is_floating_point():
        raise TypeError(f"{op}: x must be a floating-point tensor, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != cols:
        raise ValueError(f"{op}: x must be [..., {cols}] to match the weight's cols, got {list(x.shape)}")


def _gguf_linear_ref(x: torch.Tensor, raw: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    check_linear_x("gguf_linear", x, cols)
    w = _gguf_dequantize_ref(raw, qtype, cols, torch.float32)
    return (acc(x) @ w.t().to(acc(x).dtype)).to(x.dtype)


def _gguf_linear_fake(x, raw, qtype, cols):
    return x.new_empty((*x.shape[:-1], raw.shape[0]))


def _linear_inputs(p, dtype, device, gen):
    k = p["k"]
    raw = random_gguf_weight(p["n"], k, p["qtype"], device, gen, scale=k ** -0.5)  # outputs of order 1
    x = randn((p["m"], k), dtype, "cpu", gen)
    return (special_rows(x) if p.get("special") else x).to(device), raw, p["qtype"], k


def draw_qtype(rng, cols: int, kquants: bool = True) -> int:
    """A type for a drawn weight of ``cols`` columns: a K-quant half the time where cols holds whole super-blocks
    (and ``kquants``)."""
    if kquants and cols % QK_K == 0 and rng.random() < 0.5:
        return rng.choice(tuple(K_QTYPES))
    return rng.choice(tuple(GGUF_QTYPES))


def draw_linear(rng, budget, kquants: bool = True):
    """gguf_linear's drawn cases (shared with gguf_linear_q8act, without the K-quants): every regime in one of the
    kept types, and special rows (zeros, tiny, huge) in a decode batch."""
    cases = matmul_cases(rng, budget, lambda m, n, k: {"qtype": draw_qtype(rng, k, kquants), "m": m, "n": n,
                                                       "k": k})
    k = rng.choice(HIDDEN)
    cases.append(Case("draw_special_rows", {"qtype": draw_qtype(rng, k, kquants), "m": 16,
                                            "n": max(16, min(512, budget // (16 * k)) // 16 * 16), "k": k,
                                            "special": True}, engine_shape=True))
    return cases


# Shared with gguf_linear_q8act (the same inputs): a decode row, SmolLM2's shapes, the Q8_0 head, a prefill, odd N.
LINEAR_CASES = [Case("q4_0_decode", {"qtype": Q4_0, "m": 1, "n": 48, "k": 64}),
                Case("q4_1_smollm", {"qtype": Q4_1, "m": 7, "n": 64, "k": 576}),
                Case("q8_0_head", {"qtype": Q8_0, "m": 3, "n": 100, "k": 576}),
                Case("q4_1_prefill", {"qtype": Q4_1, "m": 33, "n": 96, "k": 1536}),
                Case("q4_0_odd", {"qtype": Q4_0, "m": 5, "n": 7, "k": 96}),
                # above the 64-row switch of the CPU kernels (and the GEMV/GEMM switch of GPU ones)
                Case("q8_0_prefill_80", {"qtype": Q8_0, "m": 80, "n": 72, "k": 256}),
                Case("q4_0_prefill_130", {"qtype": Q4_0, "m": 130, "n": 40, "k": 128}),
                Case("q4_k_decode", {"qtype": Q4_K, "m": 1, "n": 40, "k": 512}),
                Case("q6_k_batch", {"qtype": Q6_K, "m": 9, "n": 24, "k": 256}),
                Case("q5_k_prefill_80", {"qtype": Q5_K, "m": 80, "n": 32, "k": 768})]

gguf_linear = OpDef(
    name="gguf_linear",
    schema="(Tensor x, Tensor raw, int qtype, int cols) -> Tensor",
    reference=_gguf_linear_ref,
    fake=_gguf_linear_fake,
    make_inputs=_linear_inputs,
    cases=LINEAR_CASES,
    draw=draw_linear,
    # bf16 covers implementations that round the dequantized weight to bf16 before an fp32-accumulating dot.
    tolerances={torch.float32: Tolerance(1e-4, 1e-4), torch.bfloat16: Tolerance(5e-2, 2e-2)},
    doc="y = x @ dequant(raw)^T: x [..., cols], raw GGUF [N, row_bytes] -> [..., N] in x.dtype, fp32 "
        "dequantized weight and fp32 accumulation.",
)
