"""CpuPlatform: the host CPU."""

from __future__ import annotations

import os

import torch

from engine.core.platform import Platform

from . import cpu_model_name, probe, read_cpuinfo


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    priority = 10
    description = "host CPU; native C++ kernels with runtime ISA dispatch"
    dist_backend = "gloo"

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        return probe()

    def device_name(self, index: int = 0) -> str:
        return cpu_model_name(read_cpuinfo())

    def memory_info(self, index: int = 0) -> tuple[int, int]:
        """(available, total) bytes from /proc/meminfo, falling back to sysconf."""
        fields = {}
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    fields[key] = int(rest.split()[0]) * 1024
        except OSError:
            pass
        if "MemTotal" in fields:
            return fields.get("MemAvailable", fields.get("MemFree", 0)), fields["MemTotal"]
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, total

    def supported_dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.float32, torch.bfloat16)

    def register_kernels(self, registry) -> None:
        from .kernels import register

        register(registry)
