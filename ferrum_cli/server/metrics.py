"""The server's Prometheus metrics, in a registry of their own (not the process-wide default)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "ferrum_requests", "Requests answered, by endpoint and HTTP status.", ["endpoint", "status"], registry=r
        )
        self.audio_seconds = Counter("ferrum_audio_seconds", "Seconds of audio transcribed.", registry=r)
        self.queue_requests = Gauge("ferrum_queue_requests", "Requests queued or being decoded.", registry=r)
        self.queue_audio_seconds = Gauge(
            "ferrum_queue_audio_seconds", "Seconds of audio queued or being decoded.", registry=r
        )
        self.batch_fill = Histogram(
            "ferrum_batch_fill", "Windows in each batch, as a share of the batch size.",
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "ferrum_request_latency_seconds", "From the upload received to the answer, by endpoint.", ["endpoint"],
            buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 300), registry=r,
        )  # fmt: skip
        self.live_streams = Gauge(
            "ferrum_live_streams", "Live streams open on /v1/audio/stream and /v1/realtime.", registry=r
        )
        self.cancelled = Counter("ferrum_requests_cancelled", "Requests whose client went away.", registry=r)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
