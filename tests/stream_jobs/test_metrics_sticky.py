"""The sticky hit ratio's denominator counts every value that state can serve: each randomized
attribute, each noised one, and the microaggregated quasi-identifiers of a record. And the
engine shards a worker runs are exported."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry
from streamkit import regroup_policy_path, validated_panel

from gateway.engine.engine import Engine
from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy
from state.sqlite_store import SQLiteStore
from stream_jobs.commands.cli import build_worker
from stream_jobs.ops.metrics import GatewayMetrics
from stream_jobs.settings import WorkerSettings
from stream_jobs.windows.windows import Flush, FlushReason
from stream_jobs.worker import GatewayWorker

ADULT = regroup_policy_path()


def test_sticky_hits_never_exceed_the_lookups_counted(tmp_path: Path) -> None:
    policy = load_policy(ADULT)
    records = validated_panel(1200, seed=4)  # 400 respondents, one wave per window below
    with SQLiteStore(tmp_path / "s.db") as store:
        engine = Engine(policy, keyring=Keyring(b"metrics-test-secret-0123456789"), store=store)
        worker = GatewayWorker(policy, WorkerSettings(metrics_port=0), engine)
        metrics = GatewayMetrics.create(CollectorRegistry())
        metrics.attach(worker)
        most = 0.0
        for start in range(0, len(records), 400):  # one wave per window
            result = engine.protect_window(records[start : start + 400], now=0.0, flush_all=True)
            report = result.report
            before = metrics.sticky_lookups
            metrics.observe(report, Flush([], 0, {}, FlushReason.COUNT), 0.0)
            assert report.sticky_hits <= metrics.sticky_lookups - before  # in every window
            most = max(most, report.sticky_hits / max(1, report.published))
    # returning respondents were served from state for more than the two randomized
    # attributes alone: the microaggregated quasi-identifiers count too
    assert most > 2


def test_the_engine_shards_a_worker_runs_are_exported(tmp_path: Path, secret_env: str) -> None:
    policy = load_policy(ADULT)
    settings = WorkerSettings(metrics_port=0, state_dir=tmp_path, engine="thread", engine_shards=3)
    worker = build_worker(policy, settings, Keyring(secret_env.encode()))
    try:
        registry = CollectorRegistry()
        GatewayMetrics.create(registry).attach(worker, store=worker.state_store)
        assert registry.get_sample_value("privgw_engine_shards") == 3
        # the thread engine opened the sharded layout, counted as one store
        assert sorted(p.name for p in tmp_path.glob("state.shard-*.db")) == [
            f"state.shard-{i}-of-3.db" for i in range(3)
        ]
        result = worker.engine.protect_window(validated_panel(60), now=0.0, flush_all=True)
        assert len(result.published) == 60
        assert worker.state_store.count() > 0
    finally:
        worker.state_store.close()
