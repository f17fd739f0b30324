"""A window of a few records (a late record alone) exports no figure comparing true and
published values: its randomized response's observed retention would be 1 or 0 exactly as the
one published answer is or is not the respondent's own, and its DLD or interval disclosure
would speak for that respondent. Figures of published values alone (k checks) still count."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry
from streamkit import regroup_policy_path, validated_panel

from gateway.engine.engine import Engine
from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy
from state.sqlite_store import SQLiteStore
from stream_jobs.ops.metrics import GatewayMetrics
from stream_jobs.ops.metrics_scrape import MIN_MEASURED_RECORDS
from stream_jobs.settings import WorkerSettings
from stream_jobs.windows.windows import Flush, FlushReason
from stream_jobs.worker import GatewayWorker

SECRET = Keyring(b"small-window-metrics-secret-012345")
NO_FLUSH = Flush([], 0, {}, FlushReason.COUNT)
GAUGES = ("privgw_record_linkage_risk_ratio", "privgw_interval_disclosure_ratio")


def _retention(registry: CollectorRegistry) -> dict[str, float | None]:
    return {
        name: registry.get_sample_value("privgw_rr_retention_observed_ratio", {"attribute": name})
        for name in ("occupation", "income")
    }


def test_a_window_of_few_records_leaves_the_true_value_figures_as_they_were(
    tmp_path: Path,
) -> None:
    policy = load_policy(regroup_policy_path())
    records = validated_panel(400, seed=5)
    registry = CollectorRegistry()
    metrics = GatewayMetrics.create(registry)
    with SQLiteStore(tmp_path / "s.db") as store:
        engine = Engine(policy, keyring=SECRET, store=store)
        worker = GatewayWorker(policy, WorkerSettings(metrics_port=0), engine)
        metrics.attach(worker)
        account = worker.lifecycle._account  # as the worker accounts a flushed window
        big = engine.protect_window(records[:300], now=0.0, flush_all=True)
        assert big.report.published >= MIN_MEASURED_RECORDS
        account(big.report, NO_FLUSH, 0.0)
        before = _retention(registry), [registry.get_sample_value(g) for g in GAUGES]
        assert None not in before[0].values() and None not in before[1]
        for i in range(300, 310):  # one record a window, each with its own answers
            small = engine.protect_window(records[i : i + 1], now=1.0 + i, flush_all=True)
            assert small.report.published == 1 and small.report.retention
            account(small.report, NO_FLUSH, 0.0)
            assert (_retention(registry), [registry.get_sample_value(g) for g in GAUGES]) == (
                before
            )
