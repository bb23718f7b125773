"""The mutant platforms (see the package docstring). Each computes on the host CPU."""

from __future__ import annotations

import torch

from engine.core.platform import Platform

from . import kernels


class _Mutant(Platform):
    device_type = "cpu"
    priority = 1  # never selected unless forced

    @classmethod
    def probe(cls):
        return True, "a deliberately wrong plugin for testing the conformance kit (emulated on the host CPU)"

    def supported_dtypes(self):
        return (torch.float32, torch.bfloat16, torch.float16)


class NoKernels(_Mutant):
    """Registers nothing while claiming three dtypes: every op would be compared with its own reference."""

    name = "mutant_no_kernels"

    def register_kernels(self, registry):
        pass


class NeverRuns(_Mutant):
    """An rms_norm whose supports() declines everything."""

    name = "mutant_never_runs"

    def register_kernels(self, registry):
        registry.register("rms_norm", kernels.rms_reference, name="never", supports=lambda x, w, eps: False)


class EmptyDtypes(_Mutant):
    """An rms_norm registered for no dtype at all."""

    name = "mutant_empty_dtypes"

    def register_kernels(self, registry):
        registry.register("rms_norm", kernels.rms_reference, name="no_dtypes", supports=lambda x, w, eps: False,
                          dtypes=())


class SmallestCaseOnly(_Mutant):
    """A right rms_norm that accepts only the kit's smallest case (3 x 64), so it is never called by a real model."""

    name = "mutant_smallest_case_only"

    def register_kernels(self, registry):
        registry.register("rms_norm", kernels.rms_reference, name="tiny_only",
                          supports=lambda x, w, eps: x.numel() <= 3 * 64 or "only 3 x 64")


def _one(op, fn, kernel_name):
    def register_kernels(self, registry):
        registry.register(op, fn, name=kernel_name)
    return register_kernels


class EpsTimesTen(_Mutant):
    name = "mutant_eps_x10"
    register_kernels = _one("rms_norm", kernels.rms_eps_x10, "eps_x10")


class EpsDropped(_Mutant):
    name = "mutant_eps_dropped"
    register_kernels = _one("rms_norm", kernels.rms_eps_dropped, "eps_dropped")


class First8Rows(_Mutant):
    name = "mutant_first_8_rows"
    register_kernels = _one("rms_norm", kernels.rms_first_8_rows, "first_8_rows")


class LowPrecisionSum(_Mutant):
    name = "mutant_low_precision_sum"
    register_kernels = _one("rms_norm", kernels.rms_low_precision_sum, "low_precision_sum")


class StaleResult(_Mutant):
    name = "mutant_stale_result"
    register_kernels = _one("rms_norm", kernels.rms_stale_result, "stale_result")


class DecodeFirst128Keys(_Mutant):
    name = "mutant_decode_first_128_keys"
    register_kernels = _one("paged_attention_decode", kernels.decode_first_128_keys, "first_128_keys")


class MoeFp8DownScale(_Mutant):
    name = "mutant_moe_fp8_down_scale"
    register_kernels = _one("fused_moe_fp8", kernels.moe_fp8_down_scale, "down_scale_x1.1")


# platform class -> (the op the kit is run on, a regular expression its first failure must match)
MUTANTS = {
    NoKernels: (None, "no kernel for"),
    NeverRuns: ("rms_norm", "declines every one"),
    EmptyDtypes: ("rms_norm", "dtypes=()"),
    SmallestCaseOnly: ("rms_norm", "taken by none of the platform's kernels"),
    EpsTimesTen: ("rms_norm", "exceed the bound"),
    EpsDropped: ("rms_norm", "non-finite|exceed the bound"),  # NaN on a zero row, or off on a tiny one
    First8Rows: ("rms_norm", "exceed the bound"),
    LowPrecisionSum: ("rms_norm", ""),
    StaleResult: ("rms_norm", ""),
    DecodeFirst128Keys: ("paged_attention_decode", "exceed the bound"),
    MoeFp8DownScale: ("fused_moe_fp8", ""),
}
