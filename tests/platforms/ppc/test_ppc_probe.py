"""The ppc probe's POWER9 (ISA 3.0) check from AT_HWCAP2, as the native module's isa.cpp does it."""

from __future__ import annotations

import random
import struct

from engine.platforms import ppc


def _auxv(pairs):
    return b"".join(struct.pack("=QQ", k, v) for k, v in pairs) + struct.pack("=QQ", 0, 0)


def test_auxv_hwcap2_found_among_other_entries():
    value = random.getrandbits(32)
    auxv = _auxv([(16, 0xDC0065C2), (6, 65536), (ppc.AT_HWCAP2, value), (25, 0x7FFF0000)])
    assert ppc.auxv_hwcap2(auxv) == value
    assert ppc.auxv_hwcap2(_auxv([(16, 1), (6, 4096)])) is None


def test_hwcap2_decides_over_cpuinfo():
    # POWER9 under qemu -cpu power9 reports ISA 3.0 (0x00800000) among its HWCAP2 bits.
    ok, why = ppc.probe_reason("ppc64le", 9, ppc.PPC_FEATURE2_ARCH_3_00 | 0x10000000)
    assert ok and "ISA 3.0" in why
    ok, why = ppc.probe_reason("ppc64le", 9, 0x10000000)  # cpuinfo says POWER9, the bits say otherwise
    assert not ok and "PPC_FEATURE2_ARCH_3_00" in why and "cpu platform serves it" in why
    ok, why = ppc.probe_reason("ppc64le", None, 0)
    assert not ok and "this POWER CPU" in why


def test_without_hwcap2_the_generation_decides():
    assert ppc.probe_reason("ppc64le", 10, None)[0]
    ok, why = ppc.probe_reason("ppc64le", 8, None)
    assert not ok and "POWER8 is older than POWER9" in why
    assert not ppc.probe_reason("x86_64", None, ppc.PPC_FEATURE2_ARCH_3_00)[0]
