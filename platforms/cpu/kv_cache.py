"""The CPU platform's KV cache: host memory that the kernel backs a little ahead of the engine's writes.

A fresh ``torch.empty`` tensor is address space only: the first write to each 4 KB page traps into the kernel,
which zeroes a page for it. A decode step of 32 sequences writes ~1.5 MB of new KV, and its KV writes took 0.9-1.2
ms a step instead of 0.43, 3-5% of the step (2-core Zen 5 VM, 2026-12-01). Zeroing the whole cache up front (as
llama.cpp clears its KV buffer) adds ~0.2 s per GB to start-up and commits all of it; backing all of it in the
background slowed a short single-stream generation (0.22-0.33 s to 0.35-0.43 s in two pairs: the thread competes for
the cores) and committed 900 MB more. So one low-priority thread per cache asks the kernel to back the pages (Linux
``MADV_POPULATE_WRITE``: it never changes what a page holds, so the engine may write meanwhile) only up to
``_LEAD_BYTES`` of every layer's tensors beyond the highest block the engine has reached (the block manager hands
blocks out lowest first)."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import weakref

import torch

log = logging.getLogger(__name__)

_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_PAGE = 4096
# Bytes of each tensor backed beyond the engine's highest block: ~20 decode steps of 32 sequences for SmolLM2-135M
# (24 KB a step per tensor), and 30 MB in all for its 60 tensors at start.
_LEAD_BYTES = 512 << 10


class KvCaches(list):
    """The (key, value) pairs, one per layer, and the thread that backs their pages (None where there is none)."""

    populator: _Populator | None = None


def empty_kv_caches(count: int, shape: tuple[int, ...], dtype: torch.dtype) -> KvCaches:
    """``count`` (key, value) pairs of uninitialized ``shape`` tensors; the first ``_LEAD_BYTES`` of each are
    backed in the background, and more as ``blocks_reached`` reports the engine's progress."""
    caches = KvCaches((torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)) for _ in range(count))
    if sys.platform.startswith("linux") and count and caches[0][0].numel():
        block_bytes = caches[0][0][0].numel() * caches[0][0].element_size()
        caches.populator = _Populator([t for pair in caches for t in pair], block_bytes)
        weakref.finalize(caches, caches.populator.stop)
    return caches


def blocks_reached(caches, blocks: int) -> None:
    """The engine is about to write blocks below ``blocks``: keep ``_LEAD_BYTES`` beyond them backed."""
    populator = getattr(caches, "populator", None)
    if populator is not None:
        populator.reach(blocks * populator.block_bytes + _LEAD_BYTES)


class _Populator:
    """A thread backing [0, target) bytes of every tensor, layer by layer, as target grows. It keeps the tensors'
    addresses, not the tensors: when the caches are freed it stops (finalizer), and a call that races the free is
    harmless (the kernel refuses an unmapped range, and backing reused memory changes nothing in it)."""

    def __init__(self, tensors: list[torch.Tensor], block_bytes: int):
        self.block_bytes = block_bytes
        self.spans = []  # whole pages of each tensor: (first page address, bytes)
        for t in tensors:
            start = -(-t.data_ptr() // _PAGE) * _PAGE
            end = (t.data_ptr() + t.numel() * t.element_size()) // _PAGE * _PAGE
            self.spans.append((start, max(end - start, 0)))
        self.size = max(n for _, n in self.spans)
        self.target = min(_LEAD_BYTES, self.size)
        self.cv = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="engine-kv-populate", daemon=True)
        self.thread.start()

    def reach(self, target: int) -> None:
        target = min(target, self.size)
        if target > self.target:
            with self.cv:
                self.target = target
                self.cv.notify()

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify()

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # only time the engine leaves idle
        except OSError as exc:
            log.info("KV cache populate thread keeps its priority: %s", exc)
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        done = 0
        while done < self.size:
            with self.cv:
                while self.target <= done and not self.stopped:
                    self.cv.wait()
                if self.stopped:
                    return
                upto = self.target
            for start, n in self.spans:
                if n > done and madvise(start + done, min(upto, n) - done, _MADV_POPULATE_WRITE) != 0:
                    if not self.stopped:
                        log.info("KV cache pages are backed on first write instead (madvise MADV_POPULATE_WRITE: "
                                 "%s)", os.strerror(ctypes.get_errno()))
                    return
            done = upto
