"""all_reduce, all_gather, broadcast: two real gloo processes on this machine (the references and whatever the
platform dispatches to), and the single-process copy."""

from __future__ import annotations

import datetime
import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.core.ops import comm
from tests.core.serving.live_server import free_port

DTYPES = [torch.float32, torch.bfloat16]
WORLD = 2
SHAPES = [(1, 576), (3, 5, 7), (4097,)]


def _rank_tensor(seed: int, rank: int, shape, dtype) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed * 1000 + rank)).to(dtype)


def _worker(rank: int, port: int, seed: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    try:
        assert comm.world_size() == WORLD
        for dtype in DTYPES:
            for shape in SHAPES:
                x = _rank_tensor(seed, rank, shape, dtype)
                before = x.clone()
                # every rank recomputes the others' tensors and sums them in float64, then rounds once
                want = sum(_rank_tensor(seed, r, shape, dtype).double() for r in range(WORLD)).to(dtype)
                for fn in (comm.all_reduce.reference, torch.ops.engine.all_reduce, comm.all_reduce):
                    got = fn(x)
                    assert got.dtype == dtype and got.shape == x.shape and got.data_ptr() != x.data_ptr()
                    assert torch.equal(x, before), "all_reduce must not modify its input"
                    rtol = 1e-6 if dtype == torch.float32 else 2**-8
                    torch.testing.assert_close(got, want, atol=1e-6, rtol=rtol)
                everyone = torch.stack([_rank_tensor(seed, r, shape, dtype) for r in range(WORLD)])
                for fn in (comm.all_gather.reference, torch.ops.engine.all_gather, comm.all_gather):
                    assert torch.equal(fn(x), everyone)
                for src in range(WORLD):
                    for fn in (comm.broadcast.reference, torch.ops.engine.broadcast, comm.broadcast):
                        got = fn(x, src)
                        assert torch.equal(got, everyone[src]) and got.data_ptr() != x.data_ptr()
                        assert torch.equal(x, before), "broadcast must not modify its input"
    finally:
        dist.destroy_process_group()



def test_two_process_gloo_sum():
    seed = random.randrange(2**20)
    print(f"seed={seed}")
    mp.spawn(_worker, args=(free_port(), seed), nprocs=WORLD, join=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", comm.all_reduce.cases, ids=lambda c: c.name)
def test_single_process_is_a_copy(case, dtype):
    assert not dist.is_initialized() and comm.world_size() == 1
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    (x,) = comm.all_reduce.make_inputs(case.params, dtype, "cpu", gen)
    for fn in (comm.all_reduce.reference, torch.ops.engine.all_reduce, comm.all_reduce):
        got = fn(x)
        assert torch.equal(got, x) and got.dtype == dtype and got.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("dtype", [*DTYPES, torch.int64], ids=str)
@pytest.mark.parametrize("case", comm.all_gather.cases, ids=lambda c: c.name)
def test_single_process_gather_and_broadcast_copy(case, dtype):
    assert not dist.is_initialized() and comm.world_size() == 1
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    (x,) = comm.all_gather.make_inputs(case.params, dtype, "cpu", gen)
    for fn in (comm.all_gather.reference, torch.ops.engine.all_gather, comm.all_gather):
        got = fn(x)
        assert got.shape == (1, *x.shape) and torch.equal(got[0], x) and got.data_ptr() != x.data_ptr()
    for fn in (comm.broadcast.reference, torch.ops.engine.broadcast, comm.broadcast):
        got = fn(x, 0)
        assert torch.equal(got, x) and got.data_ptr() != x.data_ptr()


def test_fake_shape():
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        out = comm.all_reduce.torch_op(mode.from_tensor(torch.empty(3, 5, dtype=torch.bfloat16)))
        assert out.shape == (3, 5) and out.dtype == torch.bfloat16
        out = comm.all_gather.torch_op(mode.from_tensor(torch.empty(3, 5, dtype=torch.bfloat16)))
        assert out.shape == (1, 3, 5)
        assert comm.broadcast.torch_op(mode.from_tensor(torch.empty(4, dtype=torch.int64)), 0).shape == (4,)
