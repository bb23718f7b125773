"""The collectives' check across two processes: for every collective op (all_reduce, all_gather, broadcast), every
registered implementation and the reference give each rank what the op's ``across_ranks`` says, from both ranks'
inputs, each rank on its own device, through the platform's distributed backend."""

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


def _check_op(op, registry, platform, device, seed: int, rank: int) -> None:
    for impl in [*registry.implementations(op), op.reference_impl]:
        taken = 0
        for case in op.cases:
            for dtype in case.dtypes or op.dtypes:
                # integer tensors travel on every platform (a step's token ids); float ones in the platform's dtypes
                if dtype.is_floating_point and dtype not in platform.supported_dtypes():
                    continue
                args = _inputs(op, case, dtype, device, seed, rank)
                if impl.verdict(args) is not None:
                    continue
                want = op.across_ranks([_inputs(op, case, dtype, "cpu", seed, r) for r in range(WORLD)], rank)
                got = impl.fn(*args)
                if got is args[0]:
                    raise ConformanceFailure(f"{impl.qualname}: {op.name} must return a new tensor, not its input")
                compare(op, dtype, [got.cpu()], [want.to(dtype)], f"{op.name}-{impl.qualname}-{case.name}-{dtype} "
                        f"rank {rank} (seed {seed})")
                taken += 1
        if not taken:  # a registration that never runs, even where it can (several ranks)
            raise ConformanceFailure(f"{impl.qualname}: registered for {op.name} but declines every case across "
                                     f"{WORLD} ranks")


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
        for op in [op for op in OPS.values() if op.collective]:
            _check_op(op, registry, platform, device, seed, rank)
        dist.barrier()
    except BaseException as exc:  # reported to the parent, which fails the test with it
        errors.put(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def check_collectives_two_ranks(platform_name: str, seed: int) -> None:
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
                raise ConformanceFailure("the collectives across two processes did not finish in 300 s")
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    if msgs or any(p.exitcode != 0 for p in procs):
        raise ConformanceFailure("the collectives across two processes failed: " + "; ".join(msgs or [
            f"exit codes {[p.exitcode for p in procs]}"]))
