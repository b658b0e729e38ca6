"""Prometheus metrics of the webhook. Under gunicorn they live in prometheus_client's multiprocess
directory (PROMETHEUS_MULTIPROC_DIR, set before any worker starts) and are summed at scrape time.

`/metrics` is served by the gunicorn master, which also adds what no worker has to report: build info, the
master's process metrics and the serving certificate's expiry (read from the files at scrape time). Every
labelled series the dashboards query is created at 0 in the master before the workers fork (`preinitialize`),
so `/metrics` is complete before the first review.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cryptography import x509
from prometheus_client import (
    PLATFORM_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.buildinfo import BuildInfoCollector

OUTCOMES = ("allowed", "patched", "denied", "invalid", "error")
# Go's prometheus.DefBuckets, which controller-runtime's webhook latency histogram uses.
GO_DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

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
WEBHOOK_LATENCY = Histogram(
    "controller_runtime_webhook_latency_seconds", "Histogram of the latency of processing admission requests",
    ["webhook"], buckets=GO_DEFAULT_BUCKETS,
)
WEBHOOK_IN_FLIGHT = Gauge(
    "controller_runtime_webhook_requests_in_flight", "Current number of admission requests being served",
    ["webhook"], multiprocess_mode="livesum",
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


def preinitialize(endpoints: Iterable[str], plugins: Iterable[str]) -> None:
    """Create every series the dashboards and alerts query at 0, so rates and ratios exist from the start."""
    for endpoint in endpoints:
        for outcome in OUTCOMES:
            REQUESTS.labels(endpoint, outcome)
        WEBHOOK_REQUESTS.labels(endpoint, "200")
        WEBHOOK_LATENCY.labels(endpoint)
        WEBHOOK_IN_FLIGHT.labels(endpoint)
    for plugin in plugins:
        DENIALS.labels(plugin)


@contextmanager
def in_flight(endpoint: str) -> Iterator[None]:
    gauge = WEBHOOK_IN_FLIGHT.labels(endpoint)
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()


def observe(endpoint: str, outcome: str, plugin: str | None, seconds: float) -> None:
    REQUESTS.labels(endpoint, outcome).inc()
    LATENCY.labels(endpoint, outcome).observe(seconds)
    WEBHOOK_REQUESTS.labels(endpoint, "200").inc()
    WEBHOOK_LATENCY.labels(endpoint).observe(seconds)
    if outcome == "denied":
        DENIALS.labels(plugin or "namespace").inc()


class CertificateCollector(Collector):
    """notAfter of the serving certificate (tls.crt) and of each CA in ca.crt, read from the files at scrape
    time: the files are what the workers load (they reload within a second of a change)."""

    def __init__(self, cert_dir: str, cert_file: str) -> None:
        self.files = {"serving": Path(cert_file), "ca": Path(cert_dir) / "ca.crt"}

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "fracgpu_admission_certificate_not_after_timestamp_seconds",
            "Expiry (notAfter, Unix seconds) of the webhook's serving certificate and of the CA certificates "
            "beside it", labels=["certificate", "serial"])
        for role, path in self.files.items():
            try:
                certificates = x509.load_pem_x509_certificates(path.read_bytes())
            except (OSError, ValueError):
                continue  # no file (a CA is optional) or a half-written one: nothing to report this scrape
            for certificate in certificates[:1] if role == "serving" else certificates:
                not_after = certificate.not_valid_after_utc.timestamp()
                family.add_metric([role, format(certificate.serial_number, "x")], not_after)
        yield family


def master_collectors(program: str, cert_dir: str, cert_file: str) -> list[Collector]:
    """Collectors of the process that serves /metrics (the gunicorn master)."""
    return [BuildInfoCollector(program), ProcessCollector(registry=None), PLATFORM_COLLECTOR,
            CertificateCollector(cert_dir, cert_file)]


def exposition(extra: Iterable[Collector] = ()) -> bytes:
    """Metrics text of every worker when running multiprocess (else of this process), plus `extra`."""
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        for collector in (REQUESTS, LATENCY, DENIALS, WEBHOOK_REQUESTS, WEBHOOK_LATENCY, WEBHOOK_IN_FLIGHT,
                          OPEN_CONNECTIONS, CLOSED_CONNECTIONS, REFUSED_CONNECTIONS):
            registry.register(collector)
    for collector in extra:
        registry.register(collector)
    return generate_latest(registry)
