"""Triton paged attention (platforms/triton_kernels/attention.py) on a CUDA GPU against torch SDPA.

Rows (``run() -> list[dict]``; ``benchmarks/bench_gpu.py`` prints them):

* decode, B=64, 32 q / 8 kv heads, D=128, 4096-token contexts, block 16, bf16: KV bytes read per second against
  the device-to-device copy bandwidth measured here (bytes read + written, as FACTS.md counts it), and time
  against ``F.scaled_dot_product_attention`` on contiguous [B, Hk, L, D] K/V (``enable_gqa=True``).
  Goal: >= 0.9 x copy bandwidth and >= 0.9 x SDPA.
* decode, B=1, 32k context (split-KV): same measures; goal >= 0.9 x SDPA.
* decode under CUDA-graph capture (B=64 x 4k: one kernel; B=2 x 16k: split-KV, workspace + reduce kernel):
  captured once, replayed after the seq_lens values change in place; must equal an eager call on the new values
  bit for bit (checks capture safety on the device), timed against eager.
* prefill, 8 sequences x 1024 tokens, causal, same heads: TFLOP/s (causal FLOPs) against SDPA ``is_causal``
  (the faster of ``enable_gqa`` and pre-expanded K/V). Goal: >= 0.8 x SDPA.

Every kernel output is checked against SDPA's before it is timed (``max_err``; a wrong result fails its row).
Times are ``triton.testing.do_bench`` medians (it flushes L2 between calls); decode inputs are also rotated
among copies totalling >= 4x L2. The paged caches use shuffled block tables.

``run(sweep=True)`` (or ENGINE_BENCH_SWEEP=1; ``python benchmarks/gpu/attention.py --sweep``) adds rows for other
decode tile / pipeline / partition settings and prefill tile / pipeline / GQA-packing settings (``PREFILL_SWEEP``):
the defaults in ``decode_config``, ``decode_partitions`` and ``prefill_config`` were chosen without a GPU (from
sm_90 PTX/SASS only), so that sweep is how to tune them.

``run(tiny=True)`` (``--tiny``) runs every row, and the first setting of each sweep, at ``TINY``: a few heads and
tokens, on the CPU under the Triton interpreter where there is no GPU (what CI runs: the numbers mean nothing).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.platforms.triton_kernels import attention as A
from engine.platforms.triton_kernels import sm_count

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu import ceilings  # noqa: E402
from benchmarks.gpu.ceilings import bench_us as _bench_us  # noqa: E402

DTYPE = torch.bfloat16


@dataclasses.dataclass(frozen=True)
class Setup:
    """Heads, head size, KV block, the sizes of each section, and the device. FULL is what the benchmark measures;
    TINY runs the same code in seconds (the split-KV rows still split: 300 tokens are 2 partitions at the
    interpreter's 16 stand-in SMs)."""
    hq: int = 32
    hk: int = 8
    d: int = 128
    block: int = 16
    decode: tuple[int, int] = (64, 4096)  # (batch, context)
    split_kv: tuple[int, int] = (1, 32768)
    graphs: tuple[tuple[int, int], ...] = ((64, 4096), (2, 16384))
    prefill: tuple[int, int] = (8, 1024)  # (sequences, tokens each)
    sweep_first: int | None = None  # run only this many settings of each sweep
    copy_bytes: int = 1 << 30  # the copy-bandwidth ceiling's size
    device: str = "cuda"


FULL = Setup()
TINY = Setup(hq=4, hk=2, d=32, decode=(2, 64), split_kv=(1, 300), graphs=((2, 64), (1, 300)), prefill=(2, 48),
             sweep_first=1, copy_bytes=1 << 20, device="cuda" if torch.cuda.is_available() else "cpu")


def copy_bandwidth(s: Setup = FULL) -> float:
    return ceilings.copy_bandwidth(s.device, s.copy_bytes)


def _paged(s: Setup, lens: list[int], gen: torch.Generator, copies: int = 1):
    """``copies`` sets of (key_cache, value_cache, block_tables, seq_lens, contiguous K, contiguous V): the same values
    paged (shuffled blocks) and contiguous [B, Hk, L, D] for SDPA (all sequences of one length L)."""
    sets = []
    b, length = len(lens), max(lens)
    hk, d, block, dev = s.hk, s.d, s.block, s.device
    nblk = math.ceil(length / block)
    for _ in range(copies):
        k = torch.randn(b, length, hk, d, generator=gen, device=dev, dtype=torch.float32).to(DTYPE)
        v = torch.randn(b, length, hk, d, generator=gen, device=dev, dtype=torch.float32).to(DTYPE)
        total = b * nblk
        perm = torch.randperm(total, generator=gen, device=dev)
        table = perm.view(b, nblk).to(torch.int32)
        pad = nblk * block - length
        kc = torch.empty(total, block, hk, d, device=dev, dtype=DTYPE)
        vc = torch.empty_like(kc)
        kc[perm] = F.pad(k, (0, 0, 0, 0, 0, pad)).view(b * nblk, block, hk, d)
        vc[perm] = F.pad(v, (0, 0, 0, 0, 0, pad)).view(b * nblk, block, hk, d)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
        sets.append((kc, vc, table, seq_lens, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()))
        del k, v
    return sets


def _sms(device) -> int:
    """The SM count paged_decode sizes its split-KV grid by (the interpreter's stand-in off a GPU)."""
    return sm_count(device, A._INTERPRETER_SMS)


def _decode_rows(s: Setup, name: str, batch: int, ctx: int, copy_bw: float, bw_goal: bool, gen,
                 sweep: bool) -> list[dict]:
    hq, hk, d = s.hq, s.hk, s.d
    kv_bytes = 2 * batch * ctx * hk * d * DTYPE.itemsize
    copies = max(1, min(4, math.ceil(4 * ceilings.l2_bytes(s.device) / kv_bytes)))
    sets = _paged(s, [ctx] * batch, gen, copies)
    qs = [torch.randn(batch, hq, d, generator=gen, device=s.device, dtype=torch.float32).to(DTYPE) for _ in sets]
    scale = d ** -0.5

    group = hq // hk

    def sdpa_gqa(q, k, v):
        return F.scaled_dot_product_attention(q[:, :, None], k, v, scale=scale, enable_gqa=True)[:, :, 0]

    def sdpa_rows(q, k, v):  # the group's queries as G rows of one head: the same math, K/V read once
        b = q.shape[0]
        return F.scaled_dot_product_attention(q.view(b, hk, group, d), k, v, scale=scale).reshape(b, hq, d)

    # correctness first, against SDPA on the same values
    kc, vc, table, seq_lens, k, v = sets[0]
    want = sdpa_rows(qs[0], k, v)
    got = A.paged_decode(qs[0], kc, vc, table, seq_lens, scale)
    err = (got.float() - want.float()).abs().max().item()
    ok = err < 2e-2

    def check(**kw) -> bool:
        out = A.paged_decode(qs[0], kc, vc, table, seq_lens, scale, **kw)
        return (out.float() - want.float()).abs().max().item() < 2e-2

    def ours(**kw):
        it = itertools.cycle(list(zip(qs, sets, strict=True)))

        def fn():
            q, (kc, vc, table, seq_lens, _, _) = next(it)
            A.paged_decode(q, kc, vc, table, seq_lens, scale, **kw)
        return fn

    def sdpa(impl):
        it = itertools.cycle(list(zip(qs, sets, strict=True)))

        def fn():
            q, (_, _, _, _, k, v) = next(it)
            impl(q, k, v)
        return fn

    timed = {}
    for peer_name, impl in (("SDPA enable_gqa", sdpa_gqa), ("SDPA, group as query rows", sdpa_rows)):
        try:
            timed[peer_name] = _bench_us(sdpa(impl))
        except Exception:  # a torch without enable_gqa
            pass
    peer, peer_us = min(timed.items(), key=lambda kv: kv[1])
    cfg = A.decode_config(d, group, DTYPE)
    parts, part_tokens = A.decode_partitions(batch, hk, table.shape[1] * s.block, cfg["BLOCK_N"], _sms(qs[0].device))
    shape = f"B={batch} Hq={hq} Hk={hk} D={d} ctx={ctx} block={s.block} bf16"
    rows = []

    def row(bench, us, extra_shape="", goal_kind="default", ok=ok):
        gbps = kv_bytes / (us * 1e-6) / 1e9
        ratio = peer_us / us
        if bw_goal:
            goal = f">= 0.9 x copy BW ({0.9 * copy_bw / 1e9:.0f} GB/s) and >= 0.9x SDPA"
            met = gbps * 1e9 >= 0.9 * copy_bw and ratio >= 0.9
        else:
            goal = ">= 0.9x SDPA"
            met = ratio >= 0.9
        if goal_kind == "sweep":
            goal, met = "tuning (informational)", ok
        if not ok:
            goal, met = f"WRONG RESULT (max err {err:.3g}) " + goal, False
        rows.append({"bench": bench, "shape": shape + extra_shape, "us": us, "gbps": gbps,
                     "peer": peer + ", contiguous KV", "peer_us": peer_us, "ratio": ratio, "goal": goal,
                     "met": met, "max_err": err})

    row(name, _bench_us(ours()), f" (P={parts} x {part_tokens} tok, {cfg})")
    if sweep:
        for bn, warps, stages in DECODE_SWEEP[:s.sweep_first]:
            for part in (None, 512, 1024, 2048):
                if part is not None and part >= ctx:
                    continue
                c = {"BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
                try:
                    good = check(config=c, partition_tokens=part)
                    us = _bench_us(ours(config=c, partition_tokens=part), rep=100)
                except Exception as exc:  # e.g. out of shared memory for this combination
                    rows.append({"bench": name + " sweep", "shape": f"{c} part={part}", "us": float("nan"),
                                 "gbps": 0.0, "peer": "", "peer_us": peer_us, "ratio": 0.0,
                                 "goal": f"failed: {type(exc).__name__}", "met": False})
                    continue
                row(name + " sweep", us, f" {c} part={part}", "sweep", good)
    return rows


def _graph_row(s: Setup, gen, batch: int, ctx: int) -> dict:
    """Capture one decode call; change seq_lens (and q) in place; replay; compare with eager."""
    (kc, vc, table, seq_lens, _, _), = _paged(s, [ctx] * batch, gen)
    q = torch.randn(batch, s.hq, s.d, generator=gen, device=s.device, dtype=torch.float32).to(DTYPE)
    scale = s.d ** -0.5
    replay, out = ceilings.capture(lambda: A.paged_decode(q, kc, vc, table, seq_lens, scale))
    new_lens = torch.randint(1, ctx + 1, (batch,), generator=gen, device=s.device, dtype=torch.int32)
    seq_lens.copy_(new_lens)
    q.copy_(torch.randn(batch, s.hq, s.d, generator=gen, device=s.device, dtype=torch.float32))
    replay()
    want = A.paged_decode(q, kc, vc, table, seq_lens, scale)
    if ceilings.on_gpu():
        torch.cuda.synchronize()
    err = (out.float() - want.float()).abs().max().item()
    us = _bench_us(replay)
    eager_us = _bench_us(lambda: A.paged_decode(q, kc, vc, table, seq_lens, scale))
    ok = err == 0.0
    cfg = A.decode_config(s.d, s.hq // s.hk, DTYPE)
    parts, _ = A.decode_partitions(batch, s.hk, table.shape[1] * s.block, cfg["BLOCK_N"], _sms(q.device))
    return {"bench": "decode CUDA graph replay",
            "shape": f"B={batch} ctx<={ctx} P={parts}, random seq_lens set after capture",
            "us": us, "gbps": 0.0, "peer": "same call, eager", "peer_us": eager_us, "ratio": eager_us / us,
            "goal": "captures; replay after in-place seq_lens change == eager" + ("" if ok else f" (err {err:.3g})"),
            "met": ok, "max_err": err}


# decode sweep: (BLOCK_N, num_warps, num_stages), each at the heuristic's partitions and at 512 / 1024 / 2048 tokens
DECODE_SWEEP = ((16, 4, 5), (32, 4, 5), (64, 4, 5), (32, 4, 3), (64, 4, 3), (32, 8, 5), (64, 8, 5), (32, 4, 7),
                (64, 4, 2))
# prefill sweep: (BLOCK_M, BLOCK_N, num_warps, num_stages, G_TILE); G_TILE None = the whole GQA group per program
# (K/V tiles shared by the group's query heads), 1 = one query head per program. All compile for sm_90 without
# spills (checked offline with Triton 3.9); 128x128 tiles need ~160 KB of shared memory.
PREFILL_SWEEP = (
    (128, 64, 8, 3, None), (128, 64, 8, 3, 1), (128, 64, 8, 4, None), (128, 128, 8, 2, None), (128, 128, 8, 3, None),
    (128, 128, 8, 2, 1), (64, 64, 4, 3, None), (64, 64, 4, 3, 1), (64, 128, 8, 2, None), (128, 32, 8, 3, None),
)


def _prefill_rows(s: Setup, gen, sweep: bool) -> list[dict]:
    seqs, length = s.prefill
    hq, hk, d = s.hq, s.hk, s.d
    sets = _paged(s, [length] * seqs, gen)
    kc, vc, table, seq_lens, k, v = sets[0]
    q = torch.randn(seqs, hq, length, d, generator=gen, device=s.device, dtype=torch.float32).to(DTYPE)
    q_packed = q.transpose(1, 2).reshape(seqs * length, hq, d).contiguous()
    cu = torch.arange(0, seqs + 1, device=s.device, dtype=torch.int32) * length
    scale = d ** -0.5
    k_rep, v_rep = k.repeat_interleave(hq // hk, 1), v.repeat_interleave(hq // hk, 1)
    want = F.scaled_dot_product_attention(q, k_rep, v_rep, is_causal=True, scale=scale)

    def error(config=None) -> float:
        got = A.paged_prefill(q_packed, kc, vc, table, cu, seq_lens, scale, config=config)
        got = got.view(seqs, length, hq, d).transpose(1, 2)
        return (got.float() - want.float()).abs().max().item()

    peers = {
        "SDPA causal enable_gqa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                                         enable_gqa=True),
        "SDPA causal, K/V repeated": lambda: F.scaled_dot_product_attention(q, k_rep, v_rep, is_causal=True,
                                                                            scale=scale),
    }
    timed = {}
    for peer_name, fn in peers.items():
        try:
            timed[peer_name] = _bench_us(fn)
        except Exception:  # a backend that declines GQA
            pass
    peer, peer_us = min(timed.items(), key=lambda kv: kv[1])
    flops = 4 * seqs * hq * d * length * (length + 1) / 2  # causal: QK^T and PV over the lower triangle
    shape = f"{seqs} x {length} tok causal Hq={hq} Hk={hk} D={d} block={s.block} bf16"

    def row(bench, us, err, extra, goal_kind="default"):
        ok = err < 2e-2
        ratio = peer_us / us
        goal, met = ">= 0.8x SDPA", ok and ratio >= 0.8
        if goal_kind == "sweep":
            goal, met = "tuning (informational)", ok
        if not ok:
            goal = f"WRONG RESULT (max err {err:.3g}) " + goal
        return {"bench": bench, "shape": f"{shape} {extra}", "us": us, "tflops": flops / (us * 1e-6) / 1e12,
                "peer": peer, "peer_us": peer_us, "ratio": ratio, "goal": goal, "met": met, "max_err": err}

    cfg = A.prefill_config(d, DTYPE)
    err = error()
    rows = [row("prefill", _bench_us(lambda: A.paged_prefill(q_packed, kc, vc, table, cu, seq_lens, scale)), err,
                f"{cfg} G_TILE={A.prefill_g_tile(hq // hk, cfg['BLOCK_M'], cfg.get('G_TILE'))}")]
    if sweep:
        for bm, bn, warps, stages, g_tile in PREFILL_SWEEP[:s.sweep_first]:
            c = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages, "G_TILE": g_tile}
            label = f"{c} G_TILE={A.prefill_g_tile(hq // hk, bm, g_tile)}"
            try:
                e = error(c)
                us = _bench_us(lambda c=c: A.paged_prefill(q_packed, kc, vc, table, cu, seq_lens, scale, config=c),
                               rep=100)
            except Exception as exc:  # e.g. out of shared memory for this combination
                rows.append({"bench": "prefill sweep", "shape": label, "us": float("nan"), "tflops": 0.0,
                             "peer": peer, "peer_us": peer_us, "ratio": 0.0,
                             "goal": f"failed: {type(exc).__name__}", "met": False})
                continue
            rows.append(row("prefill sweep", us, e, label, "sweep"))
    return rows


def run(sweep: bool | None = None, tiny: bool = False) -> list[dict]:
    """The rows above (``tiny``: at ``TINY``, with the first setting of each sweep when ``sweep``)."""
    s = TINY if tiny else FULL
    if s.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu/attention.py needs a CUDA GPU; no rows")
        return []
    if sweep is None:
        sweep = os.environ.get("ENGINE_BENCH_SWEEP", "0") not in ("", "0")
    gen = torch.Generator(device=s.device).manual_seed(0)
    copy_bw = copy_bandwidth(s)
    rows = []
    for section in (lambda: _decode_rows(s, "decode", *s.decode, copy_bw, True, gen, sweep),
                    lambda: _decode_rows(s, "decode split-KV", *s.split_kv, copy_bw, False, gen, sweep),
                    lambda: [_graph_row(s, gen, *bc) for bc in s.graphs],
                    lambda: _prefill_rows(s, gen, sweep)):
        rows += section()
        if s.device == "cuda":
            torch.cuda.empty_cache()
    for r in rows:
        r["copy_gbps"] = copy_bw / 1e9
    return rows


if __name__ == "__main__":
    import sys

    for r in run(sweep="--sweep" in sys.argv, tiny="--tiny" in sys.argv):
        rate = f"{r['gbps']:.0f} GB/s" if "gbps" in r else f"{r['tflops']:.0f} TFLOP/s"
        print(f"{'MET ' if r['met'] else 'MISS'} {r['bench']:<28} {r['us']:9.1f} us  {rate:>14}  "
              f"{r['peer']} {r['peer_us']:.1f} us  x{r['ratio']:.2f}  [{r['goal']}]  {r['shape']}")
