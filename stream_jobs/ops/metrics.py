"""Prometheus metrics of one gateway worker (DESIGN §7).

Built by a factory with an injected registry, as faust's ``create(registry, prefix)``, so tests
use a fresh ``CollectorRegistry``::

    metrics = GatewayMetrics.create(CollectorRegistry(), prefix="privgw")
    metrics.attach(worker, store=store)     # per-window observer + scrape-time collector
    start_exporter(worker, settings, store=store)   # or all three, served on /metrics

Two kinds of figure:

* per window, observed when a window is flushed (``GatewayWorker.observers``): the window size
  and flush-latency histograms, k-violations, and exponentially weighted moving averages of the
  utility and risk measures (the engine computes them on every ``risk.sample_every``-th window;
  that sampling rate is exported too);
* read at scrape time from ``WorkerStats`` and the state store (``stream_jobs.ops.metrics_scrape``):
  flow counters, held records, consumer lag per partition (and its two parts: behind, and held
  on purpose), the delay of the oldest undecided record, until when records are held, state
  size, the policy's k, ε and expected retention.

Names have the ``privgw_`` prefix and base units (seconds, ratios 0-1, records); counters end in
``_total``. Labels come only from bounded sets — DLQ reasons, attribute names of the policy,
input topic and partition, risk measure names. No figure is derived from one respondent: no
per-record values, no minimum or maximum of raw values (group sizes are counts).

The whole-key figures (issue 18) cover every attribute of the k claim together: the smallest
published class (a lower bound over the whole history), the share of records in classes below
k, sample uniques, l-diversity of each sensitive attribute, and which quasi-identifiers the k
claim covers. DLD, ID, SSE/SST and IL1s are over the numeric quasi-identifiers only.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections.abc import Mapping
from typing import Self
from urllib.parse import urlsplit

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.exposition import MetricsHandler

from gateway.engine.records import WindowReport
from gateway.errors import PrivgwError
from gateway.state_store.state_api import StateStore
from stream_jobs.ops.bounded_http import BoundedHTTPServer
from stream_jobs.ops.metrics_scrape import (
    EWMA_ALPHA,
    KEY_MEASURES,
    LDIV_PREFIX,
    MEASURES,
    MIN_MEASURED_RECORDS,
    SUPPRESSED_PREFIX,
    WindowFigures,
    WorkerCollector,
    count_respondents,
)
from stream_jobs.ops.monitor import Monitor, start_monitor
from stream_jobs.ops.ops_metrics import OperationsCollector
from stream_jobs.ops.republication_metrics import LINKED_GUARANTEE, RepublicationFigures
from stream_jobs.settings import WorkerSettings
from stream_jobs.windows.windows import Flush
from stream_jobs.worker import GatewayWorker

__all__ = [
    "EWMA_ALPHA",
    "GatewayMetrics",
    "check_metrics_port",
    "count_respondents",  # (stream_jobs.ops.metrics_scrape's, where the scrape counts the state)
    "start_exporter",
]

log = logging.getLogger(__name__)

_SIZE_BUCKETS = (10, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 50_000)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics(WindowFigures):
    """The worker's metrics on one registry; ``attach`` binds them to a worker."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        super().__init__(prefix)
        self.registry = registry
        self.window_size = Histogram(
            f"{prefix}_window_size_records",
            "records per flushed window (new and previously held)",
            buckets=_SIZE_BUCKETS,
            registry=registry,
        )
        self.flush_latency = Histogram(
            f"{prefix}_flush_latency_seconds",
            "ingest to publish: age of the oldest record of a window when its outputs are acked",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.window_duration = Histogram(
            f"{prefix}_window_duration_seconds",
            "time to protect, produce and commit one window",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._collector: WorkerCollector | None = None

    @classmethod
    def create(cls, registry: CollectorRegistry, prefix: str = "privgw") -> Self:
        return cls(registry, prefix)

    def attach(
        self,
        worker: GatewayWorker,
        *,
        store: StateStore | None = None,
        monitor: Monitor | None = None,
    ) -> None:
        """Observe the worker's windows and export its figures at scrape time."""
        if self._collector is not None:
            raise RuntimeError("these metrics are attached to a worker already")
        policy = worker.policy
        self._k = policy.microaggregation.k
        self._attributes = frozenset(policy.attributes)  # labels: policy names only
        self.republication = RepublicationFigures(
            k=self._k, guarantee=LINKED_GUARANTEE[policy.republication.mode]
        )
        rr = worker.engine.metadata()["randomized_response"]
        rr_attrs = len(rr) if isinstance(rr, dict) else 0
        self._sticky_attrs = (
            rr_attrs
            + sum(1 for a in policy.attributes.values() if a.noise is not None)
            + (1 if policy.k_claim else 0)
        )
        worker.observers.append(self.observe)
        self._collector = WorkerCollector(self, worker, store, monitor)
        self.registry.register(self._collector)

    # -- per window (called in the worker's event loop) --------------------------------------
    def observe(self, report: WindowReport, flush: Flush, elapsed: float) -> None:
        now = time.monotonic()
        self.window_size.observe(report.records_in)
        self.window_duration.observe(elapsed)
        if flush.records:
            self.flush_latency.observe(max(0.0, now - min(r.arrived_at for r in flush.records)))
        with self.lock:
            self.deferred_moves += report.deferred_moves
            self.sticky_lookups += report.published * self._sticky_attrs
            if report.min_group_size is not None:
                self.min_group_last = report.min_group_size
                if report.min_group_size < self._k:
                    self.k_violations += 1
                    log.error(
                        "k violation: a window published a group of %d < k = %d",
                        report.min_group_size,
                        self._k,
                    )
            # figures of true against published values speak for a few respondents in a
            # small window (a late record alone): not exported from it
            measured = report.published >= max(self._k, MIN_MEASURED_RECORDS)
            if measured:
                self.retention_last.update(report.retention)
            if report.measures:
                self.sampled_windows += 1
                for key, value in report.measures.items():
                    if key not in MEASURES or not np.isfinite(value) or not measured:
                        continue
                    ratio = value * MEASURES[key][2]
                    self.last[key] = ratio
                    prev = self.average.get(key)
                    self.average[key] = (
                        ratio if prev is None else prev + EWMA_ALPHA * (ratio - prev)
                    )
                self._observe_key(report.measures)
                self.republication.observe(report.measures)
                records = report.measures.get("sensitive_records")
                if records:
                    uniques = report.measures.get("sensitive_uniques", 0.0)
                    self.sensitive_unique_last = uniques / records

    def _observe_key(self, measures: Mapping[str, float]) -> None:
        """Whole-key figures of a sampled window (caller holds the lock). A class below k is a
        broken privacy claim: counted and logged with counts only."""
        for key in KEY_MEASURES:
            value = measures.get(key)
            if value is not None and np.isfinite(value):
                self.key_last[key] = float(value)
        for key, value in measures.items():
            name = key.removeprefix(LDIV_PREFIX)
            if key.startswith(LDIV_PREFIX) and name in self._attributes and np.isfinite(value):
                self.ldiv_last[name] = float(value)
            name = key.removeprefix(SUPPRESSED_PREFIX)
            if key.startswith(SUPPRESSED_PREFIX) and name in self._attributes:
                self.suppressed_cells[name] = self.suppressed_cells.get(name, 0.0) + value
        smallest = measures.get("key_smallest_class")
        if smallest is None or not np.isfinite(smallest):
            return
        if smallest < self._k:
            self.key_class_violations += 1
            log.error(
                "whole-key violation: a sampled window published a quasi-identifier class of "
                "%d < k = %d respondents (%d records in classes below k)",
                int(smallest),
                self._k,
                round(measures.get("key_share_below_k", 0.0) * measures.get("key_records", 0.0)),
            )


def _port_problem(settings: WorkerSettings, err: OSError) -> str:
    taken = err.errno == errno.EADDRINUSE
    return (
        f"--metrics-port {settings.metrics_port} (PRIVGW_METRICS_PORT): "
        f"{settings.metrics_host}:{settings.metrics_port} "
        + ("is already in use" if taken else f"cannot be served ({err.__class__.__name__})")
        + "; choose a free port, or 0 to turn the exporter off"
    )


def check_metrics_port(settings: WorkerSettings) -> None:
    """Before anything starts: the exporter's port must be free (one line if not)."""
    if settings.metrics_port == 0:
        return
    try:
        infos = socket.getaddrinfo(settings.metrics_host, settings.metrics_port)
        family = infos[0][0] if infos else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            # as the exporter binds: a listener refuses it, old connections do not
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((settings.metrics_host, settings.metrics_port))
    except OSError as err:
        raise PrivgwError(_port_problem(settings, err)) from None


class _Handler(MetricsHandler):
    """/metrics, /healthz (liveness) and /readyz (readiness); 404 elsewhere.

    Kubernetes' probes read only the status: 200 healthy, 503 not; the body says why."""

    monitor: Monitor | None = None

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = urlsplit(self.path).path
        if path == "/metrics":
            super().do_GET()
            return
        if path in ("/healthz", "/readyz") and self.monitor is not None:
            verdict = self.monitor.liveness() if path == "/healthz" else self.monitor.readiness()
            self._answer(200 if verdict.ok else 503, verdict.reason)
            return
        self._answer(404, "not found: /metrics, /healthz or /readyz")

    def _answer(self, status: int, text: str) -> None:
        body = (text + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def start_exporter(
    worker: GatewayWorker,
    settings: WorkerSettings,
    *,
    store: StateStore | None = None,
    registry: CollectorRegistry | None = None,
    monitor: Monitor | None = None,
) -> GatewayMetrics | None:
    """Metrics for ``worker`` served on ``metrics_host:metrics_port`` with /healthz and
    /readyz (None when the port is 0). Starts a :class:`Monitor` unless one is given."""
    if settings.metrics_port == 0:
        return None
    monitor = monitor or start_monitor(worker, settings)
    metrics = GatewayMetrics.create(registry or CollectorRegistry(auto_describe=False))
    metrics.attach(worker, store=store, monitor=monitor)
    ProcessCollector(registry=metrics.registry)  # memory, CPU, open files of this process
    OperationsCollector(worker, monitor).register(metrics.registry)  # broker, engine, disk
    handler = type("PrivgwHandler", (_Handler,), {"registry": metrics.registry, "monitor": monitor})
    try:
        server = BoundedHTTPServer((settings.metrics_host, settings.metrics_port), handler)
    except OSError as err:
        raise PrivgwError(_port_problem(settings, err)) from None
    threading.Thread(target=server.serve_forever, name="privgw-exporter", daemon=True).start()
    worker.closers.append(server.shutdown)
    worker.closers.append(server.server_close)
    log.info(
        "metrics on http://%s:%d/metrics (and /healthz, /readyz)",
        settings.metrics_host,
        settings.metrics_port,
    )
    return metrics
