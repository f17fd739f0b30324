"""The republication figures of the metrics (issue 29): linked candidate sets, freshness and
per-release classes of the engine's sampled windows, the mode and its guarantee, and counted,
logged (counts only) violations."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.keyed.keyed import Keyring
from gateway.policy import policy_from_yaml
from state.sqlite_store import SQLiteStore
from stream_jobs.ops.metrics import GatewayMetrics
from stream_jobs.settings import WorkerSettings
from stream_jobs.windows.windows import Flush, FlushReason
from stream_jobs.worker import GatewayWorker

SECRET = Keyring(b"republication-metrics-secret-0123")
NO_FLUSH = Flush([], 0, {}, FlushReason.COUNT)
POLICY = """
name: republication-metrics
input: {topic: r.in, respondent_id: rid}
output: {topic: r.out}
microaggregation: {k: 3}
republication: {mode: MODE, wave_attribute: wave}
attributes:
  age:    {role: quasi_identifier, type: numeric, method: microaggregation}
  region: {role: quasi_identifier, type: categorical, method: microaggregation,
           categories: [north, south]}
  wave:   {role: other, type: numeric, method: keep}
"""


def _wave(wave: int, regions: dict[int, str]) -> list[ValidRecord]:
    return [
        ValidRecord(
            f"r{i}",
            {"age": 20 + i, "region": regions.get(i, "north"), "wave": wave},
            SourceRef("in", 0, 100 * wave + i),
            0.0,
        )
        for i in range(12)
    ]


def _run(mode: str, tmp_path: Path) -> tuple[CollectorRegistry, dict[str, float], Engine]:
    policy = policy_from_yaml(POLICY.replace("MODE", mode))
    with SQLiteStore(tmp_path / f"{mode}.db") as store:
        engine = Engine(policy, keyring=SECRET, store=store)
        worker = GatewayWorker(policy, WorkerSettings(metrics_port=0), engine)
        registry = CollectorRegistry()
        metrics = GatewayMetrics.create(registry)
        metrics.attach(worker)
        # wave 2: two respondents move south (a changed category)
        for wave, regions in ((1, {}), (2, {0: "south", 5: "south"})):
            report = engine.protect_window(_wave(wave, regions), now=0.0, flush_all=True).report
            metrics.observe(report, NO_FLUSH, 0.0)
    return registry, dict(report.measures), engine


@pytest.mark.parametrize("mode", ["regroup", "cohort"])
def test_republication_figures_are_the_sampled_windows_measures(mode: str, tmp_path: Path) -> None:
    registry, m, _ = _run(mode, tmp_path)
    value = registry.get_sample_value
    assert m["linked_records"] == 12
    assert value("privgw_linked_candidates_smallest") == m["linked_smallest"]
    assert value("privgw_linked_below_k_ratio") == m["linked_below_k"] / 12
    assert value("privgw_stale_ratio") == m["stale_records"] / 12
    assert value("privgw_release_smallest_class") == m["release_smallest_class"] >= 3
    assert value("privgw_republication_mode", {"mode": mode}) == 1
    assert value("privgw_republication_linked_guarantee") == (mode == "cohort")
    assert value("privgw_linked_guarantee_violations_total") == 0
    assert value("privgw_release_class_violations_total") == 0
    if mode == "cohort":  # cohorts keep everyone's linked set (tests/gateway/test_attack.py
        # checks the figures against the intersection attack in both modes)
        assert m["linked_smallest"] >= 3 and m["linked_below_k"] == 0


def test_broken_promises_are_counted_and_logged_with_counts_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a sampled window as the engine would report it, had it broken both promises
    broken = {
        "linked_records": 10.0,
        "linked_below_k": 1.0,
        "linked_smallest": 2.0,
        "stale_records": 0.0,
        "stale_age_max": 0.0,
        "release_smallest_class": 2.0,
    }
    with caplog.at_level(logging.ERROR, logger="stream_jobs.ops.republication_metrics"):
        registry = _observed(tmp_path, POLICY.replace("MODE", "cohort"), broken)
    value = registry.get_sample_value
    assert value("privgw_release_class_violations_total") == 1
    assert value("privgw_linked_guarantee_violations_total") == 1
    assert value("privgw_linked_below_k_ratio") == pytest.approx(0.1)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "release violation: a sampled window published a class of 2 < k = 3 respondents "
        "within its release",
        "linkage violation: the republication mode promises linked candidate sets of k = 3, a "
        "sampled window published a respondent linked to 2",
    ]


@pytest.mark.parametrize(("smallest", "violations"), [(3.0, 0), (2.0, 1)])
def test_a_panel_whose_k_rose_is_held_to_the_k_of_its_history(
    tmp_path: Path, smallest: float, violations: int
) -> None:
    """Linked sets intersect every release a member was published in: after k rose from 3 to
    4, none of the history's can grow back to 4. Held to the new k, the critical alert fired
    for good after every such upgrade; held to the history's (``linked_promised``), only a
    set below that one is a violation."""
    measures = {"linked_records": 10.0, "linked_below_k": 0.0, "linked_smallest": smallest,
                "linked_promised": 3.0, "stale_records": 0.0, "stale_age_max": 0.0}  # fmt: skip
    text = POLICY.replace("MODE", "cohort").replace("k: 3", "k: 4")
    value = _observed(tmp_path, text, measures).get_sample_value
    assert value("privgw_k") == 4 and value("privgw_linked_candidates_promised") == 3
    assert value("privgw_linked_guarantee_violations_total") == violations


def _observed(tmp_path: Path, policy_text: str, measures: dict[str, float]) -> CollectorRegistry:
    """A fresh registry after the metrics observed one sampled window reporting ``measures``."""
    policy = policy_from_yaml(policy_text)
    with SQLiteStore(tmp_path / "s.db") as store:
        engine = Engine(policy, keyring=SECRET, store=store)
        worker = GatewayWorker(policy, WorkerSettings(metrics_port=0), engine)
        registry = CollectorRegistry()
        metrics = GatewayMetrics.create(registry)
        metrics.attach(worker)
        report = dataclasses.replace(
            engine.protect_window([], now=0.0, flush_all=True).report,
            risk_sampled=True,
            measures=measures,
        )
        metrics.observe(report, NO_FLUSH, 0.0)
    return registry
