"""The worker's figures read at scrape time, and the names the measures are exported under.

``WorkerCollector`` is registered by ``GatewayMetrics.attach`` (``stream_jobs.ops.metrics``) and
reads, whenever Prometheus scrapes: ``WorkerStats`` (flow counters, held records, consumer lag
per partition, behind and held on purpose), the windows' waiting records (the delay of the
oldest undecided one, until when records are held), the monitor's health figures, the state
store's size, the policy's k, ε and expected retention, and the utility and risk measures the
per-window observer kept (last sampled window and moving averages), the whole-key figures and
the republication's. A scrape never waits for the engine and never fails because the store is
busy.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from gateway.commands.cli import package_version
from gateway.engine.records import ValidRecord
from gateway.panel.roster import roster_members
from gateway.policy import Policy, RepublicationMode
from gateway.state_store.state_api import StateStore
from gateway.state_store.state_keys import GROUP_KEY_PREFIX
from gateway.validation import DLQReason
from stream_jobs.ops.monitor import Monitor
from stream_jobs.ops.republication_metrics import RepublicationFigures
from stream_jobs.ops.republication_metrics import families as republication_families

if TYPE_CHECKING:
    from stream_jobs.worker import GatewayWorker

log = logging.getLogger(__name__)

EWMA_ALPHA = 0.2  # weight of the newest sampled window in the moving averages
# figures of true against published values come from windows of this many records (k if
# more) only: a late record's retention is 1 or 0 as its published answer is its own or not
MIN_MEASURED_RECORDS = 30

# measure key in WindowReport.measures -> (metric stem, help, scale to a 0-1 ratio)
MEASURES = {
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
KEY_MEASURES = {
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
LDIV_PREFIX = "ldiv_min:"  # + sensitive attribute name
SUPPRESSED_PREFIX = "suppressed_cells:"  # + key (recode_suppress)


class WindowFigures:
    """The figures of the sampled windows, kept between scrapes: ``GatewayMetrics``
    (``stream_jobs.ops.metrics``) adds them up as windows are flushed, the collector reads them."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.lock = threading.Lock()
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
        self.suppressed_cells: dict[str, float] = {}  # recode_suppress, per key, summed
        self.republication = RepublicationFigures(k=0, guarantee=False)
        self.sensitive_unique_last: float | None = None  # of the last sampled window
        self.retention_last: dict[str, float] = {}  # of the last window measured (any window)


class WorkerCollector(Collector):
    """Figures read from ``WorkerStats`` (and the store) at scrape time."""

    def __init__(
        self,
        metrics: WindowFigures,
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
        yield from self._info()
        yield from self._flow()
        yield from self._waiting()
        yield from self._privacy()
        yield from self._utility_and_risk()

    def _info(self) -> Iterator[Any]:
        p, w = self._m.prefix, self._worker
        yield InfoMetricFamily(
            f"{p}_build",
            "the running privgw and Python",
            value={"version": package_version(), "python": platform.python_version()},
        )
        yield InfoMetricFamily(
            f"{p}_policy",
            "policy in force (name and version hash)",
            value={"name": w.policy.name or "", "version": w.engine.version},
        )

    def _flow(self) -> Iterator[Any]:
        """Records through the worker, what it holds, and its health."""
        m, w = self._m, self._worker
        p, st = m.prefix, w.stats
        for name, value, doc in (
            ("records_consumed", st.consumed, "records consumed from the input topic"),
            ("records_published", st.published, "consumed records published and acknowledged"),
            ("records_withheld", st.withheld, "consumed records decided, not published (repeats)"),
            ("records_imputed", st.imputed, "panel records of absent members produced"),
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

    def _privacy(self) -> Iterator[Any]:
        """The policy's k and ε, and what the last windows showed of them."""
        m, w = self._m, self._worker
        p, policy = m.prefix, w.policy
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
            f"share of values published unchanged, last window of {MIN_MEASURED_RECORDS}+ records",
            labels=["attribute"],
        )
        with m.lock:
            for name, value in sorted(m.retention_last.items()):
                observed.add_metric([name], value)
        yield observed

    def _utility_and_risk(self) -> Iterator[Any]:
        """The sampled windows' utility and risk measures, last and averaged."""
        m, policy = self._m, self._worker.policy
        p = m.prefix
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
        threshold.add_metric(["linked_below_k"], policy.risk.linked_below_k_threshold)
        yield threshold
        with m.lock:
            last, average = dict(m.last), dict(m.average)
        for key, (stem, doc, _) in MEASURES.items():
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
        with m.lock:
            last, ldiv, violations = dict(m.key_last), dict(m.ldiv_last), m.key_class_violations
        yield CounterMetricFamily(
            f"{p}_key_class_violations",
            "sampled windows that published a whole-key class below k",
            value=violations,
        )
        for key, (stem, doc) in KEY_MEASURES.items():
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
        with m.lock:
            cells = dict(m.suppressed_cells)
        if cells:  # recode_suppress: the price of its k claim, per key
            family = CounterMetricFamily(
                f"{p}_suppressed_cells",
                "key cells published suppressed by recode_suppress in sampled windows",
                labels=["attribute"],
            )
            for name, value in sorted(cells.items()):
                family.add_metric([name], value)
            yield family
        with m.lock:
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
        yield from self._lag_split(mon)
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

    def _lag_split(self, mon: Monitor) -> Iterator[Any]:
        """The lag as records behind and records held on purpose (they add up to it)."""
        p = self._m.prefix
        labels = ["topic", "partition"]
        behind = GaugeMetricFamily(
            f"{p}_consumer_lag_behind_records",
            "of the consumer lag, records not decided yet: not consumed, or in the open window "
            "or the engine (the worker is behind by these)",
            labels=labels,
        )
        held = GaugeMetricFamily(
            f"{p}_consumer_lag_held_records",
            "of the consumer lag, records decided but uncommitted because records are held on "
            "purpose before them (a window or a wave waiting for k, or for the wave to close)",
            labels=labels,
        )
        for (topic, partition), (b, h) in sorted((mon.lag_split() or {}).items()):
            behind.add_metric([topic, str(partition)], b)
            held.add_metric([topic, str(partition)], h)
        yield behind
        yield held

    def _waiting(self) -> Iterator[Any]:
        """How long the oldest undecided record has waited, and until when records are held."""
        p, w = self._m.prefix, self._worker
        undecided, held = w.lifecycle.waiting()
        mono, wall = time.monotonic(), time.time()

        def produced(r: ValidRecord) -> float:  # its Kafka timestamp, no later than its arrival
            arrived = wall - (mono - r.arrived_at)
            ts = r.source.timestamp_ms if r.source is not None else -1
            return min(arrived, ts / 1000) if ts >= 0 else arrived

        oldest = min(map(produced, undecided), default=wall)
        yield GaugeMetricFamily(
            f"{p}_oldest_undecided_age_seconds",
            "age of the oldest consumed record not decided yet (open window or engine), by its "
            "Kafka timestamp: how far behind the output is in time (0: none waits; records held "
            "on purpose left out)",
            value=max(0.0, wall - oldest),
        )
        first = min((r.arrived_at for r in held), default=None)
        yield GaugeMetricFamily(
            f"{p}_hold_deadline_timestamp_seconds",
            "Unix time by which the oldest held record is decided at the latest: "
            "window.max_hold_seconds after it arrived (a wave is released then if it has not "
            "closed before; a record short of k is suppressed then, or held again under "
            "on_hold_timeout: hold), republication.max_wave_seconds for a panel wave; 0 when "
            "nothing is held",
            value=0.0 if first is None else wall - mono + first + latest_release(w.policy),
        )

    def _count(self) -> int:
        assert self._store is not None
        try:
            return count_respondents(self._store)
        except Exception as err:  # a scrape must not fail because the store is busy
            log.warning("state size unavailable: %s", err.__class__.__name__)
            return 0


def count_respondents(store: Any) -> int:
    """Respondents in ``store``: its entries less the engine's group registry rows (keys
    ``group:…``; respondent keys are 32-byte digests), plus the members of its panel rosters
    (one entry, or a head and parts, per scope: a partition of partitioned state, else one).
    A store that cannot count by prefix gives all its entries."""
    count_prefix = getattr(store, "count_prefix", None)
    groups = count_prefix(GROUP_KEY_PREFIX) if count_prefix is not None else 0
    return int(store.count()) - int(groups) + panel_members(store)


def panel_members(store: Any) -> int:
    """The members of ``store``'s panel rosters: a store in this process reads its rosters' heads
    (a partition's each, with partitioned state), stores in engine processes ask theirs."""
    members = getattr(store, "panel_members", None)
    if members is not None:
        return int(members())
    partitions = getattr(store, "partitions", None)
    scopes: list[int | None] = [None] if partitions is None else list(partitions)
    return roster_members(store.get_many, scopes)


def latest_release(policy: Policy) -> float:
    """Seconds after its arrival by which a held record is decided at the latest: a panel wave
    closes at its maximum (the hold timeout never decides it), anything else at the hold time."""
    rep = policy.republication
    if rep.mode is RepublicationMode.PANEL:
        return float(rep.max_wave)
    return float(policy.window.max_hold_seconds)
