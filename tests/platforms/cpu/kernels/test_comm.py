"""The shared-memory collectives between two real processes: sums, gathers and broadcasts in every dtype they move,
a second process group, a clean teardown, and a rank that dies."""

from __future__ import annotations

import datetime
import gc
import os
import random
import tempfile
import time
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.platforms.cpu.kernels import comm as shm
from tests.core.serving.live_server import free_port

WORLD = 2


def _one_group(rank: int, port: int, seed: int) -> weakref.ref:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    group = weakref.ref(dist.distributed_c10d._get_default_group())
    for step in range(3):
        xs = [torch.randn(2, 300, generator=torch.Generator().manual_seed(seed + 10 * step + r)) for r in range(WORLD)]
        assert shm._supports_sum(xs[rank]) is True
        got = shm.shm_all_reduce(xs[rank])
        torch.testing.assert_close(got, xs[0] + xs[1], atol=1e-6, rtol=1e-6)
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32):
            for shape in ((1, 24576), (3, 5, 7), (0,)):
                g = torch.Generator().manual_seed(seed + step)
                ys = [(torch.randn(shape, generator=g) * 1e3).to(dtype) for _ in range(WORLD)]
                assert shm._shared_group(ys[rank]) is True
                assert torch.equal(shm.shm_all_gather(ys[rank]), torch.stack(ys))
                for src in range(WORLD):
                    assert shm._supports_broadcast(ys[rank], src) is True
                    got = shm.shm_broadcast(ys[rank], src)
                    assert torch.equal(got, ys[src]) and (got.numel() == 0 or got.data_ptr() != ys[rank].data_ptr())
    dist.destroy_process_group()
    return group


def _worker(rank: int, ports: list[int], seed: int) -> None:
    for port in ports:  # a second group after the first is destroyed gets its own segment and host check
        group = _one_group(rank, port, seed)
        gc.collect()
        # the engine's state must not keep a destroyed group alive: one left for interpreter exit makes gloo abort
        # the process ("terminate called without an active exception") in about one run of six
        assert group() is None, "the shm all_reduce state holds the destroyed process group"


def test_two_groups_one_after_another_and_no_group_outlives_destroy():
    seed = random.randrange(2**20)
    print(f"seed={seed}")
    mp.spawn(_worker, args=([free_port(), free_port()], seed), nprocs=WORLD, join=True)


def _dies(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    shm.shm_broadcast(torch.arange(4), 0)  # the segment is set up
    if rank == 1:
        os._exit(0)  # gone without a word, as a killed worker is
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 \(pid \d+\) has exited: shared-memory collective"):
        shm.shm_broadcast(torch.arange(4), 0)
    assert time.monotonic() - start < 30, "a dead rank must be noticed, not waited for until the timeout"
    os._exit(0)  # the group cannot be torn down with its peer gone


def test_a_rank_that_dies_is_named_not_waited_for():
    mp.spawn(_dies, args=(free_port(),), nprocs=WORLD, join=True)


def test_segment_goes_to_the_temp_dir_when_dev_shm_cannot_hold_it():
    assert shm._segment_dir(1 << 60) != "/dev/shm"
    small = shm._segment_dir(1 << 20)
    assert small in ("/dev/shm", tempfile.gettempdir())
