"""Wall-clock timing shared by the CPU benchmark scripts (imported as a sibling module when they run)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], warmup: int = 3, min_time: float = 0.3, max_reps: int = 2000) -> float:
    """Median seconds per call of ``fn`` over at least ``min_time`` seconds (and 5 calls), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (time.perf_counter() - start < min_time or len(times) < 5):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
