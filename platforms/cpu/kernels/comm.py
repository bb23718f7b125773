"""``all_reduce`` between the processes of one machine through shared memory (csrc/shm_all_reduce.cpp).

The ranks of a gloo process group on one host (tensor parallelism on a CPU) sum their tensors in a shared segment
instead of over loopback TCP: gloo took 1.7 ms for a [1, 576] fp32 all-reduce on a 2-core VM, 61 of them a decode
step of the built-in model. The segment is made on the first call in a process group, by that call (every rank
makes the same calls in the same order, so the set-up is collective too): rank 0 creates a file in /dev/shm (else
the temp directory), the group's broadcast tells the others its name, each maps it, and rank 0 removes the name
once all have (the mapping lives on, and nothing is left behind if a process dies). Calls are numbered per group;
the native call waits for every rank's tensor, then each rank sums the slots in rank order (the same bits on every
rank). all_gather and broadcast use the same segment and call numbers: each rank copies its tensor into its slot
(a broadcast's receivers copy nothing), waits for every rank, and copies out the slots it needs. Tensors over
SLOT_BYTES, sums in other dtypes, or a group on several hosts go to gloo (the reference).
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
import weakref

import torch
import torch.distributed as dist

from engine.core.ops.comm import all_gather, all_reduce, broadcast
from engine.platforms.cpu import _native

from ._common import PRIORITY, STORAGE_CODE

SLOT_BYTES = 16 << 20  # per rank and bank: a 1,024-token prefill chunk of a 4,096-wide model in fp32
LINE = 64
TIMEOUT_S = 300.0  # a rank that does not arrive: an error, not a hang

# "group" -> a weak reference to the process group the segment belongs to (a strong one would keep the group
# alive past destroy_process_group, to be torn down at interpreter exit, where gloo aborts the process);
# "seg", "base", "rank", "world", "gen"
_state: dict = {}


def _one_host() -> bool:
    """Whether every rank of the default group runs on this host (asked once per group, collectively)."""
    names = [None] * dist.get_world_size()
    dist.all_gather_object(names, socket.gethostname())
    return len(set(names)) == 1


def _segment_dir(size: int) -> str:
    """/dev/shm when it can hold the segment, else the temp directory.

    A tmpfs too small for the segment (Docker's default /dev/shm is 64 MiB) would not fail at creation but kill the
    process with SIGBUS at the first write past its end, so the free space is checked up front.
    """
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize >= size:
            return shm
    return tempfile.gettempdir()


def _setup(group) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    size = world * LINE + 2 * world * SLOT_BYTES
    box = [None]
    if rank == 0:
        path = os.path.join(_segment_dir(size), f"engine-allreduce-{uuid.uuid4().hex}")
        seg = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        seg[:world * LINE].zero_()
        box = [path]
    dist.broadcast_object_list(box, src=0)
    if rank != 0:
        seg = torch.from_file(box[0], shared=True, size=size, dtype=torch.uint8)
    seg[rank * LINE + 8:rank * LINE + 16].view(torch.int64)[0] = os.getpid()  # the native wait checks it is alive
    dist.barrier()
    if rank == 0:
        os.unlink(box[0])
    _state.clear()
    _state.update(group=weakref.ref(group), seg=seg, base=seg.data_ptr(), rank=rank, world=world, gen=0)


def _group():
    return dist.distributed_c10d._get_default_group()


def _next_gen() -> int:
    """This call's number in the group's one sequence of shared-memory collectives (setting the segment up first)."""
    group = _group()
    if "group" not in _state or _state["group"]() is not group:
        _setup(group)
    _state["gen"] += 1
    return _state["gen"]


def _bank(gen: int) -> torch.Tensor:
    """The slots of call gen's bank as bytes, [world, SLOT_BYTES] (valid until this rank's next call)."""
    world = _state["world"]
    start = world * LINE + (gen & 1) * world * SLOT_BYTES
    return _state["seg"][start:start + world * SLOT_BYTES].view(world, SLOT_BYTES)


def _exchange(gen: int, x: torch.Tensor | None) -> None:
    ptr, nbytes = (0, 0) if x is None else (x.data_ptr(), x.numel() * x.element_size())
    _native.shm_exchange(_state["base"], _state["rank"], _state["world"], SLOT_BYTES, gen, ptr, nbytes, TIMEOUT_S)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def shm_all_reduce(x: torch.Tensor) -> torch.Tensor:
    gen = _next_gen()
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _native.shm_all_reduce(_state["base"], _state["rank"], _state["world"], SLOT_BYTES, gen,
                           x.contiguous().data_ptr(), out.data_ptr(), x.numel(), STORAGE_CODE[x.dtype], TIMEOUT_S)
    return out


def shm_all_gather(x: torch.Tensor) -> torch.Tensor:
    gen = _next_gen()
    x = x.contiguous()
    _exchange(gen, x)
    out = torch.empty((_state["world"], *x.shape), dtype=x.dtype)
    nbytes = x.numel() * x.element_size()
    _as_bytes(out).view(_state["world"], nbytes).copy_(_bank(gen)[:, :nbytes])
    return out


def shm_broadcast(x: torch.Tensor, src: int) -> torch.Tensor:
    gen = _next_gen()
    x = x.contiguous()
    mine = _state["rank"] == src
    _exchange(gen, x if mine else None)
    if mine:
        return x.clone()
    out = torch.empty_like(x)
    _as_bytes(out).copy_(_bank(gen)[src, :x.numel() * x.element_size()])
    return out


_hosts: dict = {}  # "group" -> a weak reference to the group last asked, "one" -> whether its ranks share this host


def _shared_group(x) -> bool | str:
    """True when the default group's ranks can meet in a shared segment for x (a CPU tensor that fits a slot)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return "no process group of 2+ ranks: nothing to exchange"
    if dist.get_backend() != "gloo":
        return f"the process group's backend is {dist.get_backend()}, not gloo"
    if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
        return "x must be a CPU tensor"
    if x.numel() * x.element_size() > SLOT_BYTES:
        return f"{x.numel() * x.element_size()} bytes: over the shared slot of {SLOT_BYTES} (gloo takes it)"
    group = _group()
    if "group" not in _hosts or _hosts["group"]() is not group:
        _hosts.update(group=weakref.ref(group), one=_one_host())
    return True if _hosts["one"] else "the ranks run on several hosts"


def _supports_sum(x):
    if isinstance(x, torch.Tensor) and x.dtype not in STORAGE_CODE:
        return f"sums fp32, bf16 or fp16, not {x.dtype}"
    return _shared_group(x)


def _supports_broadcast(x, src):
    if not isinstance(src, int) or not 0 <= src < (dist.get_world_size() if dist.is_initialized() else 1):
        return f"src {src!r} is not a rank of the group"
    return _shared_group(x)


def register(registry) -> None:
    note = f"through a shared-memory segment between the ranks on this host (up to {SLOT_BYTES >> 20} MiB; gloo beyond)"
    registry.register(all_reduce, shm_all_reduce, name="native_shm", supports=_supports_sum, priority=PRIORITY,
                      note=note)
    registry.register(all_gather, shm_all_gather, name="native_shm", supports=_shared_group, priority=PRIORITY,
                      note=note)
    registry.register(broadcast, shm_broadcast, name="native_shm", supports=_supports_broadcast, priority=PRIORITY,
                      note=note)
