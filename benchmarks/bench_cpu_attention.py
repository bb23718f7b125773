"""Paged decode attention on the cpu platform: the native kernel vs the op's torch reference and vs torch SDPA.

SmolLM2-135M head shapes (9 query heads, 3 KV heads, head_dim 64, block size 16), every sequence of
the batch at the same context length so that SDPA needs no mask. Prints the median time per call of

* native:    ``paged_attention_decode`` called the way the model calls it (dispatch included);
* reference: the op's plain-torch reference (gathers the paged cache, einsum, masked softmax);
* sdpa:      ``F.scaled_dot_product_attention`` on K/V already contiguous [B, Hk, L, D] with
             ``enable_gqa=True``: the peer (torch's own fused CPU attention, without paging);

the ratios reference/native and sdpa/native (> 1: native is faster), the KV bytes the native kernel
streams per second, and the per-token cost for 30 layers. ``--mla``: the same for ``mla_decode`` on DeepSeek-V3's
latent rows (16 heads, as a TP-8 shard holds, against one shared cache of 512 + 64 channels; SDPA on the latent rows
laid out contiguously as one KV head). Run:
``python benchmarks/bench_cpu_attention.py [--threads N] [--isa NAME] [--dtype bf16|fp32] [--mla]``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from cpu_timing import median_seconds

from engine.core.ops.attention import make_paged_layout, paged_attention_decode
from engine.core.ops.mla import mla_decode
from engine.core.ops.registry import active_registry
from engine.platforms.cpu import _native

HQ, HK, D, BLOCK, LAYERS = 9, 3, 64, 16, 30
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}




def case(batch: int, ctx: int, dtype: torch.dtype, gen: torch.Generator):
    table, num_blocks = make_paged_layout([ctx] * batch, BLOCK, gen)
    shape = (num_blocks, BLOCK, HK, D)
    kc = torch.randn(shape, generator=gen).to(dtype)
    vc = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(batch, HQ, D, generator=gen).to(dtype)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32)
    # The same K/V, gathered into the contiguous [B, Hk, L, D] layout SDPA takes.
    bt = table[:, : ctx // BLOCK].long()
    k = kc[bt].flatten(1, 2)[:, :ctx].transpose(1, 2).contiguous()
    v = vc[bt].flatten(1, 2)[:, :ctx].transpose(1, 2).contiguous()
    return (q, kc, vc, table, seq_lens, D ** -0.5), (q.unsqueeze(2), k, v)


MLA_H, MLA_RANK, MLA_ROPE = 16, 512, 64


def mla_case(batch: int, ctx: int, dtype: torch.dtype, gen: torch.Generator):
    table, num_blocks = make_paged_layout([ctx] * batch, BLOCK, gen)
    d = MLA_RANK + MLA_ROPE
    cache = torch.randn(num_blocks, BLOCK, d, generator=gen).to(dtype)
    q = torch.randn(batch, MLA_H, d, generator=gen).to(dtype)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32)
    rows = cache[table[:, : ctx // BLOCK].long()].flatten(1, 2)[:, :ctx].unsqueeze(1).contiguous()  # [B, 1, L, d]
    return (q, cache, table, seq_lens, d ** -0.5, MLA_RANK), (q.unsqueeze(2), rows, rows[..., :MLA_RANK])


def run_mla(dtype: torch.dtype, gen: torch.Generator) -> None:
    d = MLA_RANK + MLA_ROPE
    print(f"mla_decode, DeepSeek-V3 latent (H={MLA_H}, Dqk={d}, v={MLA_RANK}), block {BLOCK}")
    print(f"{'B':>3} {'ctx':>5} | {'native us':>10} {'ref us':>10} {'sdpa us':>10} | {'ref/nat':>8} "
          f"{'sdpa/nat':>8} | {'KV GB/s':>8}")
    for batch in (1, 8):
        for ctx in (512, 2048):
            paged, sdpa = mla_case(batch, ctx, dtype, gen)
            impl = active_registry().select(mla_decode, paged)
            assert impl.platform == "cpu", f"dispatch chose {impl.qualname}"
            torch.testing.assert_close(mla_decode(*paged).float(), mla_decode.reference(*paged).float(), atol=2e-2,
                                       rtol=2e-2)
            t_nat = median_seconds(lambda p=paged: mla_decode(*p))
            t_ref = median_seconds(lambda p=paged: mla_decode.reference(*p))
            t_sdpa = median_seconds(lambda s=sdpa: F.scaled_dot_product_attention(*s, scale=d ** -0.5,
                                                                                  enable_gqa=True))
            kv_bytes = batch * ctx * d * paged[1].element_size()
            print(f"{batch:>3} {ctx:>5} | {t_nat * 1e6:>10.1f} {t_ref * 1e6:>10.1f} {t_sdpa * 1e6:>10.1f} | "
                  f"{t_ref / t_nat:>8.2f} {t_sdpa / t_nat:>8.2f} | {kv_bytes / t_nat / 1e9:>8.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="native threads (default: ENGINE_NUM_THREADS / all)")
    ap.add_argument("--isa", default=None, help="force a native ISA variant (avx512, avx2, scalar)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--mla", action="store_true", help="mla_decode on DeepSeek-V3's latent rows instead")
    args = ap.parse_args()
    if args.threads:
        _native.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    if args.isa:
        _native.set_isa(args.isa)
    dtype = DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(0)
    if args.mla:
        return run_mla(dtype, gen)
    print(f"paged decode attention, SmolLM2 heads (Hq={HQ}, Hk={HK}, D={D}), block {BLOCK}, {args.dtype}, "
          f"native isa={_native.isa()} threads={_native.num_threads()}, torch threads={torch.get_num_threads()}")
    print(f"{'B':>3} {'ctx':>5} | {'native us':>10} {'ref us':>10} {'sdpa us':>10} | {'ref/nat':>8} "
          f"{'sdpa/nat':>8} | {'KV GB/s':>8} {'x30 layers ms':>13}")
    for batch in (1, 32):
        for ctx in (512, 2048):
            paged, sdpa = case(batch, ctx, dtype, gen)
            impl = active_registry().select(paged_attention_decode, paged)
            assert impl.platform == "cpu", f"dispatch chose {impl.qualname}"
            want = paged_attention_decode.reference(*paged)
            got = paged_attention_decode(*paged)
            torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
            t_nat = median_seconds(lambda p=paged: paged_attention_decode(*p))
            t_ref = median_seconds(lambda p=paged: paged_attention_decode.reference(*p))
            t_sdpa = median_seconds(lambda s=sdpa: F.scaled_dot_product_attention(*s, scale=D ** -0.5, enable_gqa=True))
            kv_bytes = 2 * batch * ctx * HK * D * paged[1].element_size()
            print(f"{batch:>3} {ctx:>5} | {t_nat * 1e6:>10.1f} {t_ref * 1e6:>10.1f} {t_sdpa * 1e6:>10.1f} | "
                  f"{t_ref / t_nat:>8.2f} {t_sdpa / t_nat:>8.2f} | {kv_bytes / t_nat / 1e9:>8.1f} "
                  f"{t_nat * LAYERS * 1e3:>13.2f}")


if __name__ == "__main__":
    main()
