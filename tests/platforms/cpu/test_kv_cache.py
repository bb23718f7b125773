"""The cpu platform's KV cache (platforms/cpu/kv_cache.py): uninitialized tensors whose pages a low-priority thread
has the kernel back a lead ahead of the engine's highest block, without changing what they hold; a kernel that
refuses is logged, not fatal; freed caches stop their thread; the engine reports its progress."""

from __future__ import annotations

import ctypes
import gc
import logging
import mmap
import sys
import threading
import time

import pytest
import torch

from engine.platforms.cpu import kv_cache
from engine.platforms.cpu.platform import CpuPlatform

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
PAGE = 4096
LEAD = kv_cache._LEAD_BYTES


def resident_pages(t: torch.Tensor) -> list[bool]:
    """Whether each whole page of t's memory is backed, from mincore(2)."""
    start = -(-t.data_ptr() // PAGE) * PAGE
    end = (t.data_ptr() + t.numel() * t.element_size()) // PAGE * PAGE
    vec = (ctypes.c_ubyte * ((end - start) // PAGE))()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(start, end - start, vec) == 0, ctypes.get_errno()
    return [bool(v & 1) for v in vec]


def backed_prefix(t: torch.Tensor) -> int:
    """Bytes of t, from its start, that are backed (its first page starts page-aligned in these tests)."""
    pages = resident_pages(t)
    return next((i for i, r in enumerate(pages) if not r), len(pages)) * PAGE


def kernel_populates() -> bool:
    m = mmap.mmap(-1, 4 * PAGE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    ok = libc.madvise(addr, 4 * PAGE, kv_cache._MADV_POPULATE_WRITE) == 0
    del addr
    return ok


needs_populate = pytest.mark.skipif(not kernel_populates(), reason="this kernel lacks MADV_POPULATE_WRITE (< 5.14)")
_MAPS: list = []


def fresh(mb: int) -> torch.Tensor:
    """mb MB of fp32 on a fresh anonymous mapping: no page backed yet (malloc may hand out reused memory)."""
    m = mmap.mmap(-1, mb << 20)
    m.madvise(mmap.MADV_NOHUGEPAGE)  # 4 KB pages even where transparent huge pages are "always"
    _MAPS.append(m)
    t = torch.frombuffer(m, dtype=torch.float32)
    assert not any(resident_pages(t))
    return t


def wait_for(cond, what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.005)


def populate_threads() -> int:
    return sum(th.name == "engine-kv-populate" and th.is_alive() for th in threading.enumerate())


@needs_populate
def test_pages_are_backed_a_lead_ahead_and_keep_their_contents():
    tensors = [fresh(3), fresh(2)]
    marks = [torch.randn(1000) for _ in tensors]
    for t, m in zip(tensors, marks, strict=True):  # written before the thread runs, as the engine may
        t[2000:3000] = m
        t[-1000:] = m
    p = kv_cache._Populator(tensors, block_bytes=PAGE)
    wait_for(lambda: all(backed_prefix(t) >= LEAD for t in tensors), "the lead")
    time.sleep(0.05)
    assert all(backed_prefix(t) < (2 << 20) for t in tensors)  # the lead only, not the whole tensor
    assert p.thread.is_alive()  # waiting for more
    p.reach(1 << 30)  # past the end: each tensor as far as it goes
    wait_for(lambda: all(all(resident_pages(t)) for t in tensors), "every page")
    for t, m in zip(tensors, marks, strict=True):
        assert torch.equal(t[2000:3000], m) and torch.equal(t[-1000:], m)
    wait_for(lambda: not p.thread.is_alive(), "the thread to end once all is backed")


@needs_populate
def test_empty_kv_caches_follow_the_blocks_reached():
    shape, count = (6000, 16, 3, 64), 2  # 36.9 MB a tensor, 12 KB a block
    caches = CpuPlatform().empty_kv_caches(count, shape, torch.bfloat16, torch.device("cpu"))
    assert len(caches) == count
    tensors = [t for pair in caches for t in pair]
    assert all(t.shape == shape and t.dtype == torch.bfloat16 and t.is_contiguous() for t in tensors)
    assert len({t.data_ptr() for t in tensors}) == 2 * count
    block = 16 * 3 * 64 * 2
    assert caches.populator.block_bytes == block
    CpuPlatform().kv_blocks_reached(caches, 500)
    want = 500 * block + LEAD - PAGE  # from the tensor's first whole page
    wait_for(lambda: all(backed_prefix(t) >= want for t in tensors), "blocks reached + the lead")


def test_a_refusing_kernel_is_logged_and_the_cache_still_works(monkeypatch, caplog):
    monkeypatch.setattr(kv_cache, "_MADV_POPULATE_WRITE", 0x7fff)  # an advice no kernel knows: EINVAL
    t = fresh(2)
    with caplog.at_level(logging.INFO, logger=kv_cache.__name__):
        kv_cache._Populator([t], block_bytes=PAGE)
        wait_for(lambda: "backed on first write instead" in caplog.text, "the log line")
    assert "Invalid argument" in caplog.text
    t.fill_(1.5)
    assert float(t.sum()) == 1.5 * t.numel()


def test_freed_caches_stop_their_thread():
    caches = kv_cache.empty_kv_caches(2, (20000, 16, 3, 64), torch.float32)  # 246 MB a tensor: never all backed
    thread = caches.populator.thread
    time.sleep(0.05)
    assert thread.is_alive()
    del caches
    gc.collect()
    wait_for(lambda: not thread.is_alive(), "the thread to stop")


def test_zero_sized_caches_start_no_thread():
    before = populate_threads()
    caches = kv_cache.empty_kv_caches(2, (0, 16, 3, 64), torch.float32)
    assert [p[0].shape for p in caches] == [(0, 16, 3, 64)] * 2
    assert caches.populator is None and populate_threads() <= before
    kv_cache.blocks_reached(caches, 10)  # nothing to do, no error
    kv_cache.blocks_reached([(torch.empty(1),) * 2], 10)  # caches another platform made: ignored
