"""Prometheus metrics of the webhook. Under gunicorn they live in prometheus_client's multiprocess
directory (PROMETHEUS_MULTIPROC_DIR, set before any worker starts) and are summed at scrape time."""

from __future__ import annotations

import os

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

REQUESTS = Counter(
    "fracgpu_admission_requests_total", "Admission requests by endpoint and outcome", ["endpoint", "outcome"]
)
LATENCY = Histogram(
    "fracgpu_admission_request_duration_seconds",
    "Time to answer an admission request",
    ["endpoint", "outcome"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
DENIALS = Counter(
    "fracgpu_admission_denials_total", "Pods denied, by the plugin that denied them", ["plugin"]
)
# The reference's controller-runtime series, so existing dashboards keep working.
WEBHOOK_REQUESTS = Counter(
    "controller_runtime_webhook_requests_total", "Webhook requests by path and HTTP code", ["webhook", "code"]
)

OPEN_CONNECTIONS = Gauge(
    "fracgpu_admission_open_connections", "Webhook connections open now, all workers", multiprocess_mode="livesum"
)
CLOSED_CONNECTIONS = Counter(
    "fracgpu_admission_connections_closed_total",
    "Webhook connections closed, by why: client, served, idle_timeout, handshake_timeout, request_timeout, "
    "write_timeout, bad_request, error, limit (closed to make room at --max-connections), shutdown",
    ["reason"],
)
REFUSED_CONNECTIONS = Counter(
    "fracgpu_admission_connections_refused_total",
    "Connections closed on arrival: --max-connections reached and every open connection was being answered",
)


def connection_opened() -> None:
    OPEN_CONNECTIONS.inc()


def connection_closed(reason: str) -> None:
    OPEN_CONNECTIONS.dec()
    CLOSED_CONNECTIONS.labels(reason).inc()


def observe(endpoint: str, outcome: str, plugin: str | None, seconds: float) -> None:
    REQUESTS.labels(endpoint, outcome).inc()
    LATENCY.labels(endpoint, outcome).observe(seconds)
    WEBHOOK_REQUESTS.labels(endpoint, "200").inc()
    if outcome == "denied":
        DENIALS.labels(plugin or "namespace").inc()


def exposition() -> bytes:
    """Metrics text of every worker when running multiprocess, else of this process."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest()
