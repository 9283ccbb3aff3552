"""The server's Prometheus metrics, in a registry of its own (two apps in one process do not mix counts)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from tformer.generate.batching_report import batching_rows

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

    def watch_batching(self, stats, config, device) -> None:
        """Export decode tokens/s and the speed-up over batch 1 per batch size, measured beside the
        ledger's roofline prediction (recomputed at each scrape from the batcher's StepStats)."""
        self.registry.register(BatchingCollector(stats, config, device))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class BatchingCollector:
    """tformer_decode_tokens_per_second and tformer_decode_speedup, labelled by batch and source
    (measured: the batcher's clock inside each step; predicted: tformer.cost.batching on ``device``)."""

    def __init__(self, stats, config, device):
        self.stats, self.config, self.device = stats, config, device

    def describe(self):
        return []  # computed at scrape time: nothing to describe up front

    def collect(self):
        rate = GaugeMetricFamily("tformer_decode_tokens_per_second", "Decode tokens/s by batch size: measured "
                                 "inside the decode steps, and the ledger's roofline prediction", labels=["batch", "source"])
        gain = GaugeMetricFamily("tformer_decode_speedup", "Decode tokens/s over batch 1's, measured and predicted",
                                 labels=["batch", "source"])
        for row in batching_rows(self.stats, self.config, self.device):
            for source in ("measured", "predicted"):
                if row[f"{source}_tokens_per_s"] is not None:
                    rate.add_metric([str(row["batch"]), source], row[f"{source}_tokens_per_s"])
                if row[f"{source}_speedup"] is not None:
                    gain.add_metric([str(row["batch"]), source], row[f"{source}_speedup"])
        yield rate
        yield gain


__all__ = ["BatchingCollector", "Metrics"]
