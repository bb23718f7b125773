"""Triton fused MoE (platforms/triton_kernels/fused_moe.py) on a CUDA GPU, Mixtral-8x7B shapes (8 experts, top-2,
hidden 4096, intermediate 14336), against a torch per-expert loop measured in this same run.

Rows (``run() -> list[dict]``; ``benchmarks/bench_gpu.py`` prints them):

* bf16, 64 tokens: expert-weight bytes read (every expert some token routes to: 3 x hidden x inter x 2 bytes
  each) per second against the device-to-device copy bandwidth measured here (bytes read + written, as FACTS.md
  counts it). Goal: >= 0.85 x copy bandwidth (FACTS.md: 4.29 TB/s copy, the loop 1.63 ms, so ~2x the loop).
* bf16, 4096 tokens: TFLOP/s (6 x tokens x top_k x hidden x inter) against a bf16 ``torch.matmul`` at 8192^3
  measured here. Goal: >= 0.6 x that rate.
* fp8 (W8A8, e4m3fn, per-channel weight scales, per-token dynamic activations), 64 tokens: FP8 expert-weight bytes
  (1 byte per element + the fp32 scales) per second against the copy bandwidth; goal >= 0.85 x. Peer: the same
  loop with ``torch._scaled_mm`` (row-wise scales) per expert.
* fp8, 4096 tokens: TFLOP/s against FP8 ``torch._scaled_mm`` (per-tensor scales) at 8192^3; goal >= 0.6 x.
* fp8 fast-accum (both sizes, informational): the FP8 kernel with ``fp8_fast_accum=True`` (the tensor cores sum the
  whole K loop in their reduced precision, as vLLM's kernel does) against the default, which promotes the sums to
  fp32 every K tile (as cuBLAS does by default): its time and its error against the reference.
* CUDA graph (bf16, 64 tokens): captured once, replayed after x and router_logits change in place; must equal an
  eager call on the new values bit for bit; timed against eager.

Each kernel result is checked against the op's reference (``max_err``, ``rel_err`` = relative L2 error) before it is
timed; a wrong result fails its row. Times are ``triton.testing.do_bench`` medians (it flushes L2 between calls).
``ratio`` is peer_us / us (> 1: the kernel is faster).

``run(sweep=True)`` (or ENGINE_BENCH_SWEEP=1; ``python benchmarks/gpu/moe.py --sweep``) adds rows for other tile
settings of the bf16 kernel at 64 and 4096 tokens: the defaults in ``moe_config`` were taken from vLLM's tuned
H200 tables and checked only by compiling for sm_90 (no GPU was at hand), so that sweep is how to tune them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.core.ops.moe import fused_moe
from engine.core.ops.moe_fp8 import fused_moe_fp8
from engine.platforms.triton_kernels import fused_moe as M

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu import ceilings  # noqa: E402
from benchmarks.gpu.ceilings import bench_us as _bench_us  # noqa: E402

E, TOP_K, HIDDEN, INTER = 8, 2, 4096, 14336
DEVICE = "cuda"
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def copy_bandwidth() -> float:
    return ceilings.copy_bandwidth(DEVICE)


def matmul_rates() -> tuple[float, float | None]:
    """(bf16 torch.matmul FLOP/s, FP8 torch._scaled_mm per-tensor FLOP/s or None) at 8192^3."""
    n = 8192
    bf16 = ceilings.bf16_gemm_rate(DEVICE, n)
    x = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    try:
        xq, yq = x.to(FP8), y.to(FP8).t()  # mat2 column-major
        one = torch.ones((), device=DEVICE)
        fp8 = 2 * n ** 3 / (_bench_us(lambda: torch._scaled_mm(xq, yq, scale_a=one, scale_b=one,
                                                                out_dtype=torch.bfloat16), warmup=50, rep=300) * 1e-6)
    except Exception as exc:  # no FP8 GEMM in this torch / on this GPU
        print(f"FP8 _scaled_mm unavailable: {type(exc).__name__}: {exc}")
        fp8 = None
    return bf16, fp8


# ---- inputs and peers ------------------------------------------------------------------------------------------

def _weights(gen):
    w13 = torch.empty(E, 2 * INTER, HIDDEN, device=DEVICE, dtype=torch.bfloat16)
    w2 = torch.empty(E, HIDDEN, INTER, device=DEVICE, dtype=torch.bfloat16)
    for e in range(E):  # one expert at a time: fp32 randn of all of w13 would take 3.8 GB
        w13[e] = torch.randn(2 * INTER, HIDDEN, device=DEVICE, generator=gen) * HIDDEN ** -0.5
        w2[e] = torch.randn(HIDDEN, INTER, device=DEVICE, generator=gen) * INTER ** -0.5
    return w13, w2


def _quant_channels(w):
    """Per expert, per output channel: (w_q e4m3fn, scales fp32 [E, N, 1])."""
    scale = w.abs().amax(dim=2, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    q = torch.empty(w.shape, device=DEVICE, dtype=FP8)
    for e in range(w.shape[0]):
        q[e] = (w[e].float() / scale[e]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def _route(logits, top_k, renormalize):
    weights, ids = torch.topk(torch.softmax(logits.float(), dim=-1), top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def torch_loop(x, w13, w2, logits, top_k, renormalize):
    """The plain torch way: route, then per expert with tokens, gather its rows, two matmuls, weighted index_add_."""
    weights, ids = _route(logits, top_k, renormalize)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        gate_up = x[tok] @ w13[e].t()
        y = (F.silu(gate_up[:, :INTER]) * gate_up[:, INTER:]) @ w2[e].t()
        out.index_add_(0, tok, y.float() * weights[tok, slot, None])
    return out.to(x.dtype)


def _quant_rows(a):
    scale = a.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (a.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def torch_loop_fp8(x, w13_q, w13_s, w2_q, w2_s, logits, top_k, renormalize):
    """The same loop in W8A8: per-token quantization in torch, ``torch._scaled_mm`` with row-wise scales."""
    weights, ids = _route(logits, top_k, renormalize)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(w13_q.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        xq, xs = _quant_rows(x[tok])
        gate_up = torch._scaled_mm(xq, w13_q[e].t(), scale_a=xs, scale_b=w13_s[e].reshape(1, -1),
                                   out_dtype=torch.bfloat16)
        hq, hs = _quant_rows(F.silu(gate_up[:, :INTER]) * gate_up[:, INTER:])
        y = torch._scaled_mm(hq, w2_q[e].t(), scale_a=hs, scale_b=w2_s[e].reshape(1, -1), out_dtype=torch.bfloat16)
        out.index_add_(0, tok, y.float() * weights[tok, slot, None])
    return out.to(x.dtype)


def _errors(got, want) -> tuple[float, float]:
    d = got.float() - want.float()
    return d.abs().max().item(), (d.norm() / want.float().norm()).item()


def _active_experts(logits) -> int:
    return int(torch.topk(logits.float(), TOP_K, dim=-1)[1].unique().numel())


# ---- rows ------------------------------------------------------------------------------------------------------

def _row(bench, tokens, us, peer, peer_us, *, rate_key, rate, goal, met, ok, max_err, rel_err, shape_extra=""):
    if not ok:
        goal, met = f"WRONG RESULT (rel err {rel_err:.3g}) " + goal, False
    return {"bench": bench, "shape": f"T={tokens} E={E} top{TOP_K} H={HIDDEN} I={INTER}" + shape_extra, "us": us,
            rate_key: rate, "peer": peer, "peer_us": peer_us, "ratio": peer_us / us, "goal": goal, "met": met,
            "max_err": max_err, "rel_err": rel_err}


def _bf16_rows(w13, w2, gen, copy_bw, mm_rate) -> list[dict]:
    rows = []
    for tokens in (64, 4096):
        x = torch.randn(tokens, HIDDEN, device=DEVICE, generator=gen).to(torch.bfloat16)
        logits = torch.randn(tokens, E, device=DEVICE, generator=gen)  # fp32: no exact ties (tie order is free)
        args = (x, w13, w2, logits, TOP_K, True)
        got = M.triton_fused_moe(*args)
        max_err, rel_err = _errors(got, fused_moe.reference(*args))
        ok = rel_err < 1e-2
        us = _bench_us(lambda a=args: M.triton_fused_moe(*a))
        peer_us = _bench_us(lambda a=args: torch_loop(*a), rep=300)
        if tokens == 64:
            nbytes = _active_experts(logits) * 3 * HIDDEN * INTER * 2
            gbps = nbytes / (us * 1e-6) / 1e9
            rows.append(_row("fused_moe bf16 decode", tokens, us, "torch per-expert loop", peer_us, rate_key="gbps",
                             rate=gbps, goal=f">= 0.85 x copy BW ({0.85 * copy_bw / 1e9:.0f} GB/s), ~2x the loop",
                             met=gbps * 1e9 >= 0.85 * copy_bw, ok=ok, max_err=max_err, rel_err=rel_err))
        else:
            tflops = 6 * tokens * TOP_K * HIDDEN * INTER / (us * 1e-6) / 1e12
            rows.append(_row("fused_moe bf16 prefill", tokens, us, "torch per-expert loop", peer_us,
                             rate_key="tflops", rate=tflops,
                             goal=f">= 0.6 x bf16 matmul ({0.6 * mm_rate / 1e12:.0f} TFLOP/s)",
                             met=tflops * 1e12 >= 0.6 * mm_rate, ok=ok, max_err=max_err, rel_err=rel_err))
        del got
    return rows


def _fp8_rows(w13, w2, gen, copy_bw, fp8_rate, bf16_rate) -> list[dict]:
    w13_q, w13_s = _quant_channels(w13)
    w2_q, w2_s = _quant_channels(w2)
    rows = []
    for tokens in (64, 4096):
        x = torch.randn(tokens, HIDDEN, device=DEVICE, generator=gen).to(torch.bfloat16)
        logits = torch.randn(tokens, E, device=DEVICE, generator=gen)  # fp32: no exact ties (tie order is free)
        args = (x, w13_q, w13_s, w2_q, w2_s, logits, TOP_K, True)
        got = M.triton_fused_moe_fp8(*args)
        want = fused_moe_fp8.reference(*args)
        max_err, rel_err = _errors(got, want)
        ok = rel_err < 3e-2
        us = _bench_us(lambda a=args: M.triton_fused_moe_fp8(*a))
        try:
            peer_us = _bench_us(lambda a=args: torch_loop_fp8(*a), rep=300)
            peer = "torch loop, _scaled_mm row-wise"
        except Exception as exc:  # no row-wise _scaled_mm here: the bf16 loop on the dequantized weights
            print(f"FP8 loop unavailable ({type(exc).__name__}: {exc}); peer is the bf16 loop")
            peer_us = _bench_us(lambda a=(x, w13, w2, logits, TOP_K, True): torch_loop(*a), rep=300)
            peer = "torch loop, bf16 (no row-wise _scaled_mm)"
        if tokens == 64:
            nbytes = _active_experts(logits) * (3 * HIDDEN * INTER + 4 * (2 * INTER + HIDDEN))
            gbps = nbytes / (us * 1e-6) / 1e9
            rows.append(_row("fused_moe_fp8 decode", tokens, us, peer, peer_us, rate_key="gbps", rate=gbps,
                             goal=f">= 0.85 x copy BW ({0.85 * copy_bw / 1e9:.0f} GB/s)",
                             met=gbps * 1e9 >= 0.85 * copy_bw, ok=ok, max_err=max_err, rel_err=rel_err,
                             shape_extra=" e4m3fn per-channel"))
        else:
            tflops = 6 * tokens * TOP_K * HIDDEN * INTER / (us * 1e-6) / 1e12
            ref_rate, ref_name = (fp8_rate, "FP8 _scaled_mm") if fp8_rate else (bf16_rate, "bf16 matmul")
            rows.append(_row("fused_moe_fp8 prefill", tokens, us, peer, peer_us, rate_key="tflops", rate=tflops,
                             goal=f">= 0.6 x {ref_name} ({0.6 * ref_rate / 1e12:.0f} TFLOP/s)",
                             met=tflops * 1e12 >= 0.6 * ref_rate, ok=ok, max_err=max_err, rel_err=rel_err,
                             shape_extra=" e4m3fn per-channel"))
        # the same with fast FP8 accumulation (sm_90 sums the whole K loop in its reduced precision): how much
        # speed the default per-K-tile promotion costs, and how much accuracy it buys
        cfg = M.moe_config(tokens, E, TOP_K, HIDDEN, INTER, torch.bfloat16, True)
        fast = M.MoeConfig(cfg.BLOCK_M, cfg.gemm1, cfg.gemm2, cfg.split_k, fp8_fast_accum=True)
        fast_err = _errors(M.triton_fused_moe_fp8(*args, config=fast), want)
        fast_us = _bench_us(lambda a=args, c=fast: M.triton_fused_moe_fp8(*a, config=c))
        rows.append({"bench": "fused_moe_fp8 fast-accum", "shape": rows[-1]["shape"], "us": fast_us,
                     "peer": "default (promoted) FP8 kernel", "peer_us": us, "ratio": us / fast_us,
                     "goal": f"informational (rel err {fast_err[1]:.3g} vs {rel_err:.3g} promoted)", "met": True,
                     "max_err": fast_err[0], "rel_err": fast_err[1]})
        del got, want
    return rows


def _graph_row(w13, w2, gen) -> dict:
    tokens = 64
    x = torch.randn(tokens, HIDDEN, device=DEVICE, generator=gen).to(torch.bfloat16)
    logits = torch.randn(tokens, E, device=DEVICE, generator=gen)
    args = (x, w13, w2, logits, TOP_K, True)
    M.triton_fused_moe(*args)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = M.triton_fused_moe(*args)
    x.copy_(torch.randn(tokens, HIDDEN, device=DEVICE, generator=gen).to(torch.bfloat16))
    logits.copy_(torch.randn(tokens, E, device=DEVICE, generator=gen))
    graph.replay()
    eager = M.triton_fused_moe(*args)
    same = torch.equal(out, eager)
    err = (out.float() - eager.float()).abs().max().item()
    us = _bench_us(graph.replay)
    eager_us = _bench_us(lambda: M.triton_fused_moe(*args))
    return {"bench": "fused_moe bf16 CUDA graph replay", "shape": f"T={tokens} E={E} top{TOP_K} H={HIDDEN} I={INTER}",
            "us": us, "gbps": _active_experts(logits) * 3 * HIDDEN * INTER * 2 / (us * 1e-6) / 1e9,
            "peer": "eager call", "peer_us": eager_us, "ratio": eager_us / us,
            "goal": "captures; replay after in-place x / logits change == eager"
                    + ("" if same else f" (err {err:.3g})"),
            "met": same, "max_err": err}


SWEEP = {
    64: [M.MoeConfig(16, M.GemmConfig(128, 128, 16, 4, 4), M.GemmConfig(128, 128, 16, 4, 4)),
         M.MoeConfig(16, M.GemmConfig(64, 256, 16, 4, 3), M.GemmConfig(64, 256, 16, 4, 3)),
         M.MoeConfig(32, M.GemmConfig(128, 128, 64, 4, 4), M.GemmConfig(128, 128, 64, 4, 4)),
         M.MoeConfig(32, M.GemmConfig(128, 128, 64, 4, 3), M.GemmConfig(64, 128, 64, 4, 3)),
         M.MoeConfig(32, M.GemmConfig(128, 128, 64, 4, 3), M.GemmConfig(128, 128, 64, 4, 3), split_k=2),
         M.MoeConfig(64, M.GemmConfig(128, 128, 1, 4, 3), M.GemmConfig(128, 128, 1, 4, 3))],
    4096: [M.MoeConfig(128, M.GemmConfig(256, 64, 8, 8, 3), M.GemmConfig(256, 64, 8, 8, 3)),
           M.MoeConfig(128, M.GemmConfig(128, 64, 16, 8, 4), M.GemmConfig(128, 64, 16, 8, 4)),
           M.MoeConfig(128, M.GemmConfig(256, 64, 16, 8, 4), M.GemmConfig(128, 128, 16, 8, 3)),
           M.MoeConfig(64, M.GemmConfig(256, 64, 16, 4, 4), M.GemmConfig(256, 64, 16, 4, 4))],
}


def _sweep_rows(w13, w2, gen) -> list[dict]:
    rows = []
    for tokens, configs in SWEEP.items():
        x = torch.randn(tokens, HIDDEN, device=DEVICE, generator=gen).to(torch.bfloat16)
        logits = torch.randn(tokens, E, device=DEVICE, generator=gen)  # fp32: no exact ties (tie order is free)
        args = (x, w13, w2, logits, TOP_K, True)
        want = M.triton_fused_moe(*args)
        default_us = _bench_us(lambda a=args: M.triton_fused_moe(*a))
        for cfg in configs:
            try:
                got = M.triton_fused_moe(*args, config=cfg)
                ok = _errors(got, want)[1] < 1e-2
                us = _bench_us(lambda a=args, c=cfg: M.triton_fused_moe(*a, config=c))
                goal = "tuning (informational)" if ok else "WRONG RESULT"
            except Exception as exc:
                us, ok, goal = float("nan"), False, f"failed: {type(exc).__name__}"
            rows.append({"bench": "fused_moe bf16 sweep", "shape": f"T={tokens} {cfg}", "us": us,
                         "peer": "default config", "peer_us": default_us, "ratio": default_us / us, "goal": goal,
                         "met": ok})
    return rows


def run(sweep: bool | None = None) -> list[dict]:
    if not torch.cuda.is_available():
        print("benchmarks/gpu/moe.py needs a CUDA GPU; no rows")
        return []
    if sweep is None:
        sweep = os.environ.get("ENGINE_BENCH_SWEEP", "0") not in ("", "0")
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    copy_bw = copy_bandwidth()
    bf16_rate, fp8_rate = matmul_rates()
    torch.cuda.empty_cache()
    w13, w2 = _weights(gen)
    rows = _bf16_rows(w13, w2, gen, copy_bw, bf16_rate)
    rows.append(_graph_row(w13, w2, gen))
    if sweep:
        rows += _sweep_rows(w13, w2, gen)
    torch.cuda.empty_cache()
    rows += _fp8_rows(w13, w2, gen, copy_bw, fp8_rate, bf16_rate)
    for r in rows:
        r["copy_gbps"] = copy_bw / 1e9
        r["bf16_matmul_tflops"] = bf16_rate / 1e12
        if fp8_rate:
            r["fp8_matmul_tflops"] = fp8_rate / 1e12
    return rows


if __name__ == "__main__":
    import sys

    for r in run(sweep="--sweep" in sys.argv):
        rate = f"{r['gbps']:.0f} GB/s" if "gbps" in r else (f"{r['tflops']:.0f} TFLOP/s" if "tflops" in r else "")
        print(f"{'MET ' if r['met'] else 'MISS'} {r['bench']:<34} {r['us']:9.1f} us  {rate:>14}  "
              f"{r['peer']} {r['peer_us']:.1f} us  x{r['ratio']:.2f}  [{r['goal']}]  {r['shape']}")
