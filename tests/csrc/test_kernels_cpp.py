"""The C++ kernel tests (tests/csrc) built and run by ctest: for the host, and cross-compiled for
AArch64, POWER9 and RISC-V (RVV) under qemu-user, with the toolchain files in cmake/.

The cross toolchains come from Debian packages (see .ci/run); CI installs them, so there a missing
toolchain is a failure, while a developer machine without them skips those variants."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.needs import require
from tests.plugin_helpers import REPO

TARGETS = {
    "host": (None, "c++"),
    "aarch64": ("cmake/toolchain-aarch64.cmake", "aarch64-linux-gnu-g++"),
    "ppc64le": ("cmake/toolchain-ppc64le.cmake", "powerpc64le-linux-gnu-g++"),
    "riscv64": ("cmake/toolchain-riscv64.cmake", "clang++-19"),
}
EMULATORS = {"aarch64": "qemu-aarch64", "ppc64le": "qemu-ppc64le", "riscv64": "qemu-riscv64"}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_cpp_kernel_tests_pass(target, tmp_path):
    toolchain, compiler = TARGETS[target]
    missing = [t for t in (compiler, EMULATORS.get(target), "cmake", "ctest") if t and shutil.which(t) is None]
    require(missing, "apt-get install them as .ci/run does")
    build = tmp_path / f"build-{target}"
    configure = ["cmake", "-S", str(REPO / "tests" / "csrc"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"]
    if toolchain:
        configure.append(f"-DCMAKE_TOOLCHAIN_FILE={REPO / toolchain}")
    jobs = str(os.cpu_count() or 2)  # the emulated tests are single-process CPU work: run them side by side
    ctest = ["ctest", "--test-dir", str(build), "--output-on-failure", "--timeout", "300", "-j", jobs]
    for cmd in (configure, ["cmake", "--build", str(build), "-j2"], ctest):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert "100% tests passed" in proc.stdout
