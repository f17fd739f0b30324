"""The whole-key figures of the metrics (issue 18): the smallest published class, the share
below k, sample uniques and l-diversity of the engine's sampled windows, what the k claim
covers, and a counted, logged (counts only) violation when a class is below k."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from streamkit import regroup_policy_path, validated_panel

from gateway.engine.engine import Engine
from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy, policy_from_yaml
from state.sqlite_store import SQLiteStore
from stream_jobs.ops.metrics import GatewayMetrics
from stream_jobs.settings import WorkerSettings
from stream_jobs.windows.windows import Flush, FlushReason
from stream_jobs.worker import GatewayWorker

ADULT = regroup_policy_path()
SECRET = Keyring(b"whole-key-metrics-secret-0123456789")
NO_FLUSH = Flush([], 0, {}, FlushReason.COUNT)


def test_whole_key_figures_are_the_sampled_windows_measures(tmp_path: Path) -> None:
    policy = load_policy(ADULT)
    k = policy.microaggregation.k
    records = validated_panel(900, seed=7)
    with SQLiteStore(tmp_path / "s.db") as store:
        engine = Engine(policy, keyring=SECRET, store=store)
        worker = GatewayWorker(policy, WorkerSettings(metrics_port=0), engine)
        registry = CollectorRegistry()
        metrics = GatewayMetrics.create(registry)
        metrics.attach(worker)
        for start in range(0, len(records), 300):
            report = engine.protect_window(
                records[start : start + 300], now=0.0, flush_all=True
            ).report
            metrics.observe(report, NO_FLUSH, 0.0)
    measures = report.measures  # the last window's (policy risk.sample_every: 1)
    assert measures["key_records"] > 0
    value = registry.get_sample_value
    assert value("privgw_key_smallest_class") == measures["key_smallest_class"] >= k
    assert value("privgw_key_share_below_k_ratio") == measures["key_share_below_k"] == 0
    assert value("privgw_key_uniques") == measures["key_uniques"] == 0
    er = measures["key_expected_reidentifications"]
    assert value("privgw_key_expected_reidentifications") == er > 0
    assert value("privgw_key_global_risk_ratio") == measures["key_global_risk"] <= 1 / k
    assert value("privgw_key_class_violations_total") == 0
    sensitive = ("occupation", "income", "capital_gain", "capital_loss")
    for name in sensitive:
        got = value("privgw_l_diversity_min", {"attribute": name})
        assert got == measures[f"ldiv_min:{name}"] and 1 <= got <= 2 * k - 1
    claim = {
        (s.labels["attribute"], s.labels["covered"])
        for metric in registry.collect()
        if metric.name == "privgw_k_claim_attributes"
        for s in metric.samples
        if s.value == 1
    }
    assert claim == {(a, "true") for a in policy.k_claim} and len(claim) == 9


UNPROTECTED = """
name: unprotected-test
input: {topic: u.in, respondent_id: rid}
output: {topic: u.out, pseudonym: drop}
microaggregation: {k: 3}
attributes:
  age:    {role: quasi_identifier, type: numeric, method: microaggregation}
  region: {role: quasi_identifier, type: categorical, method: keep, unprotected: true,
           categories: [north, south]}
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [a, b, c, d]
    rr: {mode: uniform, retention: 0.75}
"""


def test_a_class_below_k_is_counted_and_logged_with_counts_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = policy_from_yaml(UNPROTECTED)
    with SQLiteStore(tmp_path / "s.db") as store:
        engine = Engine(policy, keyring=SECRET, store=store)
        worker = GatewayWorker(policy, WorkerSettings(metrics_port=0), engine)
        registry = CollectorRegistry()
        metrics = GatewayMetrics.create(registry)
        metrics.attach(worker)
        value = registry.get_sample_value
        assert value("privgw_k_claim_attributes", {"attribute": "age", "covered": "true"}) == 1
        assert value("privgw_k_claim_attributes", {"attribute": "region", "covered": "false"}) == 1
        assert value("privgw_key_smallest_class") is None  # nothing sampled yet
        # a sampled window as the engine reports it, had it published a class of 2 < k = 3
        # (the engine's own windows never do: that is what the counter watches for)
        broken = {
            "key_records": 10.0,
            "key_suppressed": 0.0,
            "key_unknown_class": 0.0,
            "key_smallest_class": 2.0,
            "key_share_below_k": 0.2,
            "key_uniques": 0.0,
            "ldiv_min:occ": 1.0,
            "ldiv_min:ghost": 1.0,  # not an attribute of the policy: never a label
        }
        report = dataclasses.replace(
            engine.protect_window([], now=0.0, flush_all=True).report,
            risk_sampled=True,
            measures=broken,
        )
        with caplog.at_level(logging.ERROR, logger="stream_jobs.ops.metrics"):
            metrics.observe(report, NO_FLUSH, 0.0)
            metrics.observe(dataclasses.replace(report, measures={}), NO_FLUSH, 0.0)
    assert value("privgw_key_class_violations_total") == 1
    assert value("privgw_key_smallest_class") == 2
    assert value("privgw_key_share_below_k_ratio") == pytest.approx(0.2)
    assert value("privgw_l_diversity_min", {"attribute": "occ"}) == 1
    assert value("privgw_l_diversity_min", {"attribute": "ghost"}) is None
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "whole-key violation: a sampled window published a quasi-identifier class of 2 < k = 3 "
        "respondents (2 records in classes below k)"
    ]


ALL_UNPROTECTED = UNPROTECTED.replace(
    "age:    {role: quasi_identifier, type: numeric, method: microaggregation}",
    "age:    {role: quasi_identifier, type: numeric, method: keep, unprotected: true}",
)


def test_no_k_claim_without_a_covered_attribute_and_the_below_k_gauge_is_always_there(
    tmp_path: Path,
) -> None:
    """Issue 32, item 7: with every quasi-identifier unprotected, /metrics showed privgw_k 5
    and no below-k gauge while every respondent was unique."""
    assert "unprotected: true" in ALL_UNPROTECTED.split("age:")[1].splitlines()[0]
    for text, covered in ((ALL_UNPROTECTED, 0), (UNPROTECTED, 1)):
        policy = policy_from_yaml(text)
        with SQLiteStore(tmp_path / f"s{covered}.db") as store:
            engine = Engine(policy, keyring=SECRET, store=store)
            worker = GatewayWorker(policy, WorkerSettings(metrics_port=0), engine)
            registry = CollectorRegistry()
            GatewayMetrics.create(registry).attach(worker)
            value = registry.get_sample_value
            assert value("privgw_k_claim_covered_attributes") == covered
            assert value("privgw_k") == (3 if covered else None)
            # before any sampled window: all published records unprotected, or none yet
            assert value("privgw_key_share_below_k_ratio") == (0.0 if covered else 1.0)
