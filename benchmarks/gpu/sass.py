"""Static cost of the Triton kernels' main loops on sm_90, with no GPU: each kernel is compiled offline for an H100 /
H200 target (Triton's own ptxas) and its SASS between the loop's branches is counted: instructions, barriers
(``BAR.SYNC``: layout conversions through shared memory show up here), tensor-core ops, global loads. A step that
needs fewer instructions and no barriers is not always faster, but a barrier or a re-made constant per value is
always a cost; this is how those were found (2026-12-08).

    python benchmarks/gpu/sass.py [--only NAME] [--json out.json]

Rows are "info": the peer column is the kernel's whole program. ``run(tiny=True)`` compiles the first kernel only
(what CI runs); it runs in a subprocess without ``TRITON_INTERPRET`` (the interpreter cannot compile).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

DIVISIBLE = ("N", "K", "KW", "NB", "k_per_split", "words_per_split", "blocks_per_split")


def _int4(kernel: str, **const) -> tuple:
    return ("engine.platforms.triton_kernels.int4_linear", kernel, const)


# name: (module, kernel, constexprs, pointer / scalar signature, num_warps, num_stages)
I4_SIG = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*u8", "bias_ptr": "*bf16",
          "out_ptr": "*bf16", "part_ptr": "*fp32"}
KERNELS = {
    "int4 dot M=64 (plane pairs, PTX)": (
        "int4_linear", "_dot_kernel", {**I4_SIG, "w_ptr": "*i32"},
        dict(WPG=16, HAS_ZERO=True, HAS_BIAS=False, SPLIT=False, INTERPRET=False, BLOCK_M=64, BLOCK_N=128,
             BLOCK_T=16, ASM=True, ONE_GROUP=True, PLANES=True, AHEAD=False), 8, 3),
    "int4 dot M=64 (K order, fp32 decode: session 26's default)": (
        "int4_linear", "_dot_kernel", {**I4_SIG, "w_ptr": "*i32"},
        dict(WPG=16, HAS_ZERO=True, HAS_BIAS=False, SPLIT=False, INTERPRET=False, BLOCK_M=64, BLOCK_N=128,
             BLOCK_T=16, ASM=False, ONE_GROUP=True, PLANES=False, AHEAD=False), 8, 3),
    "int4 GEMV M=1 (mantissa decode)": (
        "int4_linear", "_gemv_kernel", {**I4_SIG, "w_ptr": "*i64", "ZERO": "i32"},
        dict(HAS_ZERO=True, HAS_BIAS=False, SPLIT=False, BLOCK_M=1, BLOCK_N=4, BLOCK_B=128, EVEN=True,
             MANTISSA=True), 4, 2),
    "int8 GEMV M=1 (symmetric)": (
        "int8_linear", "_gemv_kernel", {**I4_SIG, "w_ptr": "*u8"},
        dict(GROUP=32, HAS_ZERO=False, HAS_BIAS=False, SPLIT=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=512), 4, 2),
    "int8 dot M=64 (symmetric, groups of 32)": (
        "int8_linear", "_dot_kernel", {**I4_SIG, "w_ptr": "*u8"},
        dict(GROUP=32, HAS_ZERO=False, HAS_BIAS=False, SPLIT=False, INTERPRET=False, BLOCK_M=64, BLOCK_N=128,
             BLOCK_K=32), 8, 4),
    "fp8 GEMV M=1 (per-channel)": (
        "fp8_gemv", "_fp8_gemv_kernel", {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "out_ptr": "*bf16",
                                         "xs_ptr": "*fp32", "ws_ptr": "*fp32", "part_ptr": "*fp32"},
        dict(X_MODE=1, W_MODE=1, SPLIT=False, SB=128, BLOCK_M=1, BLOCK_N=8, BLOCK_K=512), 4, 2),
    "nvfp4 dot M=64 (K order, PTX, SBLK: the default)": (
        "nvfp4", "_dot_kernel", {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "gs_ptr": "*fp32",
                                 "bias_ptr": "*bf16", "out_ptr": "*bf16", "part_ptr": "*fp32"},
        dict(HAS_BIAS=False, SPLIT=False, INTERPRET=False, BLOCK_M=64, BLOCK_N=128, BLOCK_T=16, KORDER=True,
             ASM=True, SBLK=True, PAIRS=False), 8, 3),
    "nvfp4 dot M=64 (plane pairs, PTX)": (
        "nvfp4", "_dot_kernel", {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "gs_ptr": "*fp32",
                                 "bias_ptr": "*bf16", "out_ptr": "*bf16", "part_ptr": "*fp32"},
        dict(HAS_BIAS=False, SPLIT=False, INTERPRET=False, BLOCK_M=64, BLOCK_N=128, BLOCK_T=16, KORDER=False,
             ASM=True, SBLK=False, PAIRS=True), 8, 3),
    "GGUF Q8_0 GEMV M=1": (
        "gguf_linear", "_gemv_kernel", {"x_ptr": "*bf16", "w_ptr": "*i16", "out_ptr": "*bf16", "part_ptr": "*fp32"},
        dict(QTYPE=8, BLOCK_WORDS=17, SPLIT=False, BLOCK_M=1, BLOCK_N=2, BLOCK_B=64), 4, 2),
    "GGUF Q4_1 GEMV M=1": (
        "gguf_linear", "_gemv_kernel", {"x_ptr": "*bf16", "w_ptr": "*i16", "out_ptr": "*bf16", "part_ptr": "*fp32"},
        dict(QTYPE=3, BLOCK_WORDS=10, SPLIT=False, BLOCK_M=1, BLOCK_N=2, BLOCK_B=64), 4, 2),
    "GGUF Q4_K tensor cores M <= 16": (
        "gguf_kquant", "_linear_kernel", {"x_ptr": "*bf16", "w_ptr": "*u8", "out_ptr": "*bf16"},
        dict(QTYPE=12, BYTES=144, INTERPRET=False, BLOCK_M=16, BLOCK_N=32), 4, 2),
}


def compile_sass(module: str, kernel: str, pointers: dict, const: dict, warps: int, stages: int) -> str:
    """The kernel compiled for sm_90 as SASS text (pointers 16-byte aligned, strides and sizes multiples of 16, as
    the engine's tensors are and as Triton specializes them at launch)."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(f"engine.platforms.triton_kernels.{module}"), kernel)
    sig = {}
    for name in fn.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
        else:
            sig[name] = "i32"
    aligned = [n for n, t in sig.items() if t.startswith("*") or n.startswith(("stride", "s_")) or n in DIVISIBLE]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
                    attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([str(nvdisasm), "-c", f.name], capture_output=True, text=True, check=True).stdout


def loop_counts(sass: str) -> dict:
    """Counts over the whole program and over the main loop (from the first conditional branch to the branch that
    jumps back: the first backward ``BRA``)."""
    lines = [ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    ops = [(m.group(2) if (m := re.search(r"\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", ln)) else "") for ln in lines]
    addr = [int(re.search(r"/\*([0-9a-f]{4})\*/", ln).group(1), 16) for ln in lines]
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := re.search(r"\.(L_x_\d+):", ln))}
    start = end = None
    for i, ln in enumerate(lines):
        m = re.search(r"BRA `\(\.(L_x_\d+)\)", ln)
        target = m and labels.get(m.group(1))
        if target is not None and target <= i and addr[target] < addr[i]:
            start, end = target, i
            break
    if start is None:  # no backward branch in the label table: the region between the first two branches
        bras = [i for i, o in enumerate(ops) if o.startswith("BRA")]
        start, end = (bras[0], bras[1]) if len(bras) > 1 else (0, len(ops) - 1)
    body = collections.Counter(o.split(".")[0] for o in ops[start:end + 1] if o)
    return {"total": sum(1 for o in ops if o), "loop": sum(body.values()), "loop_bar": body["BAR"],
            "loop_mma": body["HGMMA"] + body["HMMA"], "loop_ldg": body["LDG"] + body["LDGSTS"],
            "loop_mov": body["MOV"] + body["UMOV"], "top": body.most_common(8)}


def _rows(names) -> list[dict]:
    rows = []
    for name in names:
        module, kernel, pointers, const, warps, stages = KERNELS[name]
        c = loop_counts(compile_sass(module, kernel, pointers, const, warps, stages))
        rows.append({"bench": f"sass sm_90: {name}", "shape": f"{warps} warps, {stages} stages",
                     "us": c["loop"], "peer": "whole program", "peer_us": c["total"], "ratio": None, "goal": "info",
                     "met": None, "loop_instructions": c["loop"], "loop_barriers": c["loop_bar"],
                     "loop_tensor_core_ops": c["loop_mma"], "loop_global_loads": c["loop_ldg"],
                     "loop_moves": c["loop_mov"], "loop_top": c["top"]})
        print(f"{name}: loop {c['loop']} instructions ({c['loop_bar']} barriers, {c['loop_mma']} tensor-core ops, "
              f"{c['loop_ldg']} global loads, {c['loop_mov']} moves), program {c['total']}; "
              + ", ".join(f"{o} {n}" for o, n in c["top"]), flush=True)
    return rows


def run(device: str = "cuda", tiny: bool = False, only: str | None = None) -> list[dict]:
    names = [n for n in KERNELS if only is None or only in n]
    if tiny:
        names = names[:1]
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):  # compile in a process without the interpreter
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            args = [sys.executable, __file__, "--json", f.name] + (["--tiny"] if tiny else [])
            subprocess.run(args + (["--only", only] if only else []), env=env, check=True, capture_output=True)
            return json.loads(Path(f.name).read_text())
    return _rows(names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="kernels whose name contains this")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--tiny", action="store_true", help="the first kernel only (what CI runs)")
    args = ap.parse_args()
    rows = run(tiny=args.tiny, only=args.only)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
