"""Triton MLA decode (platforms/triton_kernels/mla.py) on a CUDA GPU: latent-cache bytes read per second against the
device-to-device copy bandwidth measured in the same run, and time against the op's torch reference (the peer a
platform without the kernel runs) and against torch SDPA on the same latent rows laid out contiguously.

Rows (``run() -> list[dict]``; ``benchmarks/bench_gpu.py`` prints them):

* DeepSeek-V3's latent (512 + 64, bf16), 128 heads (one GPU) and 16 heads (a TP-8 shard), batch 64, 4096-token
  contexts, pages of 64 with shuffled tables. Goal (issue 27): >= 0.8 x copy bandwidth at batch 64.
* batch 1, 32k context (split-KV).

The kernel's output is checked against the reference before it is timed (``max_err``). ``run(tiny=True)`` runs
every row at a few heads and tokens, on the CPU under the Triton interpreter where there is no GPU (what CI runs:
the numbers mean nothing).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.core.ops.mla import _mla_decode_ref
from engine.platforms.triton_kernels import mla as M

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu import ceilings  # noqa: E402
from benchmarks.gpu.ceilings import bench_us  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Setup:
    rank: int = 512
    rope: int = 64
    page: int = 64
    rows: tuple[tuple[int, int, int], ...] = ((128, 64, 4096), (16, 64, 4096), (128, 1, 32768))  # heads, B, ctx
    copy_bytes: int = 1 << 30
    device: str = "cuda"
    dtype: torch.dtype = torch.bfloat16


FULL = Setup()
TINY = Setup(rank=64, rope=16, page=16, rows=((8, 2, 40), (4, 1, 300)), copy_bytes=1 << 20,
             device="cuda" if torch.cuda.is_available() else "cpu", dtype=torch.float32)


def _inputs(s: Setup, heads: int, batch: int, ctx: int, gen: torch.Generator):
    d = s.rank + s.rope
    pages_per_seq = -(-ctx // s.page)
    perm = torch.randperm(batch * pages_per_seq, generator=gen)
    tables = perm.view(batch, pages_per_seq).to(torch.int32)
    cache = torch.randn(batch * pages_per_seq, s.page, d, generator=gen).to(s.dtype)
    q = torch.randn(batch, heads, d, generator=gen).to(s.dtype)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    # the same rows contiguous [B, 1, L, D] for SDPA (one KV head shared by every query head)
    flat = cache[tables.long()].reshape(batch, pages_per_seq * s.page, d)[:, :ctx]
    return [t.to(s.device) for t in (q, cache, tables, lens, flat)]


def _row(s: Setup, heads: int, batch: int, ctx: int, gen: torch.Generator, bandwidth: float) -> dict:
    q, cache, tables, lens, flat = _inputs(s, heads, batch, ctx, gen)
    scale = (128 + s.rope) ** -0.5  # DeepSeek's 1/sqrt(qk_nope + qk_rope)
    got = M.mla_decode(q, cache, tables, lens, scale, s.rank)
    want = _mla_decode_ref(q, cache, tables, lens, scale, s.rank)
    err = (got.float() - want.float()).abs().max().item()
    rel = err / max(want.float().abs().max().item(), 1e-12)
    kernel_us = bench_us(lambda: M.mla_decode(q, cache, tables, lens, scale, s.rank))
    ref_us = bench_us(lambda: _mla_decode_ref(q, cache, tables, lens, scale, s.rank))
    # One KV head shared by every query head: the heads are H query rows over the same keys (no mask), so SDPA takes
    # q as [B, 1, H, D] and never expands the cache per head (enable_gqa's expansion of a 576-wide cache asked for 64
    # GiB at B = 64, H = 128, ctx = 4096 on the H100, session 19).
    kv = flat.unsqueeze(1)
    sdpa_us = bench_us(lambda: F.scaled_dot_product_attention(q.unsqueeze(1), kv, kv[..., :s.rank], scale=scale))
    read = batch * ctx * (s.rank + s.rope) * cache.element_size()
    return {"bench": f"mla_decode H={heads} B={batch} ctx={ctx} {str(s.dtype)[6:]}", "us": kernel_us,
            "max_err": err, "max_rel_err": rel, "ok": rel < 2e-2, "GB/s": read / kernel_us / 1e3,
            "x_copy_bw": read / (kernel_us * 1e-6) / bandwidth, "x_reference": ref_us / kernel_us,
            "x_sdpa": sdpa_us / kernel_us}


def run(tiny: bool = False) -> list[dict]:
    s = TINY if tiny else FULL
    gen = torch.Generator().manual_seed(0)
    bandwidth = ceilings.copy_bandwidth(s.device, s.copy_bytes)
    return [_row(s, heads, batch, ctx, gen, bandwidth) for heads, batch, ctx in s.rows]


if __name__ == "__main__":
    for row in run(tiny="--tiny" in sys.argv):
        print(row)
