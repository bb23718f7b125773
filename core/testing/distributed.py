"""The all_reduce check across two processes: every registered all_reduce (and the reference) sums two ranks'
tensors, each rank on its own device, through the platform's distributed backend."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.core.ops.registry import OPS

from .conformance import ConformanceFailure, compare

WORLD = 2


def _inputs(op, case, dtype, device, seed: int, rank: int):
    gen = torch.Generator().manual_seed(seed * 31 + rank)
    return op.make_inputs(dict(case.params), dtype, device, gen)


def _rank_main(rank: int, platform_name: str, seed: int, init_file: str, errors) -> None:
    from engine.core import plugins

    try:
        platform = plugins.select(plugins.discover(), platform_name).platform_cls()
        device = platform.device(rank) if platform.device_type != "cpu" else platform.device()
        platform.set_current_device(device)
        dist.init_process_group(platform.dist_backend, init_method=f"file://{init_file}", rank=rank,
                                world_size=WORLD)
        registry = plugins.build_registry(platform)
        plugins.set_active_registry(registry)
        op = OPS["all_reduce"]
        for impl in [*registry.implementations(op), op.reference_impl]:
            taken = 0
            for case in op.cases:
                for dtype in case.dtypes or op.dtypes:
                    if dtype not in platform.supported_dtypes():
                        continue
                    (x,) = _inputs(op, case, dtype, device, seed, rank)
                    if impl.verdict((x,)) is not None:
                        continue
                    want = sum(_inputs(op, case, dtype, "cpu", seed, r)[0].double() for r in range(WORLD))
                    got = impl.fn(x)
                    if got is x:
                        raise ConformanceFailure(f"{impl.qualname}: all_reduce must return a new tensor, not x")
                    compare(op, dtype, [got.cpu()], [want.to(dtype)], f"all_reduce-{impl.qualname}-{case.name}-"
                            f"{dtype} rank {rank} (seed {seed})")
                    taken += 1
            if not taken:  # a registration that never runs, even where it can (several ranks)
                raise ConformanceFailure(f"{impl.qualname}: registered for all_reduce but declines every case across "
                                         f"{WORLD} ranks")
        dist.barrier()
    except BaseException as exc:  # reported to the parent, which fails the test with it
        errors.put(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def check_all_reduce_two_ranks(platform_name: str, seed: int) -> None:
    """Spawn two ranks of ``platform_name``; raise ConformanceFailure with the ranks' errors if any failed."""
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank_main, args=(r, platform_name, seed, init_file, errors))
                 for r in range(WORLD)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
            if p.is_alive():
                p.kill()
                raise ConformanceFailure("all_reduce across two processes did not finish in 300 s")
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    if msgs or any(p.exitcode != 0 for p in procs):
        raise ConformanceFailure("all_reduce across two processes failed: " + "; ".join(msgs or [
            f"exit codes {[p.exitcode for p in procs]}"]))
