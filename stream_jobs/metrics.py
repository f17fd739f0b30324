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
* read at scrape time from ``WorkerStats`` and the state store: flow counters, held records,
  consumer lag per partition, state size, the policy's k, ε and expected retention.

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
import platform
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any, Self
from urllib.parse import urlsplit

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import Collector

from gateway.cli import package_version
from gateway.engine import WindowReport
from gateway.errors import PrivgwError
from gateway.state_api import StateStore
from gateway.state_keys import GROUP_KEY_PREFIX
from gateway.validation import DLQReason
from stream_jobs.bounded_http import BoundedHTTPServer
from stream_jobs.monitor import Monitor, start_monitor
from stream_jobs.ops_metrics import OperationsCollector
from stream_jobs.republication_metrics import LINKED_GUARANTEE, RepublicationFigures
from stream_jobs.republication_metrics import families as republication_families
from stream_jobs.settings import WorkerSettings
from stream_jobs.windows import Flush
from stream_jobs.worker import GatewayWorker

log = logging.getLogger(__name__)

EWMA_ALPHA = 0.2  # weight of the newest sampled window in the moving averages

# measure key in WindowReport.measures -> (metric stem, help, scale to a 0-1 ratio)
_MEASURES = {
    "sse_sst_pct": ("sse_sst_ratio", "SSE/SST, numeric quasi-identifiers only", 0.01),
    "il1s": (
        "il1s",
        "IL1s (mean absolute deviation over sqrt(2)·S, per n·p), numeric quasi-identifiers only",
        1.0,
    ),
    "dld": (
        "record_linkage_risk_ratio",
        "distance-based record-linkage risk (DLD), numeric quasi-identifiers only",
        1.0,
    ),
    "interval_disclosure": (
        "interval_disclosure_ratio",
        "rank-based interval disclosure risk (ID), numeric quasi-identifiers only",
        1.0,
    ),
}

# whole-key measures of a sampled window (WindowReport.measures) -> (metric stem, help)
_KEY_MEASURES = {
    "key_smallest_class": (
        "key_smallest_class",
        "smallest published class of the whole k-claim tuple, a lower bound over the whole "
        "history (respondents), last sampled window",
    ),
    "key_share_below_k": (
        "key_share_below_k_ratio",
        "share of the published records in whole-key classes below k, last sampled window",
    ),
    "key_uniques": (
        "key_uniques",
        "published records alone in their whole-key class, last sampled window",
    ),
    "key_expected_reidentifications": (
        "key_expected_reidentifications",
        "expected re-identifications in the last sampled window: sum over its published "
        "records of 1/fk, fk the whole-key class over the history (sdcMicro's risk_ER, "
        "unweighted)",
    ),
    "key_global_risk": (
        "key_global_risk_ratio",
        "mean individual re-identification risk 1/fk of the last sampled window's published "
        "records on the whole key (at most 1/k while the k claim holds)",
    ),
}
_LDIV_PREFIX = "ldiv_min:"  # + sensitive attribute name

_SIZE_BUCKETS = (10, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 50_000)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    """The worker's metrics on one registry; ``attach`` binds them to a worker."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.registry = registry
        self.prefix = prefix
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
        self._lock = threading.Lock()
        self.k_violations = 0
        self.deferred_moves = 0
        self.sticky_lookups = 0
        self.sampled_windows = 0
        self.min_group_last: int | None = None
        self.last: dict[str, float] = {}
        self.average: dict[str, float] = {}
        # whole key (every attribute of the k claim): last sampled window, violations
        self.key_class_violations = 0
        self.key_last: dict[str, float] = {}
        self.ldiv_last: dict[str, float] = {}
        self.republication = RepublicationFigures(k=0, guarantee=False)
        self.sensitive_unique_last: float | None = None  # of the last sampled window
        self._collector: _WorkerCollector | None = None

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
        self._collector = _WorkerCollector(self, worker, store, monitor)
        self.registry.register(self._collector)

    # -- per window (called in the worker's event loop) --------------------------------------
    def observe(self, report: WindowReport, flush: Flush, elapsed: float) -> None:
        now = time.monotonic()
        self.window_size.observe(report.records_in)
        self.window_duration.observe(elapsed)
        if flush.records:
            self.flush_latency.observe(max(0.0, now - min(r.arrived_at for r in flush.records)))
        with self._lock:
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
            if report.measures:
                self.sampled_windows += 1
                for key, value in report.measures.items():
                    if key not in _MEASURES or not np.isfinite(value):
                        continue
                    ratio = value * _MEASURES[key][2]
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
        for key in _KEY_MEASURES:
            value = measures.get(key)
            if value is not None and np.isfinite(value):
                self.key_last[key] = float(value)
        for key, value in measures.items():
            name = key.removeprefix(_LDIV_PREFIX)
            if key.startswith(_LDIV_PREFIX) and name in self._attributes and np.isfinite(value):
                self.ldiv_last[name] = float(value)
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


class _WorkerCollector(Collector):
    """Figures read from ``WorkerStats`` (and the store) at scrape time."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        worker: GatewayWorker,
        store: StateStore | None,
        monitor: Monitor | None,
    ) -> None:
        self._m = metrics
        self._worker = worker
        self._store = store
        self._monitor = monitor
        meta = worker.engine.metadata()
        rr = meta.get("randomized_response", {})
        self._rr: dict[str, dict[str, Any]] = dict(rr) if isinstance(rr, dict) else {}
        self._claim = [(a, True) for a in worker.policy.k_claim] + [
            (a, False) for a in worker.policy.unprotected_quasi_identifiers
        ]

    def collect(self) -> Iterator[Any]:
        m, w = self._m, self._worker
        p, st, policy = m.prefix, w.stats, w.policy
        yield InfoMetricFamily(
            f"{p}_build",
            "the running privgw and Python",
            value={"version": package_version(), "python": platform.python_version()},
        )
        yield InfoMetricFamily(
            f"{p}_policy",
            "policy in force (name and version hash)",
            value={"name": policy.name or "", "version": w.engine.version},
        )
        # flow
        for name, value, doc in (
            ("records_consumed", st.consumed, "records consumed from the input topic"),
            ("records_published", st.published, "protected records produced and acknowledged"),
            ("records_suppressed", st.suppressed, "records published with QIs suppressed"),
            ("windows_flushed", st.windows, "windows protected and flushed"),
            ("offset_commits", st.commits, "offset commits after acknowledged outputs"),
            ("records_repartitioned", st.repartitioned, "keyless records re-keyed (key_field)"),
            ("delivery_retries", st.retries, "windows re-sent and commits retried (broker away)"),
            ("sticky_hits", st.sticky_hits, "values republished from state"),
            ("sticky_lookups", m.sticky_lookups, "values that could be served from state"),
            ("deferred_moves", m.deferred_moves, "changed QIs kept in their group for k"),
            ("k_violations", m.k_violations, "windows whose smallest group was below k"),
            (
                "secret_rotations",
                st.secret_rotations,
                "states accepted with another key fingerprint (rotate_secret): privacy events",
            ),
        ):
            yield CounterMetricFamily(f"{p}_{name}", doc, value=value)
        dlq = CounterMetricFamily(
            f"{p}_records_dlq", "records sent to the dead-letter topic", labels=["reason"]
        )
        for reason in DLQReason:
            dlq.add_metric([reason.value], st.dlq.get(reason.value, 0))
        yield dlq
        yield GaugeMetricFamily(
            f"{p}_records_held", "records held waiting for k (offsets uncommitted)", value=st.held
        )
        yield GaugeMetricFamily(
            f"{p}_engine_shards",
            "engines the respondents are split over, each with its own state file",
            value=w.engine_shards,
        )
        yield from self._health()
        yield GaugeMetricFamily(
            f"{p}_restore_records_remaining",
            "changelog records still to replay before processing (partitioned state)",
            value=st.restore_remaining,
        )
        if self._store is not None:
            yield GaugeMetricFamily(
                f"{p}_state_respondents",
                "respondents in the state store (the group registry's rows left out)",
                value=self._count(),
            )
        lookups = m.sticky_lookups
        yield GaugeMetricFamily(
            f"{p}_sticky_hit_ratio",
            "share of lookups served from state since start",
            value=(st.sticky_hits / lookups) if lookups else 0.0,
        )
        # privacy
        if any(covered for _, covered in self._claim):  # no k claim without an attribute
            yield GaugeMetricFamily(f"{p}_k", "k in force", value=policy.microaggregation.k)
        if m.min_group_last is not None:
            yield GaugeMetricFamily(
                f"{p}_min_group_size_last_window",
                "members of the smallest group the last microaggregating window formed",
                value=m.min_group_last,
            )
        eps = GaugeMetricFamily(
            f"{p}_rr_epsilon", "local DP epsilon = ln(gamma) per RR attribute", labels=["attribute"]
        )
        expected = GaugeMetricFamily(
            f"{p}_rr_retention_expected_ratio",
            "mean probability of publishing the true value (diagonal of P)",
            labels=["attribute"],
        )
        for name, d in self._rr.items():
            value = d.get("epsilon")
            eps.add_metric([name], float(value) if isinstance(value, int | float) else np.inf)
            matrix = np.asarray(d.get("matrix", []), dtype=float)
            if matrix.ndim == 2 and matrix.size:
                expected.add_metric([name], float(np.mean(np.diag(matrix))))
        yield eps
        yield expected
        observed = GaugeMetricFamily(
            f"{p}_rr_retention_observed_ratio",
            "share of values published unchanged in the last window",
            labels=["attribute"],
        )
        for name, value in sorted(st.retention.items()):
            observed.add_metric([name], value)
        yield observed
        # utility and risk
        yield GaugeMetricFamily(
            f"{p}_risk_sample_every",
            "risk and utility are computed on every n-th window (policy risk.sample_every)",
            value=policy.risk.sample_every,
        )
        yield CounterMetricFamily(
            f"{p}_risk_windows", "windows whose risk and utility were computed", m.sampled_windows
        )
        threshold = GaugeMetricFamily(
            f"{p}_risk_threshold_ratio", "policy alert thresholds", labels=["measure"]
        )
        threshold.add_metric(["dld"], policy.risk.max_dld)
        threshold.add_metric(["interval_disclosure"], policy.risk.max_interval_disclosure)
        threshold.add_metric(["linked_below_k"], policy.risk.max_linked_below_k)
        yield threshold
        with m._lock:
            last, average = dict(m.last), dict(m.average)
        for key, (stem, doc, _) in _MEASURES.items():
            if key in last:
                yield GaugeMetricFamily(f"{p}_{stem}", f"{doc}, last sampled window", last[key])
                yield GaugeMetricFamily(
                    f"{p}_{stem}_avg",
                    f"{doc}, moving average (alpha {EWMA_ALPHA})",
                    average[key],
                )
        yield from self._whole_key()
        if m.sensitive_unique_last is not None:
            yield GaugeMetricFamily(
                f"{p}_sensitive_unique_ratio",
                "share of the last sampled window's published records whose combination of "
                "published sensitive values is unique in the window: sticky values that can "
                "link a record across releases (with engine shards, unique within its shard: "
                "an upper bound)",
                value=m.sensitive_unique_last,
            )

    def _whole_key(self) -> Iterator[Any]:
        """What the k claim covers and how the whole published key fared (issue 18)."""
        m, p = self._m, self._m.prefix
        claim = GaugeMetricFamily(
            f"{p}_k_claim_attributes",
            "1 per quasi-identifier; covered: in the k claim (true) or unprotected (false)",
            labels=["attribute", "covered"],
        )
        for name, covered in self._claim:
            claim.add_metric([name, "true" if covered else "false"], 1)
        yield claim
        covered = sum(1 for _, c in self._claim if c)
        yield GaugeMetricFamily(
            f"{p}_k_claim_covered_attributes",
            "quasi-identifiers the k claim covers (0: no published tuple is protected by k, "
            "and privgw_k is not exported)",
            value=covered,
        )
        with m._lock:
            last, ldiv, violations = dict(m.key_last), dict(m.ldiv_last), m.key_class_violations
        yield CounterMetricFamily(
            f"{p}_key_class_violations",
            "sampled windows that published a whole-key class below k",
            value=violations,
        )
        for key, (stem, doc) in _KEY_MEASURES.items():
            if key in last:
                yield GaugeMetricFamily(f"{p}_{stem}", doc, value=last[key])
            elif key == "key_share_below_k":  # always there, so its alert and panel can see it
                unprotected = bool(self._claim) and not covered
                yield GaugeMetricFamily(
                    f"{p}_{stem}",
                    doc + " (before one: 1 if quasi-identifiers are published outside any k "
                    "claim, else 0)",
                    value=1.0 if unprotected else 0.0,
                )
        ldiv_family = GaugeMetricFamily(
            f"{p}_l_diversity_min",
            "fewest distinct published values of a sensitive attribute within one group formed "
            "in the last sampled window that formed groups (the attribute l-diversity is "
            "enforced on, under regroup and cohort: within one class the window published, "
            "over its release so far)",
            labels=["attribute"],
        )
        for name, value in sorted(ldiv.items()):
            ldiv_family.add_metric([name], value)
        yield ldiv_family
        with m._lock:
            figures = replace(m.republication, last=dict(m.republication.last))
        yield from republication_families(p, self._worker.policy, figures)

    def _health(self) -> Iterator[Any]:
        """Lag and liveness from the monitor, which keeps measuring when the loop is stuck."""
        p, st, mon = self._m.prefix, self._worker.stats, self._monitor
        measured = mon.lag() if mon is not None else None
        lag = GaugeMetricFamily(
            f"{p}_consumer_lag_records",
            "records between the group's committed offset and the end of each assigned "
            "partition (measured apart from the processing loop)"
            if mon is not None
            else "records behind the high watermark after the last fetch",
            labels=["topic", "partition"],
        )
        for (topic, partition), value in sorted((st.lag if measured is None else measured).items()):
            lag.add_metric([topic, str(partition)], value)
        yield lag
        if mon is None:
            return
        if mon.lag_measured_at is not None:
            yield GaugeMetricFamily(
                f"{p}_lag_measured_timestamp_seconds",
                "when consumer lag was last measured (Unix time)",
                value=mon.lag_measured_at,
            )
        since = mon.seconds_since_progress()
        yield GaugeMetricFamily(
            f"{p}_seconds_since_progress",
            "since the processing loop last turned or the window in the engine went in",
            value=since,
        )
        yield GaugeMetricFamily(
            f"{p}_last_progress_timestamp_seconds",
            "when the worker last made progress (Unix time)",
            value=time.time() - since,
        )
        yield GaugeMetricFamily(
            f"{p}_stall_timeout_seconds",
            "no progress for this long counts as a stall (PRIVGW_STALL_TIMEOUT_SECONDS)",
            value=self._worker.settings.stall_timeout_seconds,
        )
        yield GaugeMetricFamily(
            f"{p}_stalled", "1 when the worker is stalled (/healthz 503)", value=mon.stalled()
        )
        yield GaugeMetricFamily(
            f"{p}_ready", "1 when the worker is ready (/readyz 200)", value=mon.readiness().ok
        )

    def _count(self) -> int:
        assert self._store is not None
        try:
            return count_respondents(self._store)
        except Exception as err:  # a scrape must not fail because the store is busy
            log.warning("state size unavailable: %s", err.__class__.__name__)
            return 0


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


def count_respondents(store: Any) -> int:
    """Respondents in ``store``: its entries less the engine's group registry rows (keys
    ``group:…``; respondent keys are 32-byte digests). A store that cannot count by prefix
    (the partitioned backend) gives all its entries."""
    count_prefix = getattr(store, "count_prefix", None)
    groups = count_prefix(GROUP_KEY_PREFIX) if count_prefix is not None else 0
    return int(store.count()) - int(groups)


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
