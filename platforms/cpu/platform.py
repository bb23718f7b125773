"""CpuPlatform: the host CPU."""

from __future__ import annotations

import os

import torch

from engine.core.platform import Platform

from . import config, cpu_model_name, kv_cache, probe, read_cpuinfo


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    priority = 10
    description = "host CPU; native C++ kernels with runtime ISA dispatch"
    dist_backend = "gloo"
    # Decode steps of up to 32 sequences replay a recorded list of native calls (graph.py): the Python between
    # the ~300 kernels of a step was a quarter to a third of a single-stream step, and still ~10% of a 32-sequence
    # step (4.6 of 44.5 ms on the 2-core Zen 5, 2026-12-01). Larger batches run eagerly: there the kernels
    # dominate, and each bucket keeps ~1.4 MB per sequence of intermediates alive (buckets are captured lazily,
    # on first use: 16, 24 and 32 hold ~100 MB together).
    device_graphs = True
    graph_capture_computes = True
    graph_max_batch = 32
    # `engine tune-spec --batch-sizes 1,2,4 --ks 0,2,4,6` on the built-in model (2-core Zen 5, 2026-12-07,
    # BENCHMARKS.md). fp32 activations: one sequence drafting 6 tokens 2.02x on repetitive text, 1.00x on chat; from
    # two sequences on every k cost chat 3-17% (a verify row is as much FMA work as a decoded one there), so none.
    # Q8 activations (integer dots: rows 2-3x cheaper): 4 drafts at one sequence (2.69x / 0.99x), 6 at two, 4 from
    # four on (1.62x / 0.99x).
    speculative_tables = {"ngram": {1: 6, 2: 0}, "ngram+q8": {1: 4, 2: 6, 4: 4}}

    def __init__(self):
        # Settings are checked here, when the platform is chosen, so a bad ENGINE_CPU_ISA / ENGINE_NUM_THREADS is
        # an error from LLM(), `engine generate`, `bench` and `doctor` alike, never a quiet fall-back to the
        # plain-torch references.
        for warning in config.check_env():
            config.warn_once(warning)
        why = config.check_native()
        if why is not None:
            config.warn_once(f"{why}; every op runs on its plain-torch reference (slow). Rebuild with "
                             "`pip install -e .` or see `engine doctor`.")

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

    def facts(self) -> dict[str, object]:
        """The base facts plus the native kernels' ISA variant, int8 dot-product kernels and thread count."""
        out = super().facts()
        try:
            from . import _native
        except Exception as exc:  # reported, not fatal: the op references still run
            out["native_kernels"] = f"unavailable: {type(exc).__name__}: {exc}"
            return out
        out["native_isa"] = (f"{_native.isa()} (this CPU and build run: {', '.join(_native.supported_isas())}; "
                             "ENGINE_CPU_ISA forces one)")
        out["native_int8_dot"] = _native.gguf_q8act_variant()
        out["native_threads"] = f"{_native.num_threads()} (ENGINE_NUM_THREADS sets it)"
        return out

    def use_host_threads(self, n: int) -> int:
        """torch's threads and the native kernels' pool both (returns torch's count before)."""
        before = super().use_host_threads(n)
        if config.check_native() is None:
            from . import _native

            _native.set_num_threads(n)
        return before

    def empty_kv_caches(self, count, shape, dtype, device):
        return kv_cache.empty_kv_caches(count, shape, dtype)

    def kv_blocks_reached(self, caches, blocks):
        kv_cache.blocks_reached(caches, blocks)

    def capture_graph(self, fn, pool=None):
        """Record ``fn()``'s native kernel calls (and the torch work between them) to replay (graph.py). ``fn``
        runs for real; no memory pool (the recorded intermediates are kept alive by the replay)."""
        from .graph import capture

        replay, out = capture(fn)
        return replay, out, None

    def register_kernels(self, registry) -> None:
        from .kernels import register

        register(registry, fp16_max_m=self.fp16_linear_max_m)
        # Ops the CPU serves through their plain-torch references on purpose (the conformance kit checks them so):
        for op in ("fp8_linear", "fp8_quantize_per_token", "fused_moe_fp8"):
            registry.reference_only(op, "no native FP8 kernel: CPUs have no FP8 arithmetic, and no model the CPU "
                                        "path loads is FP8 (issue 27 brings FP8 checkpoints)")
        for op in ("nvfp4_quantize", "nvfp4_linear", "nvfp4_linear_w4a4", "fused_moe_nvfp4"):
            registry.reference_only(op, "no native NVFP4 kernel: NVFP4 checkpoints target Blackwell GPUs")
        registry.reference_only("int4_linear", "GPTQ / AWQ 4-bit weights become GGUF Q4_0 / Q4_1 blocks at load here "
                                               "(models.weights.native_int4), which the native gguf_linear runs")
        registry.reference_only("int8_linear", "GPTQ / compressed-tensors 8-bit weights become GGUF Q8_0 blocks at "
                                               "load here (models.weights.native_int4), which the native gguf_linear "
                                               "runs")

    def fp16_linear_max_m(self, isa: str, cpuinfo: str) -> int | None:
        """Up to how many rows fp16 dense linears run the native kernel (0: never, None: every M); measured per
        kind of CPU (kernels/linear.py)."""
        from .kernels.linear import cpu_fp16_max_m

        return cpu_fp16_max_m(isa, cpuinfo)
