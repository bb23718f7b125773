"""Prometheus metrics for ``/metrics`` (prometheus-client), in a registry of the server's own.

Gauges that describe the engine now (requests running and waiting, KV-cache usage, prefix-cache hit rate,
recent output tokens per second) are read at scrape time; latencies (time to first token, inter-token latency,
end-to-end) are observed by the request handlers as tokens reach them, so they include the server's own
overhead, as a client would see it.
"""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                    10.0, 20.0, 40.0, 80.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST
_RATE_WINDOW_S = 10.0


class ServerMetrics:
    """One server's metrics. ``async_llm`` supplies the live engine state read at scrape time."""

    def __init__(self, async_llm, model_name: str):
        self.registry = CollectorRegistry()
        self._llm = async_llm
        r, labels = self.registry, {"model_name": model_name}
        self.ttft = Histogram("engine_time_to_first_token_seconds", "Time from request arrival to its first token",
                              ["model_name"], buckets=_LATENCY_BUCKETS, registry=r).labels(**labels)
        self.itl = Histogram("engine_inter_token_latency_seconds", "Time between consecutive tokens of a completion",
                             ["model_name"], buckets=_LATENCY_BUCKETS, registry=r).labels(**labels)
        self.e2e = Histogram("engine_e2e_request_latency_seconds", "Time from request arrival to its last token",
                             ["model_name"], buckets=_LATENCY_BUCKETS, registry=r).labels(**labels)
        self.prompt_tokens = Counter("engine_prompt_tokens", "Prompt tokens of finished requests", ["model_name"],
                                     registry=r).labels(**labels)
        self.generation_tokens = Counter("engine_generation_tokens", "Generated tokens", ["model_name"],
                                         registry=r).labels(**labels)
        self.cached_tokens = Counter("engine_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache",
                                     ["model_name"], registry=r).labels(**labels)
        self._requests = Counter("engine_requests", "Finished requests by finish reason",
                                 ["model_name", "finish_reason"], registry=r)
        self._labels = labels
        self._recent: deque[tuple[float, int]] = deque()
        self._prompt_total = self._cached_total = 0
        gauges = [
            ("engine_num_requests_running", "Sequences being computed", lambda: self._llm.num_running),
            ("engine_num_requests_waiting", "Sequences waiting for a slot", lambda: self._llm.num_waiting),
            ("engine_kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1)",
             lambda: self._llm.kv_cache_usage),
            ("engine_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens",
             self._hit_rate),
            ("engine_generation_tokens_per_second", f"Generated tokens per second over the last {_RATE_WINDOW_S:g} s",
             self._tokens_per_s),
        ]
        for name, doc, fn in gauges:
            Gauge(name, doc, ["model_name"], registry=r).labels(**labels).set_function(fn)

    def on_tokens(self, n: int) -> None:
        if n:
            self.generation_tokens.inc(n)
            self._recent.append((time.monotonic(), n))

    def on_finished(self, finish_reason: str, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        self._requests.labels(finish_reason=finish_reason or "abort", **self._labels).inc()
        self.prompt_tokens.inc(num_prompt_tokens)
        self.cached_tokens.inc(num_cached_tokens)
        self._prompt_total += num_prompt_tokens
        self._cached_total += num_cached_tokens

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _hit_rate(self) -> float:
        return self._cached_total / self._prompt_total if self._prompt_total else 0.0

    def _tokens_per_s(self) -> float:
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - _RATE_WINDOW_S:
            self._recent.popleft()
        return sum(n for _, n in self._recent) / _RATE_WINDOW_S
