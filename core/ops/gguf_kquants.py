"""GGUF K-quants (llama.cpp's super-blocks of 256 elements): the layouts, the reference decode and random blocks.

* Q4_K (12): 144 bytes {fp16 d; fp16 dmin; 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32; 128 bytes of
  nibbles}; value = (d * sc[j]) * q - (dmin * m[j]).
* Q5_K (13): 176 bytes {fp16 d; fp16 dmin; the same 12 scale bytes; 32 bytes of fifth bits; 128 bytes of nibbles};
  value as Q4_K with q in 0..31.
* Q6_K (14): 210 bytes {128 bytes of low nibbles; 64 bytes of 2-bit highs; int8 scales[16] (sub-blocks of 16);
  fp16 d}; value = (d * sc[j]) * (q - 32).

Nibble order (Q4_K, Q5_K): elements 64g..64g+31 are the low nibbles of bytes 32g..32g+31 of the nibble area and
elements 64g+32..64g+63 their high nibbles; element 32j+i's fifth bit is bit j of qh[i]. Q6_K: in each half h of
128 elements, element 128h + 32s + i (s = 0..3) takes the low (s < 2) or high nibble of ql[64h + 32(s % 2) + i]
and bits 2s..2s+1 of qh[32h + i]. Each value is computed in fp32 as written (products, then the difference; no
fused multiply-add), as gguf-py's ``dequantize`` does.
"""

from __future__ import annotations

import torch

Q4_K, Q5_K, Q6_K = 12, 13, 14
QK_K = 256
# qtype -> (name, bytes per super-block of 256)
K_QTYPES = {Q4_K: ("Q4_K", 144), Q5_K: ("Q5_K", 176), Q6_K: ("Q6_K", 210)}


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and mins of Q4_K / Q5_K's 12 scale bytes [..., 12] -> (sc, m) int32 [..., 8]."""
    s = scales.to(torch.int32)
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], -1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], -1)
    return sc, mn


def _low_high(qs: torch.Tensor) -> torch.Tensor:
    """[..., G*32] nibble bytes -> [..., G*64] values: per 32 bytes, the 32 low nibbles then the 32 high ones."""
    g = qs.to(torch.int32).reshape(*qs.shape[:-1], -1, 1, 32)
    return torch.cat([g & 15, g >> 4], -2).reshape(*qs.shape[:-1], -1)


def dequantize_k(blocks: torch.Tensor, qtype: int) -> torch.Tensor:
    """Super-blocks uint8 [..., nb, bytes] -> fp32 values [..., nb, 256]."""
    if qtype == Q6_K:
        ql, qh = blocks[..., :128].to(torch.int32), blocks[..., 128:192].to(torch.int32)
        sc = blocks[..., 192:208].contiguous().view(torch.int8).float()
        d = _f16(blocks[..., 208:210])
        lo = torch.stack([ql[..., 0:32] & 15, ql[..., 32:64] & 15, ql[..., 0:32] >> 4, ql[..., 32:64] >> 4,
                          ql[..., 64:96] & 15, ql[..., 96:128] & 15, ql[..., 64:96] >> 4, ql[..., 96:128] >> 4], -2)
        hi = torch.stack([(qh[..., 32 * h:32 * h + 32] >> (2 * s)) & 3 for h in (0, 1) for s in range(4)], -2)
        q = ((lo | (hi << 4)) - 32).float().reshape(*blocks.shape[:-1], 16, 16)
        return ((d * sc)[..., None] * q).reshape(*blocks.shape[:-1], QK_K)
    d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
    sc, mn = scale_min_k4(blocks[..., 4:16])
    q = _low_high(blocks[..., -128:])
    if qtype == Q5_K:
        qh = blocks[..., 16:48].to(torch.int32)
        q = q + 16 * torch.stack([(qh >> j) & 1 for j in range(8)], -2).reshape(q.shape)
    q = q.float().reshape(*blocks.shape[:-1], 8, 32)
    return ((d * sc.float())[..., None] * q - (dmin * mn.float())[..., None]).reshape(*blocks.shape[:-1], QK_K)


def random_k_blocks(n: int, cols: int, qtype: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Random super-blocks [n, cols/256 * bytes]: every quant and 6-bit scale drawn uniformly (any byte pattern is a
    valid K-quant block), the fp16 super-block scales drawn so that values are of order ``scale``."""
    nb, size = cols // QK_K, K_QTYPES[qtype][1]
    raw = torch.randint(0, 256, (n, nb, size), generator=gen, dtype=torch.int32).to(torch.uint8)

    def f16(shape, mean):
        v = (mean * (0.5 + torch.rand(shape, generator=gen))).to(torch.float16)
        return v.view(torch.uint8).reshape(*shape[:-1], 2 * shape[-1])

    if qtype == Q6_K:  # |value| up to 32 * 127 * d
        raw[..., 208:210] = f16((n, nb, 1), scale / (32 * 64))
    else:  # q * sc up to 31 * 63 (Q5_K) or 15 * 63, the min up to 63 * dmin
        top = 31 * 63 if qtype == Q5_K else 15 * 63
        raw[..., 0:2] = f16((n, nb, 1), 2 * scale / top)
        raw[..., 2:4] = f16((n, nb, 1), scale / 63)
    return raw.reshape(n, nb * size)
