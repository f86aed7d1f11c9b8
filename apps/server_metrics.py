"""Metrics for `specedge serve`: the JSON counters of GET /specedge/metrics, and Prometheus's GET /metrics (one
CollectorRegistry per Server, so that several servers live in one process).

Every series carries a `model` label (the served id; "" for a request refused before its model was known).
Counters and histograms are fed once per finished call from the call's statistics (runtime/stats.py CallStats); the gauges (waiting, running, loaded, bytes) are read from the model pool
at scrape time. Names are listed in docs/server.md.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..runtime.stats import CallStats, DecodeStats
from ..runtime.types import FinishReason

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
TAU_BUCKETS = (1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 8, 12, 17)
TPS_BUCKETS = (1, 2, 5, 10, 20, 35, 50, 75, 100, 150, 200, 300, 500, 1000)


@dataclass
class Metrics:
    """Counters served at GET /specedge/metrics; `recent` holds the last calls' finish records."""
    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    rejected: int = 0
    client_errors: int = 0
    generated_tokens: int = 0
    running: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=64))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, req, stats: CallStats, model: str = "") -> None:
        with self.lock:
            self.generated_tokens += stats.decode.n_generated
            cancelled = stats.finish_reason is FinishReason.CANCELLED
            self.cancelled += cancelled
            self.completed += not cancelled
            self.recent.append({"model": model, "finish_reason": stats.finish_reason.value,
                                "max_tokens": req.options.max_tokens, "n_generated": stats.decode.n_generated,
                                "stream": req.stream, "wall_s": stats.wall_s})

    def to_dict(self) -> dict:
        with self.lock:
            return {"requests": self.requests, "completed": self.completed, "cancelled": self.cancelled,
                    "rejected": self.rejected, "client_errors": self.client_errors,
                    "generated_tokens": self.generated_tokens, "running": self.running, "recent": list(self.recent)}



class PoolGauges:
    """Scrape-time gauges over a ModelPool: calls waiting and running per model, loaded state and bytes."""

    def __init__(self, pool) -> None:
        self.pool = pool

    def collect(self):
        waiting = GaugeMetricFamily("specedge_requests_waiting", "Calls admitted and waiting for the model's engine",
                                    labels=["model"])
        running = GaugeMetricFamily("specedge_requests_running", "Calls decoding on the model's engine",
                                    labels=["model"])
        loaded = GaugeMetricFamily("specedge_model_loaded", "1 when the model is loaded", labels=["model"])
        size = GaugeMetricFamily("specedge_model_bytes", "Weight bytes accounted for the model (--max-memory)",
                                 labels=["model"])
        for s in self.pool.state():
            engine = self.pool.engine_if_loaded(s.id)
            busy = int(bool(engine is not None and getattr(engine, "busy", False)))
            running.add_metric([s.id], busy)
            waiting.add_metric([s.id], max(0, s.in_use - busy))
            loaded.add_metric([s.id], int(s.loaded))
            size.add_metric([s.id], s.bytes)
        yield from (waiting, running, loaded, size)


class PromMetrics:
    """The per-Server registry and its series."""

    def __init__(self, pool) -> None:
        self.registry = r = CollectorRegistry()
        m = ["model"]
        self.requests = Counter("specedge_requests", "HTTP requests by route and outcome",
                                ["model", "route", "outcome"], registry=r)
        self.prompt_tokens = Counter("specedge_prompt_tokens", "Prompt tokens of finished calls", m, registry=r)
        self.generated_tokens = Counter("specedge_generated_tokens",
                                        "Completion tokens of finished calls (usage.completion_tokens)", m, registry=r)
        self.drafted = Counter("specedge_drafted_tokens", "Draft tokens proposed to the verifier", m, registry=r)
        self.accepted = Counter("specedge_accepted_tokens", "Draft tokens the verifier accepted", m, registry=r)
        self.position_proposed = Counter("specedge_draft_position_proposed",
                                         "Rounds that proposed a draft token at this position (0-based)",
                                         ["model", "position"], registry=r)
        self.position_accepted = Counter("specedge_draft_position_accepted",
                                         "Rounds whose draft token at this position (0-based) was accepted",
                                         ["model", "position"], registry=r)
        # the same counts under the names vLLM chose and llama.cpp's server took (ggml-org/llama.cpp#26389), so
        # dashboards built for those read ours: spec_decode_num_drafts (rounds that proposed a draft),
        # _num_draft_tokens, _num_accepted_tokens, _num_accepted_tokens_per_pos{position}
        self.spec_drafts = Counter("specedge:spec_decode_num_drafts", "Verify rounds that proposed a draft", m,
                                   registry=r)
        self.spec_draft_tokens = Counter("specedge:spec_decode_num_draft_tokens", "Draft tokens proposed", m,
                                         registry=r)
        self.spec_accepted = Counter("specedge:spec_decode_num_accepted_tokens", "Draft tokens accepted", m,
                                     registry=r)
        self.spec_accepted_per_pos = Counter("specedge:spec_decode_num_accepted_tokens_per_pos",
                                             "Draft tokens accepted at each position (0-based)",
                                             ["model", "position"], registry=r)
        self.tau = Histogram("specedge_tau", "Mean accepted length per call (tokens per target forward)", m,
                             buckets=TAU_BUCKETS, registry=r)
        self.latency = Histogram("specedge_request_duration_seconds",
                                 "Seconds from the request's arrival to its last token (queueing included)", m,
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("specedge_time_to_first_token_seconds",
                              "Seconds from the request's arrival to its first token (queueing included)", m,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tokens_per_s = Histogram("specedge_decode_tokens_per_second", "Decoding speed per call (prefill excluded)",
                                      m, buckets=TPS_BUCKETS, registry=r)
        r.register(PoolGauges(pool))

    def request(self, model: str, route: str, outcome: str) -> None:
        self.requests.labels(model, route, outcome).inc()

    def finished(self, model: str, route: str, stats: CallStats, completion_tokens: int, latency_s: float) -> None:
        """Feed one finished call: its CallStats, usage.completion_tokens and its latency."""
        d = stats.decode
        self.request(model, route, "cancelled" if stats.finish_reason is FinishReason.CANCELLED else "completed")
        self.prompt_tokens.labels(model).inc(stats.prompt_tokens)
        self.generated_tokens.labels(model).inc(completion_tokens)
        self.drafted.labels(model).inc(d.n_drafted)
        self.accepted.labels(model).inc(d.n_accepted)
        self.spec_draft_tokens.labels(model).inc(d.n_drafted)
        self.spec_accepted.labels(model).inc(d.n_accepted)
        self.spec_drafts.labels(model).inc(int(d.proposed_at[0]) if len(d.proposed_at) else 0)
        for i, (p, a) in enumerate(zip(d.proposed_at, d.accepted_at)):
            if p:
                self.position_proposed.labels(model, str(i)).inc(int(p))
                self.position_accepted.labels(model, str(i)).inc(int(a))
                self.spec_accepted_per_pos.labels(model, str(i)).inc(int(a))
        if d.n_target_forwards:
            self.tau.labels(model).observe(float(d.mean_accepted_length))
        self.latency.labels(model).observe(latency_s)
        if stats.ttft_s is not None:  # the engine's ttft plus the time the call waited for its turn
            self.ttft.labels(model).observe(max(0.0, latency_s - stats.wall_s) + stats.ttft_s)
        if d.tokens_per_s:
            self.tokens_per_s.labels(model).observe(float(d.tokens_per_s))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def merged(stats: list[CallStats | None]) -> CallStats | None:
    """The n choices of one request as one call for the metrics: the first choice's facts with every choice's
    decoding counts added (DecodeStats.merge)."""
    got = [s for s in stats if s is not None]
    if not got:
        return None
    total = DecodeStats()
    for s in got:
        total.merge(s.decode)
    return replace(got[0], decode=total)
