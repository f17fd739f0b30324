"""Prometheus exporter for one worker: figures read from ``WorkerStats`` at scrape time.

A first cut of the flow and privacy figures (DESIGN §7): labels only from bounded sets (DLQ
reasons, RR attribute names from the policy), nothing derived from one respondent. Served on
``metrics_host:metrics_port`` (127.0.0.1:9464 by default; port 0 disables it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from gateway.validation import DLQReason
from stream_jobs.settings import WorkerSettings
from stream_jobs.worker import GatewayWorker

log = logging.getLogger(__name__)


class WorkerCollector(Collector):
    def __init__(self, worker: GatewayWorker) -> None:
        self._worker = worker
        meta = worker.engine.metadata()
        rr = meta.get("randomized_response", {})
        self._epsilon = {
            name: d.get("epsilon") for name, d in (rr.items() if isinstance(rr, dict) else ())
        }

    def collect(self) -> Iterator[Any]:
        w = self._worker
        st = w.stats
        yield InfoMetricFamily(
            "privgw_policy", "policy in force", value={"version": w.engine.version}
        )
        for name, value, doc in (
            ("privgw_records_consumed", st.consumed, "records consumed from the input topic"),
            ("privgw_records_published", st.published, "protected records produced"),
            ("privgw_records_suppressed", st.suppressed, "records published with QIs suppressed"),
            ("privgw_windows_flushed", st.windows, "windows protected and flushed"),
            ("privgw_offset_commits", st.commits, "offset commits after acknowledged outputs"),
            ("privgw_sticky_hits", st.sticky_hits, "values republished from state"),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        dlq = CounterMetricFamily(
            "privgw_records_dlq", "records sent to the dead-letter topic", labels=["reason"]
        )
        for reason in DLQReason:
            dlq.add_metric([reason.value], st.dlq.get(reason.value, 0))
        yield dlq
        yield GaugeMetricFamily("privgw_records_held", "records held waiting for k", value=st.held)
        yield GaugeMetricFamily("privgw_k", "k in force", value=w.policy.microaggregation.k)
        if st.min_group_size is not None:
            yield GaugeMetricFamily(
                "privgw_min_group_size", "smallest group published", value=st.min_group_size
            )
        eps = GaugeMetricFamily(
            "privgw_rr_epsilon", "epsilon per RR attribute", labels=["attribute"]
        )
        for name, value in self._epsilon.items():
            if isinstance(value, int | float):
                eps.add_metric([name], float(value))
        yield eps
        ret = GaugeMetricFamily(
            "privgw_rr_retention_ratio",
            "observed retention per RR attribute (last window)",
            labels=["attribute"],
        )
        for name, value in st.retention.items():
            ret.add_metric([name], value)
        yield ret
        for key, metric, doc, scale in (
            ("sse_sst_pct", "privgw_sse_sst_ratio", "SSE/SST of the last microaggregation", 0.01),
            ("il1s", "privgw_il1s", "IL1s of the last microaggregation", 1.0),
            ("dld", "privgw_dld_ratio", "record-linkage disclosure risk (last window)", 1.0),
            (
                "interval_disclosure",
                "privgw_interval_disclosure_ratio",
                "interval disclosure risk (last window)",
                1.0,
            ),
        ):
            if key in st.measures:
                yield GaugeMetricFamily(metric, doc, value=st.measures[key] * scale)


def build_registry(worker: GatewayWorker) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker))
    return registry


def start_exporter(worker: GatewayWorker, settings: WorkerSettings) -> CollectorRegistry | None:
    if settings.metrics_port == 0:
        return None
    registry = build_registry(worker)
    start_http_server(settings.metrics_port, addr=settings.metrics_host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
    return registry
