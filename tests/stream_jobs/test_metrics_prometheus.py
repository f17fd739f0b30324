"""The worker's /metrics under a real Prometheus (Debian's ``prometheus``, DESIGN §8).

A worker runs in-process on the development broker, fed a simulated panel with canary values
and some bad records, exporting on a free loopback port; a real Prometheus scrapes it every
second and evaluates deploy/prometheus/alerts.yml. While the worker still runs, every PromQL
expression of the Grafana dashboard and of the alert rules is executed through Prometheus'
HTTP API and must return data.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from streamkit import (
    accounted,
    create_topics,
    make_worker,
    produce,
    regroup_policy_path,
    run_until,
    settings_for,
)

from gateway.policy import load_policy, parse_policy
from stream_jobs.commands.broker import EmbeddedBroker, free_port
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.ops.metrics import start_exporter

pytestmark = [pytest.mark.broker, pytest.mark.prometheus]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="needs Debian's prometheus package (scripts/test installs it as root)",
)

CANARY_ID = "CANARY-RESPONDENT-7f3e9c"
CANARY_CATEGORY = "CANARY-CATEGORY-51be0d"
CANARY_NUMBER = "123.456789"


def dashboard_exprs() -> list[str]:
    board = json.loads((DEPLOY / "grafana" / "dashboards" / "privgw.json").read_text())

    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    yield value
                else:
                    yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    return sorted(set(walk(board)))


def health_row() -> list[dict[str, Any]]:
    """The stat panels of the dashboard's Health row (up to the next row)."""
    board = json.loads((DEPLOY / "grafana" / "dashboards" / "privgw.json").read_text())
    panels = board["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Health")
    end = next(i for i, p in enumerate(panels) if p["type"] == "row" and i > start)
    return [p for p in panels[start + 1 : end] if p["type"] == "stat"]


def colour(panel: dict[str, Any], value: float) -> str:
    """The colour Grafana gives ``value`` by the panel's absolute thresholds (NaN: the base)."""
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    chosen = steps[0]["color"]
    for step in steps[1:]:
        if value >= step["value"]:  # False for NaN
            chosen = step["color"]
    return str(chosen)


def health_colours(base: str) -> dict[str, list[str]]:
    """Each Health-row panel's colours now, per target, as Prometheus evaluates them."""
    out: dict[str, list[str]] = {}
    for panel in health_row():
        for target in panel["targets"]:
            for sample in query(base, target["expr"]):
                out.setdefault(panel["title"], []).append(colour(panel, float(sample["value"][1])))
    return out


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def as_signal(expr: str) -> str:
    """An alert condition with every comparison turned into a ``bool`` comparison: it then
    returns a series whenever its metrics, labels and vector matchings exist, firing or not."""
    return re.sub(r"(?<![=!<>])(==|!=|>=|<=|>|<)(?![=~])", r"\1 bool", expr)


def query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", (expr, body)
    result = body["data"]["result"]
    return result if isinstance(result, list) else [result]


def start_prometheus(tmp: Path, target: str, rules: Path, interval: str = "1s") -> tuple[Any, str]:
    port = free_port()
    shutil.copy(rules, tmp / rules.name)
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [rules.name],
        "scrape_configs": [{"job_name": "privgw", "static_configs": [{"targets": [target]}]}],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    assert PROMETHEUS is not None
    with (tmp / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=1) as resp:
                if resp.status == 200:
                    return proc, base
        except OSError:
            pass
        assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "prometheus not ready in 30 s"
        time.sleep(0.1)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


@needs_prometheus
def test_every_dashboard_and_alert_expression_returns_data_from_a_live_worker(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    # the shipped policy (panel), its waves closed one second after the next wave arrives, so
    # the panel row of the dashboard has a decided wave to show
    data = yaml.safe_load((DEPLOY / "policies" / "adult.yaml").read_text())
    assert data["republication"]["mode"] == "panel", "the shipped policy changed: update this"
    data["republication"]["close_grace_seconds"] = 1
    policy = parse_policy(data)
    port = free_port()
    settings = settings_for(
        broker.bootstrap,
        unique_name,
        tmp_path / "state",
        metrics_port=port,
        partitions=2,
        lag_interval_seconds=0.5,
    )
    topics = settings.topics(policy)
    create_topics(policy, settings)
    panel = list(PanelSurvey(respondents=900, waves=2, seed=5, rows=load_rows()).records())
    canaries = [dict(panel[i], respondent_id=f"{CANARY_ID}-{i}") for i in range(8)]
    canaries[0]["hours_per_week"] = float(CANARY_NUMBER)
    bad = [dict(panel[0], respondent_id=f"{CANARY_ID}-bad", occupation=CANARY_CATEGORY)]
    first = [encode(r) for r in panel[:900] + canaries]
    second = [encode(r) for r in panel[900:] + bad] + [(b"k", b"{broken " + CANARY_ID.encode())]
    total = len(first) + len(second)
    worker = make_worker(policy, settings, secret_env)
    metrics = start_exporter(worker, settings, store=worker.state_store)
    assert metrics is not None
    prom, base = start_prometheus(
        tmp_path, f"127.0.0.1:{port}", DEPLOY / "prometheus" / "alerts.yml"
    )
    results: dict[str, list[dict[str, Any]]] = {}
    texts: list[str] = []
    finished: list[bool] = []
    firing: list[dict[str, Any]] = []
    colours: dict[str, list[str]] = {}

    def scenario() -> None:
        produce(broker.bootstrap, topics.input, first)
        time.sleep(2.5)  # several scrapes between the two bursts: rates and histograms move
        produce(broker.bootstrap, topics.input, second)
        deadline = time.monotonic() + 60
        while not accounted(worker, total):
            assert time.monotonic() < deadline, "worker did not account for every record"
            time.sleep(0.1)
        # Prometheus has scraped the final counts
        while True:
            got = query(base, "privgw_records_consumed_total")
            if got and float(got[0]["value"][1]) >= total:
                break
            assert time.monotonic() < deadline, "prometheus never saw the final count"
            time.sleep(0.2)
        while "privgw_panel_weight_design_effect" not in scrape(port):  # wave 1 decided
            assert time.monotonic() < deadline, "wave 1 was never decided"
            time.sleep(0.2)
        time.sleep(2.0)  # a few more scrapes and rule evaluations
        idle_since = time.time()
        while metric_sum(scrape(port), "privgw_lag_measured_timestamp_seconds") < idle_since:
            assert time.monotonic() < deadline + 30, "the lag was not measured again"
            time.sleep(0.2)
        texts.append(scrape(port))
        for expr in dashboard_exprs():
            results[expr] = query(base, expr)
        for rule in alert_rules():
            results[rule["alert"]] = query(base, as_signal(rule["expr"]))
        firing.extend(query(base, 'ALERTS{alertstate="firing"}'))
        colours.update(health_colours(base))
        finished.append(True)

    try:
        code = asyncio.run(run_until(worker, lambda w: bool(finished), during=scenario))
    finally:
        prom.terminate()
        prom.wait(10)
    assert code == 0
    assert finished, "the scenario did not finish"

    empty = sorted(name for name, result in results.items() if not result)
    assert not empty, f"no data for: {empty}"
    assert len(results) == len(dashboard_exprs()) + len(alert_rules())
    assert not firing, "a healthy worker raised alerts"
    assert len(colours) == len(health_row())
    assert not [t for t, c in colours.items() if "red" in c], colours

    text = texts[0]
    # promtool's linter has nothing to say about names, units and types
    assert PROMTOOL is not None
    lint = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), (
        lint.stdout + lint.stderr
    )
    # the leakage check: no canary id, category or value in the exposition
    for canary in (CANARY_ID, CANARY_CATEGORY, CANARY_NUMBER, "RESPONDENT", "CANARY"):
        assert canary not in text
    # figures agree with what happened
    assert f"privgw_records_consumed_total {float(total)}" in text
    assert 'privgw_records_dlq_total{reason="unknown_category"} 1.0' in text
    assert 'privgw_records_dlq_total{reason="invalid_json"} 1.0' in text
    assert "privgw_k_violations_total 0.0" in text
    # idle and keeping up, with the open wave held (pool: release): the lag is all held on
    # purpose, none of it behind, nothing waits undecided, and the hold has a deadline
    held = metric_sum(text, "privgw_records_held")
    assert held > 0, "the last wave is held until it closes or max_hold_seconds"
    assert metric_sum(text, "privgw_consumer_lag_behind_records") == 0
    lag = metric_sum(text, "privgw_consumer_lag_records")
    assert metric_sum(text, "privgw_consumer_lag_held_records") == lag >= held
    assert metric_sum(text, "privgw_oldest_undecided_age_seconds") == 0
    until = metric_sum(text, "privgw_hold_deadline_timestamp_seconds")
    # a panel wave is decided at its maximum at the latest, never by the hold time
    assert time.time() + policy.window.max_hold_seconds < until
    assert until < time.time() + policy.republication.max_wave
    print(
        f"idle with a wave open: consumer lag {lag:.0f} = {lag:.0f} held on purpose + 0 behind "
        f"({held:.0f} records held, released at the latest {until - time.time():.0f} s later)"
    )


def metric_sum(text: str, name: str) -> float:
    """The sum of a metric's samples in an exposition (0 without any)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name} ", f"{name}{{"))
    )


@needs_prometheus
def test_k_violation_and_dead_letter_alerts_fire_in_a_real_prometheus(tmp_path: Path) -> None:
    """The alert rules as shipped, against an exporter that reports a k-violation, a published
    class below k and a 30% dead-letter share. ``for:`` durations are shortened to 0 s here
    (promtool's unit tests in deploy/prometheus/alerts_test.yml cover the timing); expressions
    are unchanged."""
    from prometheus_client import CollectorRegistry, Counter, start_http_server  # noqa: PLC0415

    registry = CollectorRegistry()
    violations = Counter("privgw_k_violations", "windows below k", registry=registry)
    classes = Counter("privgw_key_class_violations", "classes below k", registry=registry)
    consumed = Counter("privgw_records_consumed", "consumed", registry=registry)
    dlq = Counter("privgw_records_dlq", "dead letters", ["reason"], registry=registry)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    fast = tmp_path / "rules"
    fast.mkdir()
    (fast / "alerts.yml").write_text(yaml.safe_dump(rules))
    prom, base = start_prometheus(tmp_path, f"127.0.0.1:{port}", fast / "alerts.yml")
    try:
        deadline = time.monotonic() + 60
        firing: set[str] = set()
        expected = {
            "PrivgwKAnonymityViolation",
            "PrivgwPublishedClassBelowK",
            "PrivgwDeadLetterShareHigh",
        }
        while expected - firing:
            assert time.monotonic() < deadline, f"alerts firing after 60 s: {firing}"
            consumed.inc(100)
            dlq.labels("invalid_json").inc(30)
            if time.monotonic() > deadline - 55:
                violations.inc()
                classes.inc()
            with urllib.request.urlopen(f"{base}/api/v1/alerts", timeout=5) as resp:
                alerts = orjson.loads(resp.read())["data"]["alerts"]
            firing = {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}
            time.sleep(0.5)
        assert "PrivgwWorkerDown" not in firing
    finally:
        prom.terminate()
        prom.wait(10)
        server.shutdown()
        server.server_close()


def http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def lag_total(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("privgw_consumer_lag_records{")
    )


@needs_prometheus
def test_a_stopped_engine_is_seen_stalled_alerted_and_recovers(
    broker: EmbeddedBroker,
    unique_name: str,
    secret_env: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The engine's child process is stopped (SIGSTOP) while windows arrive: /healthz turns
    503, privgw_stalled 1, PrivgwWorkerStalled fires in a real Prometheus, the lag measured
    apart from the loop shows the waiting records, a WARNING is logged; after SIGCONT all of
    it recovers and every record is accounted for. ``for:`` is shortened to 0 s (promtool's
    unit test covers the timing), the stall timeout to 2 s."""
    policy = load_policy(regroup_policy_path())
    port = free_port()
    settings = settings_for(
        broker.bootstrap,
        unique_name,
        tmp_path / "state",
        metrics_port=port,
        partitions=2,
        engine="process",
        stall_timeout_seconds=2.0,
        lag_interval_seconds=0.5,
    )
    topics = settings.topics(policy)
    create_topics(policy, settings)
    panel = [encode(r) for r in PanelSurvey(respondents=600, waves=2, seed=6).records()]
    first, second = panel[:600], panel[600:]
    worker = make_worker(policy, settings, secret_env)
    assert start_exporter(worker, settings, store=worker.state_store) is not None
    assert http_status(port, "/readyz") == 503  # not started: no partitions yet
    assert http_status(port, "/nope") == 404
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    fast = tmp_path / "rules"
    fast.mkdir()
    (fast / "alerts.yml").write_text(yaml.safe_dump(rules))
    prom, base = start_prometheus(tmp_path, f"127.0.0.1:{port}", fast / "alerts.yml")
    seen: dict[str, Any] = {}
    finished: list[bool] = []
    caplog.set_level(logging.INFO, logger="stream_jobs.ops.monitor")

    def firing() -> set[str]:
        with urllib.request.urlopen(f"{base}/api/v1/alerts", timeout=5) as resp:
            alerts = orjson.loads(resp.read())["data"]["alerts"]
        return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}

    def wait(what: str, cond: Any, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"{what} not seen in {timeout:.0f} s"
            time.sleep(0.2)

    def scenario() -> None:
        produce(broker.bootstrap, topics.input, first)
        wait("first records published", lambda: worker.stats.windows > 0)
        wait("ready", lambda: http_status(port, "/readyz") == 200)
        seen["healthy"] = http_status(port, "/healthz")
        pid = worker.engine.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            produce(broker.bootstrap, topics.input, second)
            wait("/healthz 503", lambda: http_status(port, "/healthz") == 503)
            seen["ready_while_stalled"] = http_status(port, "/readyz")
            wait("the stall alert", lambda: "PrivgwWorkerStalled" in firing())
            wait("lag measured", lambda: lag_total(scrape(port)) >= len(second))
            # the waiting records are behind (not decided), and their delay grows
            behind = "privgw_consumer_lag_behind_records"
            wait("lag behind", lambda: metric_sum(scrape(port), behind) >= len(second))
            delay = "privgw_oldest_undecided_age_seconds"
            ages = [metric_sum(scrape(port), delay)]
            time.sleep(1.0)
            text = scrape(port)
            ages.append(metric_sum(text, delay))
            seen["delay_grows"] = 0 < ages[0] < ages[1]
            seen["stalled_metric"] = "privgw_stalled 1.0" in text
            seen["consumed_while_stalled"] = worker.stats.consumed
        finally:
            os.kill(pid, signal.SIGCONT)
        wait("/healthz 200 again", lambda: http_status(port, "/healthz") == 200)
        wait("all records", lambda: accounted(worker, len(panel)))
        wait("the alert resolved", lambda: "PrivgwWorkerStalled" not in firing())
        wait("lag back to the held records", lambda: lag_total(scrape(port)) <= worker.stats.held)
        seen["stalled_after"] = "privgw_stalled 0.0" in scrape(port)
        finished.append(True)

    try:
        code = asyncio.run(
            run_until(worker, lambda w: bool(finished), during=scenario, timeout=120)
        )
    finally:
        prom.terminate()
        prom.wait(10)
    assert code == 0 and finished
    assert seen["healthy"] == 200
    assert seen["ready_while_stalled"] == 503
    assert seen["stalled_metric"] and seen["stalled_after"]
    assert seen["delay_grows"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("worker stalled: a window has been in the engine" in m for m in warnings), warnings
    assert sum("worker stalled" in m for m in warnings) == 1  # once per stall, not per check
    assert any("progressing again" in r.getMessage() for r in caplog.records)
