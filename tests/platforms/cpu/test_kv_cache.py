"""The cpu platform's KV cache (platforms/cpu/kv_cache.py): uninitialized tensors whose pages a low-priority thread
has the kernel back ahead of use, without changing what they hold; a kernel that refuses is logged, not fatal."""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
import threading

import pytest
import torch

from engine.platforms.cpu import kv_cache
from engine.platforms.cpu.platform import CpuPlatform

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
PAGE = 4096


def resident_pages(t: torch.Tensor) -> tuple[int, int]:
    """(resident, total) whole pages of t's memory, from mincore(2)."""
    start = -(-t.data_ptr() // PAGE) * PAGE
    end = (t.data_ptr() + t.numel() * t.element_size()) // PAGE * PAGE
    pages = (end - start) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(start, end - start, vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec), pages


def kernel_populates() -> bool:
    t = torch.empty(8 * PAGE, dtype=torch.uint8)
    libc = ctypes.CDLL(None)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start = -(-t.data_ptr() // PAGE) * PAGE
    return libc.madvise(start, 4 * PAGE, kv_cache._MADV_POPULATE_WRITE) == 0


_MAPS: list = []


def fresh(mb: int) -> torch.Tensor:
    """mb MB of fp32 on a fresh anonymous mapping: no page backed yet (malloc may hand out reused memory)."""
    m = mmap.mmap(-1, mb << 20)
    _MAPS.append(m)
    t = torch.frombuffer(m, dtype=torch.float32)
    assert resident_pages(t)[0] == 0
    return t


@pytest.mark.skipif(not kernel_populates(), reason="this kernel lacks MADV_POPULATE_WRITE (Linux < 5.14)")
def test_populate_backs_every_page_and_keeps_the_contents():
    tensors = [fresh(9), fresh(5)]
    marks = [torch.randn(1000) for _ in tensors]
    for t, m in zip(tensors, marks, strict=True):  # written before the thread runs, as the engine may
        t[12345:13345] = m
    kv_cache._populate(tensors)
    for t, m in zip(tensors, marks, strict=True):
        resident, pages = resident_pages(t)
        assert resident == pages
        assert torch.equal(t[12345:13345], m)


@pytest.mark.skipif(not kernel_populates(), reason="this kernel lacks MADV_POPULATE_WRITE (Linux < 5.14)")
def test_empty_kv_caches_shapes_and_background_thread():
    shape, count = (7000, 16, 3, 64), 2  # 43 MB a tensor: past malloc's reuse, fresh pages
    caches = CpuPlatform().empty_kv_caches(count, shape, torch.bfloat16, torch.device("cpu"))
    assert len(caches) == count
    assert all(t.shape == shape and t.dtype == torch.bfloat16 and t.is_contiguous() for pair in caches for t in pair)
    assert len({t.data_ptr() for pair in caches for t in pair}) == 2 * count
    for th in threading.enumerate():
        if th.name == "engine-kv-populate":
            th.join(timeout=30)
    for pair in caches:
        for t in pair:
            resident, pages = resident_pages(t)
            assert resident == pages


def test_a_refusing_kernel_is_logged_and_the_cache_still_works(monkeypatch, caplog):
    monkeypatch.setattr(kv_cache, "_MADV_POPULATE_WRITE", 0x7fff)  # an advice no kernel knows: EINVAL
    t = fresh(2)
    with caplog.at_level(logging.INFO, logger=kv_cache.__name__):
        kv_cache._populate([t])
    assert "backed on first write instead" in caplog.text and "Invalid argument" in caplog.text
    t.fill_(1.5)
    assert float(t.sum()) == 1.5 * t.numel()


def test_zero_sized_caches_start_no_thread():
    before = sum(th.name == "engine-kv-populate" for th in threading.enumerate())
    caches = kv_cache.empty_kv_caches(2, (0, 16, 3, 64), torch.float32)
    assert [p[0].shape for p in caches] == [(0, 16, 3, 64)] * 2
    assert sum(th.name == "engine-kv-populate" for th in threading.enumerate()) == before
