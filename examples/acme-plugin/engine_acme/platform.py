"""AcmePlatform: an example out-of-tree platform plugin."""

from __future__ import annotations

import os

import torch

from engine.platforms.cpu.platform import CpuPlatform

from .kernels import acme_rms_norm, acme_rms_norm_supports


class AcmePlatform(CpuPlatform):
    name = "acme"
    # Below cpu (10) so it is only used when forced (ENGINE_PLATFORM=acme), unless ACME_PRIORITY raises it;
    # a real accelerator plugin would pick a priority above cpu and probe for its hardware.
    priority = int(os.environ.get("ACME_PRIORITY", "5"))
    description = "example vendor plugin (computes on the host CPU)"

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        # A real plugin checks for its device and driver here, cheaply (no heavy imports).
        if os.environ.get("ACME_DISABLE"):
            return False, "ACME_DISABLE is set"
        return True, "example device emulated on the host CPU"

    def supported_dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.float32, torch.bfloat16)

    def register_kernels(self, registry) -> None:
        super().register_kernels(registry)  # everything the cpu platform brings
        registry.register("rms_norm", acme_rms_norm, name="acme_rms_norm", supports=acme_rms_norm_supports,
                          priority=100, note="example override")
