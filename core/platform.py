"""The Platform contract: what a hardware plugin implements.

A plugin is a ``Platform`` subclass published under the entry-point group ``engine.platforms``.
The core never names a device; everything device-specific is answered here.

Contract:

* ``name``, ``device_type`` (a torch device type string) and ``priority`` are class attributes.
* ``probe()`` is a cheap classmethod: it must not import vendor libraries or compile anything.
  It returns ``(available, reason)``; the reason is shown by ``engine doctor`` either way.
* ``register_kernels(registry)`` is the one place heavy imports happen. It registers op
  implementations into the given :class:`~engine.core.ops.registry.KernelRegistry`, and may
  call ``registry.skip(...)`` to record an implementation it could not offer and why.
* A platform may subclass another (riscv and ppc extend cpu) and call ``super().register_kernels``.
"""

from __future__ import annotations

import os
from typing import ClassVar

import torch


class Platform:
    """Base class for platform plugins. Subclasses override the class attributes and ``probe``."""

    name: ClassVar[str] = ""
    device_type: ClassVar[str] = "cpu"
    priority: ClassVar[int] = 0
    description: ClassVar[str] = ""
    # torch.distributed backend used for collectives on this platform.
    dist_backend: ClassVar[str] = "gloo"
    # True: the KV cache is sized from memory_info() and gpu_memory_utilization (a device of its own);
    # False: a fixed default budget (host memory, shared with everything else on the machine).
    memory_sized_kv_cache: ClassVar[bool] = False
    # True: decode steps are captured as device graphs and replayed (capture_graph works here).
    device_graphs: ClassVar[bool] = False
    # True: capture_graph(fn) also does fn's work (its outputs are real), so a batch-size bucket is captured
    # on its first real use instead of at start-up (engine/decode_graphs.py). False: capture only records.
    graph_capture_computes: ClassVar[bool] = False
    # Graphs for decode batches of at most this many sequences (None: up to max_num_seqs); larger batches run
    # eagerly, where the per-kernel host cost is small beside the kernels' own.
    graph_max_batch: ClassVar[int | None] = None
    # True: the engine's default is async scheduling (a step's host work overlaps the previous step's device
    # work; LLMEngine). It pays where kernels run after the host queues them; on the host it only adds work.
    async_scheduling: ClassVar[bool] = False
    # True: LLM runs the shapes of a server's first requests at load by default (LLM.warm_up), because kernels
    # compile on their first use here (Triton's JIT), which would otherwise fall on the first requests.
    warmup_at_load: ClassVar[bool] = False
    # True: ``engine serve`` runs the engine in a process of its own by default (--engine-process auto). Where a
    # device computes the steps, a fast engine's host work and the server's per-chunk work would otherwise take
    # turns on one interpreter lock; on the host the engine's kernels already share the cores with the server.
    serve_engine_process: ClassVar[bool] = False
    # The environment variable naming the devices a process may use (CUDA_VISIBLE_DEVICES, ...): a data-parallel
    # server gives each engine process one device through it. None on a host platform, whose engine processes
    # share out the cores instead.
    device_control_env_var: ClassVar[str | None] = None
    # Measured num_speculative_tokens_per_batch_size tables by speculative method (``engine tune-spec``): what a
    # speculative_config naming a method but no k gets here ("<method>+q8": with Q8 activations, where measured
    # apart). Empty: such a config drafts SpeculativeConfig's default k at every batch size.
    speculative_tables: ClassVar[dict[str, dict[int, int]]] = {}

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        """Is this hardware usable here? Cheap: no vendor imports. Returns (available, reason)."""
        raise NotImplementedError(f"platform {cls.name!r} does not implement probe()")

    # ---- device facts -------------------------------------------------------------------------
    def device(self, index: int = 0) -> torch.device:
        return torch.device(self.device_type, index) if self.device_type != "cpu" else torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def device_name(self, index: int = 0) -> str:
        return self.name

    def memory_info(self, index: int = 0) -> tuple[int, int]:
        """(free, total) bytes of memory usable for weights and KV cache on this device."""
        raise NotImplementedError(f"platform {self.name!r} does not report memory")

    def capability(self, index: int = 0) -> tuple[int, int] | None:
        """Compute capability (major, minor) where the notion exists, else None."""
        return None

    def supported_dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.float32, torch.bfloat16)

    def fp8_dtype(self) -> torch.dtype:
        """The e4m3 flavour the hardware computes in: float8_e4m3fn, or float8_e4m3fnuz on MI300."""
        return torch.float8_e4m3fn

    def synchronize(self, index: int = 0) -> None:
        """Wait for all queued work on the device."""

    def set_current_device(self, device: torch.device) -> None:
        """Make ``device`` this process's current one (what collectives that take no tensor use, such as NCCL's
        object broadcasts). A host platform has only the one: nothing to do."""

    def empty_kv_caches(self, count: int, shape: tuple[int, ...], dtype: torch.dtype,
                        device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``count`` (key, value) pairs of uninitialized KV cache tensors of ``shape`` (one pair per layer). The
        engine never reads a slot it has not written, so no fill is needed; a platform may back the memory
        ahead of use (the cpu platform does, platforms/cpu/kv_cache.py)."""
        return [(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device))
                for _ in range(count)]

    def kv_blocks_reached(self, caches: list[tuple[torch.Tensor, torch.Tensor]], blocks: int) -> None:
        """The engine is about to write KV blocks below ``blocks`` (of caches from ``empty_kv_caches``; it hands
        blocks out lowest first, so this grows with use). A platform may prepare the memory beyond (the cpu
        platform backs its pages ahead); the default does nothing. Called every step: keep it cheap."""

    def capture_graph(self, fn, pool=None):
        """Capture the device work of ``fn()`` once, to replay it later without the host launching each kernel.

        Returns ``(replay, outputs, pool)``: calling ``replay()`` re-runs the captured work on the same buffers,
        ``outputs`` is what ``fn`` returned (overwritten by each replay), and ``pool`` is the memory pool to hand
        the next capture so graphs share memory. Raises NotImplementedError where the device has no graphs."""
        raise NotImplementedError(f"platform {self.name!r} cannot capture device graphs")

    def facts(self) -> dict[str, object]:
        """Device facts for ``engine doctor``; never raises."""
        out: dict[str, object] = {"device_type": self.device_type}
        for key, fn in (("device_count", self.device_count), ("device_name", self.device_name),
                        ("capability", self.capability), ("memory_info", self.memory_info)):
            try:
                out[key] = fn()
            except NotImplementedError:
                continue
            except Exception as exc:  # a fact we cannot read is reported, not fatal
                out[key] = f"error: {type(exc).__name__}: {exc}"
        out["dtypes"] = [str(d).removeprefix("torch.") for d in self.supported_dtypes()]
        out["fp8_dtype"] = str(self.fp8_dtype()).removeprefix("torch.")
        out["dist_backend"] = self.dist_backend
        return out

    def use_host_threads(self, n: int) -> int:
        """Run this process's host-side work on ``n`` threads from now on (a tensor-parallel rank 0 keeps to its share
        of the cores, as the workers do); returns the count before, to restore later. The default sets torch's."""
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        return before

    # ---- kernels ------------------------------------------------------------------------------
    def data_parallel_slice(self, rank: int, size: int) -> tuple[dict[str, str], list[int]]:
        """(environment, CPU cores) of engine process ``rank`` of ``size`` in a data-parallel server: a contiguous
        share of the cores this process may use (its threads pinned there) and, on a platform with
        ``device_control_env_var``, one device. ValueError when there is not one of each per process."""
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
        if len(cores) < size:
            raise ValueError(f"--data-parallel-size {size}: each engine process needs a core of its own, and "
                             f"this process may use {len(cores)}")
        mine = cores[rank * len(cores) // size:(rank + 1) * len(cores) // size]
        env = {"ENGINE_NUM_THREADS": str(len(mine)), "OMP_NUM_THREADS": str(len(mine))}
        var = self.device_control_env_var
        if var:
            visible = [x for x in os.environ.get(var, "").split(",") if x.strip()] or [
                str(i) for i in range(self.device_count())]
            if len(visible) < size:
                raise ValueError(f"--data-parallel-size {size} gives each engine process one {self.name} device; "
                                 f"{len(visible)} visible ({var}={','.join(visible) or 'unset'})")
            env[var] = visible[rank]
        return env, mine

    def register_kernels(self, registry) -> None:
        """Register this platform's op implementations. The default registers none."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class TorchAcceleratorPlatform(Platform):
    """A platform whose device facts come from torch's device module for ``device_type``
    (``torch.get_device_module``); GPU plugins subclass this and add probe and kernels."""

    memory_sized_kv_cache = True
    device_graphs = True
    warmup_at_load = True
    serve_engine_process = True

    def _module(self):
        return torch.get_device_module(self.device_type)

    def device_count(self) -> int:
        return self._module().device_count()

    def device_name(self, index: int = 0) -> str:
        return self._module().get_device_name(index)

    def memory_info(self, index: int = 0) -> tuple[int, int]:
        free, total = self._module().mem_get_info(index)
        return int(free), int(total)

    def synchronize(self, index: int = 0) -> None:
        self._module().synchronize(index)

    def set_current_device(self, device: torch.device) -> None:
        self._module().set_device(device)

    def capture_graph(self, fn, pool=None):
        """Through the device module's graph API (``CUDAGraph`` / ``graph`` / ``graph_pool_handle``, which torch's
        CUDA and HIP builds share); NotImplementedError where the module has none."""
        mod = self._module()
        graph_cls, graph_ctx = getattr(mod, "CUDAGraph", None), getattr(mod, "graph", None)
        if graph_cls is None or graph_ctx is None:
            super().capture_graph(fn, pool)
        pool = mod.graph_pool_handle() if pool is None else pool
        g = graph_cls()
        with graph_ctx(g, pool=pool):
            out = fn()
        return g.replay, out, pool
