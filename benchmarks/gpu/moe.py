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

``run(tiny=True)`` (``--tiny``) runs every row, and the first setting of each sweep, at ``TINY``: 4 small experts,
on the CPU under the Triton interpreter where there is no GPU (what CI runs: the numbers mean nothing).
"""

from __future__ import annotations

import dataclasses
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

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


@dataclasses.dataclass(frozen=True)
class Setup:
    """Experts, top-k, hidden and intermediate sizes, token counts (decode, prefill), the matmul size of the rate
    ceilings, and the device. FULL is what the benchmark measures; TINY runs the same code in seconds."""
    e: int = 8
    top_k: int = 2
    hidden: int = 4096
    inter: int = 14336
    tokens: tuple[int, int] = (64, 4096)  # (decode, prefill)
    rate_n: int = 8192
    copy_bytes: int = 1 << 30
    sweep_first: int | None = None  # run only this many settings of each sweep
    device: str = "cuda"

    def shape(self, tokens: int) -> str:
        return f"T={tokens} E={self.e} top{self.top_k} H={self.hidden} I={self.inter}"


FULL = Setup()
TINY = Setup(e=4, top_k=2, hidden=32, inter=64, tokens=(2, 6), rate_n=64, copy_bytes=1 << 20, sweep_first=1,
             device="cuda" if torch.cuda.is_available() else "cpu")


def copy_bandwidth(s: Setup = FULL) -> float:
    return ceilings.copy_bandwidth(s.device, s.copy_bytes)


def matmul_rates(s: Setup = FULL) -> tuple[float, float | None]:
    """(bf16 torch.matmul FLOP/s, FP8 torch._scaled_mm per-tensor FLOP/s or None) at 8192^3."""
    n = s.rate_n
    bf16 = ceilings.bf16_gemm_rate(s.device, n)
    x = torch.randn(n, n, device=s.device, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=s.device, dtype=torch.bfloat16)
    try:
        xq, yq = x.to(FP8), y.to(FP8).t()  # mat2 column-major
        one = torch.ones((), device=s.device)
        fp8 = 2 * n ** 3 / (_bench_us(lambda: torch._scaled_mm(xq, yq, scale_a=one, scale_b=one,
                                                                out_dtype=torch.bfloat16), warmup=50, rep=300) * 1e-6)
    except Exception as exc:  # no FP8 GEMM in this torch / on this GPU
        print(f"FP8 _scaled_mm unavailable: {type(exc).__name__}: {exc}")
        fp8 = None
    return bf16, fp8


# ---- inputs and peers ------------------------------------------------------------------------------------------

def _weights(s: Setup, gen):
    w13 = torch.empty(s.e, 2 * s.inter, s.hidden, device=s.device, dtype=torch.bfloat16)
    w2 = torch.empty(s.e, s.hidden, s.inter, device=s.device, dtype=torch.bfloat16)
    for e in range(s.e):  # one expert at a time: fp32 randn of all of w13 would take 3.8 GB
        w13[e] = torch.randn(2 * s.inter, s.hidden, device=s.device, generator=gen) * s.hidden ** -0.5
        w2[e] = torch.randn(s.hidden, s.inter, device=s.device, generator=gen) * s.inter ** -0.5
    return w13, w2


def _quant_channels(w):
    """Per expert, per output channel: (w_q e4m3fn, scales fp32 [E, N, 1])."""
    scale = w.abs().amax(dim=2, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    q = torch.empty(w.shape, device=w.device, dtype=FP8)
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
    inter = w2.shape[2]
    for e in range(w13.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        gate_up = x[tok] @ w13[e].t()
        y = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ w2[e].t()
        out.index_add_(0, tok, y.float() * weights[tok, slot, None])
    return out.to(x.dtype)


def _quant_rows(a):
    scale = a.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (a.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def torch_loop_fp8(x, w13_q, w13_s, w2_q, w2_s, logits, top_k, renormalize):
    """The same loop in W8A8: per-token quantization in torch, ``torch._scaled_mm`` with row-wise scales."""
    weights, ids = _route(logits, top_k, renormalize)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    inter = w2_q.shape[2]
    for e in range(w13_q.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        xq, xs = _quant_rows(x[tok])
        gate_up = torch._scaled_mm(xq, w13_q[e].t(), scale_a=xs, scale_b=w13_s[e].reshape(1, -1),
                                   out_dtype=torch.bfloat16)
        hq, hs = _quant_rows(F.silu(gate_up[:, :inter]) * gate_up[:, inter:])
        y = torch._scaled_mm(hq, w2_q[e].t(), scale_a=hs, scale_b=w2_s[e].reshape(1, -1), out_dtype=torch.bfloat16)
        out.index_add_(0, tok, y.float() * weights[tok, slot, None])
    return out.to(x.dtype)


def _errors(got, want) -> tuple[float, float]:
    d = got.float() - want.float()
    return d.abs().max().item(), (d.norm() / want.float().norm()).item()


def _active_experts(logits, top_k: int) -> int:
    return int(torch.topk(logits.float(), top_k, dim=-1)[1].unique().numel())


# ---- rows ------------------------------------------------------------------------------------------------------

def _row(bench, shape, us, peer, peer_us, *, rate_key, rate, goal, met, ok, max_err, rel_err):
    if not ok:
        goal, met = f"WRONG RESULT (rel err {rel_err:.3g}) " + goal, False
    return {"bench": bench, "shape": shape, "us": us,
            rate_key: rate, "peer": peer, "peer_us": peer_us, "ratio": peer_us / us, "goal": goal, "met": met,
            "max_err": max_err, "rel_err": rel_err}


def _bf16_rows(s: Setup, w13, w2, gen, copy_bw, mm_rate) -> list[dict]:
    rows = []
    hidden, inter, top_k = s.hidden, s.inter, s.top_k
    for tokens in s.tokens:
        x = torch.randn(tokens, hidden, device=s.device, generator=gen).to(torch.bfloat16)
        logits = torch.randn(tokens, s.e, device=s.device, generator=gen)  # fp32: no exact ties (tie order is free)
        args = (x, w13, w2, logits, top_k, True)
        got = M.triton_fused_moe(*args)
        max_err, rel_err = _errors(got, fused_moe.reference(*args))
        ok = rel_err < 1e-2
        us = _bench_us(lambda a=args: M.triton_fused_moe(*a))
        peer_us = _bench_us(lambda a=args: torch_loop(*a), rep=300)
        if tokens == s.tokens[0]:
            nbytes = _active_experts(logits, top_k) * 3 * hidden * inter * 2
            gbps = nbytes / (us * 1e-6) / 1e9
            rows.append(_row("fused_moe bf16 decode", s.shape(tokens), us, "torch per-expert loop", peer_us,
                             rate_key="gbps", rate=gbps,
                             goal=f">= 0.85 x copy BW ({0.85 * copy_bw / 1e9:.0f} GB/s), ~2x the loop",
                             met=gbps * 1e9 >= 0.85 * copy_bw, ok=ok, max_err=max_err, rel_err=rel_err))
        else:
            tflops = 6 * tokens * top_k * hidden * inter / (us * 1e-6) / 1e12
            rows.append(_row("fused_moe bf16 prefill", s.shape(tokens), us, "torch per-expert loop", peer_us,
                             rate_key="tflops", rate=tflops,
                             goal=f">= 0.6 x bf16 matmul ({0.6 * mm_rate / 1e12:.0f} TFLOP/s)",
                             met=tflops * 1e12 >= 0.6 * mm_rate, ok=ok, max_err=max_err, rel_err=rel_err))
        del got
    return rows


def _fp8_rows(s: Setup, w13, w2, gen, copy_bw, fp8_rate, bf16_rate) -> list[dict]:
    w13_q, w13_s = _quant_channels(w13)
    w2_q, w2_s = _quant_channels(w2)
    rows = []
    hidden, inter, top_k = s.hidden, s.inter, s.top_k
    for tokens in s.tokens:
        x = torch.randn(tokens, hidden, device=s.device, generator=gen).to(torch.bfloat16)
        logits = torch.randn(tokens, s.e, device=s.device, generator=gen)  # fp32: no exact ties (tie order is free)
        args = (x, w13_q, w13_s, w2_q, w2_s, logits, top_k, True)
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
            peer_us = _bench_us(lambda a=(x, w13, w2, logits, top_k, True): torch_loop(*a), rep=300)
            peer = "torch loop, bf16 (no row-wise _scaled_mm)"
        shape = s.shape(tokens) + " e4m3fn per-channel"
        if tokens == s.tokens[0]:
            nbytes = _active_experts(logits, top_k) * (3 * hidden * inter + 4 * (2 * inter + hidden))
            gbps = nbytes / (us * 1e-6) / 1e9
            rows.append(_row("fused_moe_fp8 decode", shape, us, peer, peer_us, rate_key="gbps", rate=gbps,
                             goal=f">= 0.85 x copy BW ({0.85 * copy_bw / 1e9:.0f} GB/s)",
                             met=gbps * 1e9 >= 0.85 * copy_bw, ok=ok, max_err=max_err, rel_err=rel_err))
        else:
            tflops = 6 * tokens * top_k * hidden * inter / (us * 1e-6) / 1e12
            ref_rate, ref_name = (fp8_rate, "FP8 _scaled_mm") if fp8_rate else (bf16_rate, "bf16 matmul")
            rows.append(_row("fused_moe_fp8 prefill", shape, us, peer, peer_us, rate_key="tflops", rate=tflops,
                             goal=f">= 0.6 x {ref_name} ({0.6 * ref_rate / 1e12:.0f} TFLOP/s)",
                             met=tflops * 1e12 >= 0.6 * ref_rate, ok=ok, max_err=max_err, rel_err=rel_err))
        # the same with fast FP8 accumulation (sm_90 sums the whole K loop in its reduced precision): how much
        # speed the default per-K-tile promotion costs, and how much accuracy it buys
        cfg = M.moe_config(tokens, s.e, top_k, hidden, inter, torch.bfloat16, True)
        fast = M.MoeConfig(cfg.BLOCK_M, cfg.gemm1, cfg.gemm2, cfg.split_k, fp8_fast_accum=True)
        fast_err = _errors(M.triton_fused_moe_fp8(*args, config=fast), want)
        fast_us = _bench_us(lambda a=args, c=fast: M.triton_fused_moe_fp8(*a, config=c))
        rows.append({"bench": "fused_moe_fp8 fast-accum", "shape": rows[-1]["shape"], "us": fast_us,
                     "peer": "default (promoted) FP8 kernel", "peer_us": us, "ratio": us / fast_us,
                     "goal": f"informational (rel err {fast_err[1]:.3g} vs {rel_err:.3g} promoted)", "met": True,
                     "max_err": fast_err[0], "rel_err": fast_err[1]})
        del got, want
    return rows


def _graph_row(s: Setup, w13, w2, gen) -> dict:
    tokens = s.tokens[0]
    x = torch.randn(tokens, s.hidden, device=s.device, generator=gen).to(torch.bfloat16)
    logits = torch.randn(tokens, s.e, device=s.device, generator=gen)
    args = (x, w13, w2, logits, s.top_k, True)
    replay, out = ceilings.capture(lambda: M.triton_fused_moe(*args))
    x.copy_(torch.randn(tokens, s.hidden, device=s.device, generator=gen).to(torch.bfloat16))
    logits.copy_(torch.randn(tokens, s.e, device=s.device, generator=gen))
    replay()
    eager = M.triton_fused_moe(*args)
    same = torch.equal(out, eager)
    err = (out.float() - eager.float()).abs().max().item()
    us = _bench_us(replay)
    eager_us = _bench_us(lambda: M.triton_fused_moe(*args))
    return {"bench": "fused_moe bf16 CUDA graph replay", "shape": s.shape(tokens),
            "us": us, "gbps": _active_experts(logits, s.top_k) * 3 * s.hidden * s.inter * 2 / (us * 1e-6) / 1e9,
            "peer": "eager call", "peer_us": eager_us, "ratio": eager_us / us,
            "goal": "captures; replay after in-place x / logits change == eager"
                    + ("" if same else f" (err {err:.3g})"),
            "met": same, "max_err": err}


SWEEP = {  # decode (64 tokens), prefill (4096 tokens): at TINY, its two token counts
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


def _sweep_rows(s: Setup, w13, w2, gen) -> list[dict]:
    rows = []
    for tokens, configs in zip(s.tokens, SWEEP.values(), strict=True):
        x = torch.randn(tokens, s.hidden, device=s.device, generator=gen).to(torch.bfloat16)
        logits = torch.randn(tokens, s.e, device=s.device, generator=gen)  # fp32: no exact ties (tie order is free)
        args = (x, w13, w2, logits, s.top_k, True)
        want = M.triton_fused_moe(*args)
        default_us = _bench_us(lambda a=args: M.triton_fused_moe(*a))
        for cfg in configs[:s.sweep_first]:
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


def run(sweep: bool | None = None, tiny: bool = False) -> list[dict]:
    """The rows above (``tiny``: at ``TINY``, with the first setting of each sweep when ``sweep``)."""
    s = TINY if tiny else FULL
    if s.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu/moe.py needs a CUDA GPU; no rows")
        return []
    if sweep is None:
        sweep = os.environ.get("ENGINE_BENCH_SWEEP", "0") not in ("", "0")
    gen = torch.Generator(device=s.device).manual_seed(0)
    copy_bw = copy_bandwidth(s)
    bf16_rate, fp8_rate = matmul_rates(s)
    if s.device == "cuda":
        torch.cuda.empty_cache()
    w13, w2 = _weights(s, gen)
    rows = _bf16_rows(s, w13, w2, gen, copy_bw, bf16_rate)
    rows.append(_graph_row(s, w13, w2, gen))
    if sweep:
        rows += _sweep_rows(s, w13, w2, gen)
    if s.device == "cuda":
        torch.cuda.empty_cache()
    rows += _fp8_rows(s, w13, w2, gen, copy_bw, fp8_rate, bf16_rate)
    for r in rows:
        r["copy_gbps"] = copy_bw / 1e9
        r["bf16_matmul_tflops"] = bf16_rate / 1e12
        if fp8_rate:
            r["fp8_matmul_tflops"] = fp8_rate / 1e12
    return rows


if __name__ == "__main__":
    import sys

    for r in run(sweep="--sweep" in sys.argv, tiny="--tiny" in sys.argv):
        rate = f"{r['gbps']:.0f} GB/s" if "gbps" in r else (f"{r['tflops']:.0f} TFLOP/s" if "tflops" in r else "")
        print(f"{'MET ' if r['met'] else 'MISS'} {r['bench']:<34} {r['us']:9.1f} us  {rate:>14}  "
              f"{r['peer']} {r['peer_us']:.1f} us  x{r['ratio']:.2f}  [{r['goal']}]  {r['shape']}")
