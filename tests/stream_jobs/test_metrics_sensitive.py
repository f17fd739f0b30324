"""The live value-linkage proxy (issue 29, item 4): the share of a sampled window's published
records whose combination of published sensitive values is unique in the window, exported as
``privgw_sensitive_unique_ratio``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
from prometheus_client import CollectorRegistry
from streamkit import regroup_policy_path, validated_panel

from gateway.engine.engine import Engine
from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy
from state.sqlite_store import SQLiteStore
from stream_jobs.ops.metrics import GatewayMetrics
from stream_jobs.settings import WorkerSettings
from stream_jobs.windows.windows import Flush, FlushReason
from stream_jobs.worker import GatewayWorker

ADULT = regroup_policy_path()
SECRET = Keyring(b"sensitive-metrics-secret-0123456789")
NO_FLUSH = Flush([], 0, {}, FlushReason.COUNT)
SENSITIVE = ("occupation", "income", "capital_gain", "capital_loss")


def test_the_gauge_is_the_last_sampled_windows_unique_share(tmp_path: Path) -> None:
    policy = load_policy(ADULT)
    records = validated_panel(900, seed=11)
    registry = CollectorRegistry()
    metrics = GatewayMetrics.create(registry)
    with SQLiteStore(tmp_path / "s.db") as store:
        engine = Engine(policy, keyring=SECRET, store=store)
        metrics.attach(GatewayWorker(policy, WorkerSettings(metrics_port=0), engine))
        assert registry.get_sample_value("privgw_sensitive_unique_ratio") is None  # none yet
        for start in range(0, len(records), 300):
            result = engine.protect_window(records[start : start + 300], now=0.0, flush_all=True)
            metrics.observe(result.report, NO_FLUSH, 0.0)
    rows = [orjson.loads(p.value) for p in result.published]
    combos = Counter(tuple(row[a] for a in SENSITIVE) for row in rows)
    unique = sum(1 for c in combos.values() if c == 1)
    measures = result.report.measures
    assert (measures["sensitive_records"], measures["sensitive_uniques"]) == (len(rows), unique)
    got = registry.get_sample_value("privgw_sensitive_unique_ratio")
    assert got == unique / len(rows)
    # the shipped policy rounds the noised amounts: not every combination is its own key
    assert 0 < got < 1
