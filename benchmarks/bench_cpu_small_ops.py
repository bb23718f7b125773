"""The native small ops (rms_norm, fused add + rms_norm, rotary_embedding, silu_and_mul) per ISA path.

Calls the kernels of ``engine.platforms.cpu._native`` directly (no Python wrapper), one thread, and
prints the median microseconds per call of each (op, dtype, shape, ISA). For before/after
comparisons run it under benchmarks/bench_cpu_ab.py with two builds of the module:
``python benchmarks/bench_cpu_ab.py BEFORE.so AFTER.so -- benchmarks/bench_cpu_small_ops.py``.
"""

from __future__ import annotations

import argparse

import torch
from cpu_timing import median_seconds

from engine.platforms.cpu import _native

CODE = {"fp32": (torch.float32, 0), "bf16": (torch.bfloat16, 1)}


def cases(dtype: torch.dtype, code: int, gen: torch.Generator):
    """(name, callable) pairs: SmolLM2-135M-like shapes (576 / 1536 / 9x64 heads) and a larger model's."""
    out = []
    for rows, hidden in ((1, 576), (64, 576), (1, 4096), (32, 4096), (16, 4099)):
        x = torch.randn(rows, hidden, generator=gen).to(dtype)
        r = torch.randn(rows, hidden, generator=gen).to(dtype)
        w = torch.randn(hidden, generator=gen).to(dtype)
        o, s = torch.empty_like(x), torch.empty_like(x)
        out.append((f"rms_norm {rows}x{hidden}", lambda x=x, w=w, o=o, rows=rows, h=hidden: _native.rms_norm(
            x.data_ptr(), h, w.data_ptr(), o.data_ptr(), h, rows, h, 1e-6, code)))
        out.append((f"add_rms_norm {rows}x{hidden}", lambda x=x, r=r, w=w, o=o, s=s, rows=rows, h=hidden:
                     _native.fused_add_rms_norm(x.data_ptr(), h, r.data_ptr(), h, w.data_ptr(), o.data_ptr(), h,
                                                s.data_ptr(), h, rows, h, 1e-6, code)))
    for rows, d in ((1, 1536), (64, 1536), (16, 11008), (8, 1001)):
        x = torch.randn(rows, 2 * d, generator=gen).to(dtype)
        o = torch.empty(rows, d, dtype=dtype)
        out.append((f"silu_and_mul {rows}x{d}", lambda x=x, o=o, rows=rows, d=d: _native.silu_and_mul(
            x.data_ptr(), 2 * d, o.data_ptr(), d, rows, d, code)))
    for tokens, hq, hk, hd, rot in ((1, 9, 3, 64, 64), (64, 9, 3, 64, 64), (16, 32, 8, 128, 128), (16, 32, 8, 80, 40)):
        pos = torch.randint(0, 2048, (tokens,), generator=gen)
        cs = torch.randn(2048, rot, generator=gen)
        q = torch.randn(tokens, hq * hd, generator=gen).to(dtype)
        k = torch.randn(tokens, hk * hd, generator=gen).to(dtype)
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        for neox in (True, False):
            out.append((f"rotary {'neox' if neox else 'gptj'} {tokens}x{hq}/{hk}x{hd} rot {rot}",
                        lambda p=pos, q=q, k=k, qo=qo, ko=ko, cs=cs, t=tokens, hq=hq, hk=hk, hd=hd, rot=rot,
                        neox=neox: _native.rotary_embedding(
                            p.data_ptr(), t, q.data_ptr(), hq * hd, t, hq, qo.data_ptr(), k.data_ptr(), hk * hd, t,
                            hk, ko.data_ptr(), cs.data_ptr(), 2048, rot, hd, neox, code)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--isa", action="append", help="ISA paths to time (default: every supported)")
    ap.add_argument("--dtype", action="append", choices=sorted(CODE), help="default: fp32 and bf16")
    args = ap.parse_args()
    _native.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    for isa in args.isa or [i for i in _native.supported_isas() if i != "scalar"]:
        _native.set_isa(isa)
        for name in args.dtype or ["fp32", "bf16"]:
            dtype, code = CODE[name]
            for label, fn in cases(dtype, code, gen):
                print(f"{isa:7} {name:5} {label:40} {median_seconds(fn, min_time=0.05) * 1e6:9.2f} us", flush=True)


if __name__ == "__main__":
    main()
