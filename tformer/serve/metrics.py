"""The server's Prometheus metrics, in a registry of its own (two apps in one process do not mix counts)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self, queue_depth=lambda: 0, active=lambda: 0):
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter("tformer_requests", "HTTP requests answered, by path and status", ["path", "status"],
                                registry=r)
        self.latency = Histogram("tformer_request_seconds", "Time from request to the end of the answer, by path",
                                 ["path"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("tformer_time_to_first_token_seconds", "Time from submission to the first generated "
                              "token", buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("tformer_tokens_generated", "Tokens generated and sent to clients", registry=r)
        self.errors = Counter("tformer_errors", "Error answers by kind (the error code) and sequences that ended "
                              "early by finish reason (timeout, cancelled, error)", ["kind"], registry=r)
        self.embedded = Counter("tformer_embedding_inputs", "Inputs embedded", registry=r)
        Gauge("tformer_queue_depth", "Completion requests waiting to start", registry=r).set_function(queue_depth)
        Gauge("tformer_active_sequences", "Sequences in the running batch", registry=r).set_function(active)

    def render(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["Metrics"]
