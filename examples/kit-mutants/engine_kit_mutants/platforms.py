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


def _single(name: str, op: str, fn, kernel: str, doc: str) -> type:
    """A mutant platform that registers one wrong kernel ``fn`` for ``op``."""
    def register_kernels(self, registry):
        registry.register(op, fn, name=kernel)
    return type(name, (_Mutant,), {"name": name, "register_kernels": register_kernels, "__doc__": doc})


EpsTimesTen = _single("mutant_eps_x10", "rms_norm", kernels.rms_eps_x10, "eps_x10", "rms_norm with eps x 10")
EpsDropped = _single("mutant_eps_dropped", "rms_norm", kernels.rms_eps_dropped, "eps_dropped", "rms_norm without eps")
First8Rows = _single("mutant_first_8_rows", "rms_norm", kernels.rms_first_8_rows, "first_8_rows",
                     "rms_norm right only for the first 8 rows")
LowPrecisionSum = _single("mutant_low_precision_sum", "rms_norm", kernels.rms_low_precision_sum, "low_precision_sum",
                          "rms_norm summing squares in bf16/fp16")
StaleResult = _single("mutant_stale_result", "rms_norm", kernels.rms_stale_result, "stale_result",
                      "rms_norm returning a result remembered per shape")
DecodeFirst128Keys = _single("mutant_decode_first_128_keys", "paged_attention_decode", kernels.decode_first_128_keys,
                             "first_128_keys", "decode attention ignoring keys past 128")
MoeFp8DownScale = _single("mutant_moe_fp8_down_scale", "fused_moe_fp8", kernels.moe_fp8_down_scale,
                          "down_scale_x1.1", "FP8 MoE with the down projection's scale 10% high")


# platform class -> (the op the kit is run on, a regular expression its first failure must match)
# A wrong value, caught by whichever check meets it first: a row over the derived bound, the whole output over its
# bound, bf16/fp16 roundings that differ from the correctly rounded reference, or a NaN where the result is finite.
WRONG_VALUES = "exceed the bound|as a whole|correctly rounded|non-finite"

MUTANTS = {
    NoKernels: (None, "no kernel for"),
    NeverRuns: ("rms_norm", "declines every one"),
    EmptyDtypes: ("rms_norm", "dtypes=()"),
    SmallestCaseOnly: ("rms_norm", "taken by none of the platform's kernels"),
    EpsTimesTen: ("rms_norm", WRONG_VALUES),
    EpsDropped: ("rms_norm", WRONG_VALUES),
    First8Rows: ("rms_norm", WRONG_VALUES),
    LowPrecisionSum: ("rms_norm", WRONG_VALUES),
    StaleResult: ("rms_norm", WRONG_VALUES),
    DecodeFirst128Keys: ("paged_attention_decode", WRONG_VALUES),
    MoeFp8DownScale: ("fused_moe_fp8", WRONG_VALUES),
}
