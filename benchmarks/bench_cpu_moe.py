"""Unquantized fused MoE on the cpu platform: the native kernel vs a plain torch per-expert loop.

Scaled-down Mixtral shape by default (8 experts, top-2, hidden 1024, intermediate 3584), fp32 and bf16,
T = 1, 16, 64, 256 tokens. Both sides get the same thread count (torch.set_num_threads and the native
pool). Prints the median time per call of

* native: ``fused_moe`` called the way the model calls it (dispatch included): routing, grouping and
          the expert GEMMs in one C++ call;
* torch:  route with torch.softmax / topk, then per expert with tokens: index_select its rows,
          ``x @ w13[e].T``, silu(gate) * up, ``@ w2[e].T``, weighted ``index_add_`` into an fp32 sum
          (matmuls in the model dtype: torch's own fastest path, oneDNN/MKL);

and torch/native (> 1: native is faster). Both are first checked against the op's reference. Run:
``python benchmarks/bench_cpu_moe.py [--threads N] [--isa NAME] [--dtype fp32 bf16] [--tokens 1 16 64 256]
[--json]`` (on a machine where another plugin would win, add ``ENGINE_PLATFORM=cpu``).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from cpu_timing import median_seconds

from engine.core.ops.moe import distinct_logits, fused_moe
from engine.core.ops.registry import active_registry
from engine.platforms.cpu import _native

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}




def torch_loop(x, w13, w2, router_logits, top_k, renormalize):
    weights, ids = torch.topk(torch.softmax(router_logits.float(), dim=-1), top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in range(w13.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        gate_up = x.index_select(0, tok) @ w13[e].t()
        y = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ w2[e].t()
        out.index_add_(0, tok, y.float() * weights[tok, slot, None])
    return out.to(x.dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="threads for both (default: the native pool's)")
    ap.add_argument("--isa", default=None, help="force a native ISA variant (avx512, avx2, neon, scalar)")
    ap.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 16, 64, 256])
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--inter", type=int, default=3584)
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = ap.parse_args()
    threads = args.threads or _native.num_threads()
    _native.set_num_threads(threads)
    torch.set_num_threads(threads)
    if args.isa:
        _native.set_isa(args.isa)
    gen = torch.Generator().manual_seed(0)
    e, h, i, k = args.experts, args.hidden, args.inter, args.top_k
    rows = []
    if not args.json:
        print(f"fused MoE: {e} experts, top-{k}, hidden {h}, intermediate {i}; native isa={_native.isa()}, "
              f"{threads} threads (native and torch)")
        print(f"{'dtype':>5} {'T':>4} | {'native ms':>10} {'torch ms':>10} | {'torch/native':>12}")
    for name in args.dtype:
        dtype = DTYPES[name]
        w13 = (torch.randn(e, 2 * i, h, generator=gen) * h ** -0.5).to(dtype)
        w2 = (torch.randn(e, h, i, generator=gen) * i ** -0.5).to(dtype)
        for t in args.tokens:
            x = torch.randn(t, h, generator=gen).to(dtype)
            moe_args = (x, w13, w2, distinct_logits(t, e, dtype, "cpu", gen), k, True)
            impl = active_registry().select(fused_moe, moe_args)
            assert impl.platform == "cpu", f"dispatch chose {impl.qualname}"
            want = fused_moe.reference(*moe_args)
            tol = fused_moe.tolerances[dtype]
            torch.testing.assert_close(fused_moe(*moe_args), want, atol=tol.atol, rtol=tol.rtol)
            # The loop rounds gate/up and h to the model dtype between its matmuls (bf16): a looser check.
            torch.testing.assert_close(torch_loop(*moe_args), want, atol=4 * tol.atol, rtol=4 * tol.rtol)
            t_nat = median_seconds(lambda a=moe_args: fused_moe(*a), warmup=2, min_time=1.0, max_reps=200)
            t_torch = median_seconds(lambda a=moe_args: torch_loop(*a), warmup=2, min_time=1.0, max_reps=200)
            rows.append({"dtype": name, "tokens": t, "native_ms": t_nat * 1e3, "torch_ms": t_torch * 1e3,
                         "torch_over_native": t_torch / t_nat})
            if not args.json:
                print(f"{name:>5} {t:>4} | {t_nat * 1e3:>10.2f} {t_torch * 1e3:>10.2f} | {t_torch / t_nat:>12.2f}")
    if args.json:
        print(json.dumps({"shape": {"experts": e, "top_k": k, "hidden": h, "inter": i}, "isa": _native.isa(),
                          "threads": threads, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
