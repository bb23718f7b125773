"""The CPU platform's KV cache: host memory that the kernel backs ahead of use, in a background thread.

A fresh ``torch.empty`` tensor is address space only: the first write to each 4 KB page traps into the kernel,
which zeroes a page for it (~2 us a page on the 2-core Zen 5 VM). A decode step of 32 sequences writes ~1.5 MB of
new KV, so its KV writes took 1.1-1.2 ms a step instead of 0.43, 5% of the step (2026-12-01). Zeroing the caches
up front (as llama.cpp clears its KV buffer) would add ~0.2 s per GB to start-up; instead one low-priority thread
asks the kernel to back the pages (Linux ``MADV_POPULATE_WRITE``, which never changes what a page holds, so the
engine may write the cache meanwhile) front to back across the layers, in the order the block manager hands
blocks out."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading

import torch

log = logging.getLogger(__name__)

_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_CHUNK = 4 << 20  # bytes of each tensor per call: the first blocks of every layer are backed first
_PAGE = 4096


def empty_kv_caches(count: int, shape: tuple[int, ...], dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` (key, value) pairs of uninitialized ``shape`` tensors, their pages backed in the background."""
    caches = [(torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)) for _ in range(count)]
    if sys.platform.startswith("linux") and caches and caches[0][0].numel():
        tensors = [t for pair in caches for t in pair]
        threading.Thread(target=_populate, args=(tensors,), name="engine-kv-populate", daemon=True).start()
    return caches


def _populate(tensors: list[torch.Tensor]) -> None:
    """Back the tensors' pages, chunk by chunk across the tensors; stops (logged) where the kernel refuses."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # only what the engine's threads leave idle
    except OSError as exc:
        log.info("KV cache populate thread keeps its priority: %s", exc)
    libc = ctypes.CDLL(None, use_errno=True)
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    spans = []
    for t in tensors:
        start = -(-t.data_ptr() // _PAGE) * _PAGE
        end = (t.data_ptr() + t.numel() * t.element_size()) // _PAGE * _PAGE
        spans.append((start, end))
    for off in range(0, max(end - start for start, end in spans), _CHUNK):
        for start, end in spans:
            lo = start + off
            if lo >= end:
                continue
            if madvise(lo, min(_CHUNK, end - lo), _MADV_POPULATE_WRITE) != 0:
                err = ctypes.get_errno()
                log.info("KV cache pages are backed on first write instead (madvise MADV_POPULATE_WRITE: %s)",
                         os.strerror(err))
                return
