"""Dynamic instruction counts of the cross-compiled kernels under qemu-user: vector kernel vs scalar.

qemu's wall time says nothing about real hardware, so this counts what does not depend on the host:
guest instructions executed per output element, measured with a tiny TCG plugin
(benchmarks/qemu/insn_count.c, built here with the host C compiler) as the difference between a run of
``ITERS_HI`` and one of ``ITERS_LO`` kernel calls (tests/csrc/kernel_runner.cpp), so set-up cancels out.

Rows: the RVV GGUF Q4_0 / Q4_1 / Q8_0 GEMV (fp32 activations) at VLEN 128 and 256 against the scalar
kernels of the same binary (``rvv`` vs ``scalar`` ISA), and the POWER9 VSX fp16 GEMV against the portable
backend of the same source (``vsx`` vs ``scalar``: plain floats, fp16 widened in software); then the one-source
small ops (RMSNorm, SiLU-and-mul, rotary; per output element) and paged decode attention (per query head and
key) on RVV (VLEN 128 / 256 / 1024), VSX and NEON, each against the portable backend of the same binary. Run:
``python benchmarks/bench_cpu_insn_count.py [--n 64] [--k 4096] [--skip-gguf]`` (needs the toolchains of .ci/run).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
ITERS_LO, ITERS_HI = 1, 3
PPC_QEMU = ["qemu-ppc64le", "-cpu", "power9", "-L", "/usr/powerpc64le-linux-gnu"]
RVV_QEMU = ["qemu-riscv64", "-L", "/usr/riscv64-linux-gnu", "-cpu", "rv64,v=true,vext_spec=v1.0,Zfh=true,vlen={vlen}"]
QTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
ARM_QEMU = ["qemu-aarch64", "-cpu", "max", "-L", "/usr/aarch64-linux-gnu"]
# (label, kernel_runner args after the ISA, output elements per call)
# More calls than the GEMV rows: these kernels are short, and the count of a run includes some start-up noise.
SMALL_ITERS = (2, 12)
SMALL = [("rms_norm 16x4096 fp32", ["small_op", "0", "16", "4096"], 16 * 4096),
         ("silu_and_mul 16x4096 fp32", ["small_op", "1", "16", "4096"], 16 * 4096),
         ("rotary neox 16 tok x 64+1 heads x 64", ["small_op", "2", "16", "4096"], 16 * (4096 + 64)),
         ("attn decode ctx 256 D 64 fp32", ["attn_decode", "0", "256", "64"], 8 * 256),
         ("attn decode ctx 256 D 64 fp16", ["attn_decode", "2", "256", "64"], 8 * 256)]


def small_rows(title: str, qemu: list[str], runner: pathlib.Path, plugin: pathlib.Path, isa: str) -> None:
    print(f"\n{title}: guest instructions per output element (attention: per query head and key)")
    print(f"{'case':>36} | {'scalar':>9} {isa:>9} | {'scalar/' + isa:>11}")
    for label, kargs, elements in SMALL:
        per = {i: per_element(qemu, runner, plugin, [kargs[0], i, *kargs[1:]], elements, SMALL_ITERS)
               for i in ("scalar", isa)}
        print(f"{label:>36} | {per['scalar']:>9.1f} {per[isa]:>9.1f} | {per['scalar'] / per[isa]:>11.2f}")


def build(target: str, out: pathlib.Path) -> pathlib.Path:
    build_dir = out / f"build-{target}"
    subprocess.run(["cmake", "-S", str(REPO / "tests" / "csrc"), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                    f"-DCMAKE_TOOLCHAIN_FILE={REPO / 'cmake' / f'toolchain-{target}.cmake'}"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build_dir), "-j2", "--target", "kernel_runner"], check=True,
                   capture_output=True)
    return build_dir / "kernel_runner"


def count(cmd: list[str], plugin: pathlib.Path) -> int:
    proc = subprocess.run([cmd[0], "-plugin", str(plugin), "-d", "plugin", *cmd[1:]], capture_output=True, text=True,
                          check=True)
    return int(re.search(r"insns (\d+)", proc.stdout + proc.stderr).group(1))


def per_element(qemu: list[str], runner: pathlib.Path, plugin: pathlib.Path, args: list[str], elements: int,
                iters: tuple[int, int] = (ITERS_LO, ITERS_HI)) -> float:
    lo = count([*qemu, str(runner), *args, str(iters[0])], plugin)
    hi = count([*qemu, str(runner), *args, str(iters[1])], plugin)
    return (hi - lo) / ((iters[1] - iters[0]) * elements)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=64, help="weight rows (output elements per call)")
    ap.add_argument("--k", type=int, default=4096, help="reduction length (multiple of 32)")
    ap.add_argument("--skip-gguf", action="store_true", help="only the small ops and attention")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp)
        plugin = out / "insn_count.so"
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(plugin), str(REPO / "benchmarks" / "qemu" /
                                                                               "insn_count.c")], check=True)
        runner = build("riscv64", out)
        for vlen in (128, 256, 1024):
            small_rows(f"RVV, VLEN {vlen}", [a.format(vlen=vlen) for a in RVV_QEMU], runner, plugin, "rvv")
        ppc_runner = build("ppc64le", out)
        small_rows("VSX, qemu-ppc64le -cpu power9", PPC_QEMU, ppc_runner, plugin, "vsx")
        small_rows("NEON, qemu-aarch64 -cpu max", ARM_QEMU, build("aarch64", out), plugin, "neon")
        if args.skip_gguf:
            return
        print(f"\nRVV GGUF GEMV, fp32 activations, n={args.n} k={args.k}: guest instructions per output element "
              f"(qemu-riscv64 TCG plugin, runs of {ITERS_HI} minus {ITERS_LO} calls)")
        print(f"{'qtype':>6} {'VLEN':>5} | {'scalar':>10} {'rvv':>10} | {'scalar/rvv':>10}")
        for name, qt in QTYPES.items():
            for vlen in (128, 256):
                qemu = [a.format(vlen=vlen) for a in RVV_QEMU]
                kargs = lambda isa, qt=qt: ["gguf_gemv", isa, str(qt), str(args.n), str(args.k)]  # noqa: E731
                scalar = per_element(qemu, runner, plugin, kargs("scalar"), args.n)
                rvv = per_element(qemu, runner, plugin, kargs("rvv"), args.n)
                print(f"{name:>6} {vlen:>5} | {scalar:>10.0f} {rvv:>10.0f} | {scalar / rvv:>10.2f}")
        runner = ppc_runner
        print(f"\nVSX fp16 GEMV (fp16 x, w, y; fp32 sums), n={args.n} k={args.k}, qemu-ppc64le -cpu power9")
        print(f"{'scalar':>10} {'vsx':>10} | {'scalar/vsx':>10}")
        kargs = lambda isa: ["fp16_gemv", isa, "0", str(args.n), str(args.k)]  # noqa: E731
        scalar = per_element(PPC_QEMU, runner, plugin, kargs("scalar"), args.n)
        vsx = per_element(PPC_QEMU, runner, plugin, kargs("vsx"), args.n)
        print(f"{scalar:>10.0f} {vsx:>10.0f} | {scalar / vsx:>10.2f}")


if __name__ == "__main__":
    main()
