"""A lost broker seen whatever the traffic (issue 30, item 1): `privgw run` as a real process
against its own development broker, which is stopped and started again.

* idle input: /readyz turns 503 (and ``privgw_ready`` 0, ``privgw_broker_reachable`` 0, the
  lag NaN) within the stall timeout of losing the broker, /healthz stays 200 (waiting out a
  broker is not a stall: a restart would not help), the log holds at most one Kafka client
  line per PRIVGW_CLIENT_LOG_INTERVAL_SECONDS; the broker back, /readyz is 200 again;
* SIGTERM during an outage with records consumed but not committed: the worker exits within
  its grace period with 75 and a line naming the offsets it left for the next start.

Plus the pieces alone: the rate limiter, the broker verdict's timing, the give-up deadline.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from streamkit import create_input_topic, produce, small_window_policy, start_worker
from test_metrics_prometheus import (
    dashboard_exprs,
    health_colours,
    needs_prometheus,
    query,
    start_prometheus,
)

from gateway.policy import load_policy
from stream_jobs.commands.broker import EmbeddedBroker, free_port
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.kafka import ensure_topics
from stream_jobs.ops.broker_watch import BrokerTiming, BrokerWatch
from stream_jobs.ops.client_log import ClientLogLimiter
from stream_jobs.settings import WorkerSettings
from stream_jobs.shutdown import EXIT_BROKER_AWAY, BrokerAway, StopDeadline, give_up_after

STALL_S = 6.0
RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
PERIOD_S = 3.0


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()
    except urllib.error.URLError:  # not listening yet
        return 0, ""


def _metric(text: str, name: str) -> list[float]:
    return [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name} ", f"{name}{{"))
    ]


def _wait(what: str, cond: object, timeout: float, worker: object, log: Path) -> float:
    t0 = time.monotonic()
    while not cond():  # type: ignore[operator]
        assert worker.poll() is None, log.read_text()[-3000:]  # type: ignore[attr-defined]
        assert time.monotonic() - t0 < timeout, f"{what} within {timeout:.0f} s"
        time.sleep(0.1)
    return time.monotonic() - t0


def _client_lines(log: Path) -> list[float]:
    """Times (s) of the log's Kafka client lines at WARNING or worse, and of their summaries."""
    stamp = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) (WARNING|ERROR|CRITICAL) (\S+):")
    times = []
    for line in log.read_text().splitlines():
        m = stamp.match(line)
        if m and m.group(4).startswith(("aiokafka", "stream_jobs.kafka_client")):
            t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1e3
            times.append(t)
    return times


def _env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)


@pytest.mark.broker
def test_a_broker_lost_under_an_idle_input_turns_readyz_503_and_back(
    unique_name: str, secret_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(
        monkeypatch,
        PRIVGW_STALL_TIMEOUT_SECONDS=str(STALL_S),
        PRIVGW_CLIENT_LOG_INTERVAL_SECONDS=str(PERIOD_S),
        PRIVGW_LAG_INTERVAL_SECONDS="1",
    )
    policy = small_window_policy(tmp_path, 500)
    broker = EmbeddedBroker(log_dir=tmp_path / "broker").start()
    port = free_port()
    log = tmp_path / "worker.log"
    worker = start_worker(
        broker.bootstrap, unique_name, policy, tmp_path / "state", log,
        "--metrics-port", str(port),
    )  # fmt: skip
    try:
        _wait("ready", lambda: _get(port, "/readyz")[0] == 200, 60, worker, log)
        time.sleep(1.5)  # the lag measured once
        assert _metric(_get(port, "/metrics")[1], "privgw_consumer_lag_records") == [0, 0, 0]
        broker.stop()
        t_down = time.monotonic()
        _wait("/readyz 503", lambda: _get(port, "/readyz")[0] == 503, STALL_S, worker, log)
        detected = time.monotonic() - t_down
        status, why = _get(port, "/readyz")
        assert status == 503 and "broker has not answered" in why, why
        assert _get(port, "/healthz")[0] == 200, "waiting for the broker is not a stall"
        text = _get(port, "/metrics")[1]
        assert _metric(text, "privgw_ready") == [0]
        assert _metric(text, "privgw_broker_reachable") == [0]
        lags = _metric(text, "privgw_consumer_lag_records")
        assert lags and all(math.isnan(v) for v in lags), "lag must be unknown, not stale"
        time.sleep(3 * PERIOD_S)  # the client keeps failing meanwhile
        assert _get(port, "/healthz")[0] == 200
        broker.start()  # same port, empty: the topics are recreated as an operator would
        settings = WorkerSettings(
            bootstrap=broker.bootstrap,
            input_topic=f"{unique_name}.in",
            output_topic=f"{unique_name}.out",
            partitions=3,
            replication_factor=1,
        )
        asyncio.run(ensure_topics(settings, settings.topics(load_policy(policy)), input_too=True))
        back = _wait("/readyz 200 again", lambda: _get(port, "/readyz")[0] == 200, 60, worker, log)
        assert _metric(_get(port, "/metrics")[1], "privgw_broker_reachable") == [1]
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        broker.stop()
    text = log.read_text()
    assert text.count("broker unreachable: no answer from") == 1, text[-3000:]
    assert "broker answering again after" in text
    lines = _client_lines(log)
    gaps = [b - a for a, b in itertools.pairwise(lines)]
    # one line per period at most (log stamps have millisecond resolution)
    assert all(gap >= PERIOD_S - 0.01 for gap in gaps), (lines, text[-4000:])
    print(
        f"idle broker loss: /readyz 503 {detected:.1f} s after the broker stopped (stall "
        f"timeout {STALL_S:g} s), 200 again {back:.1f} s after it came back; "
        f"{len(lines)} Kafka client log lines over the outage"
    )


@pytest.mark.broker
@pytest.mark.prometheus
@needs_prometheus
def test_a_broker_outage_turns_the_dashboards_health_row_red(
    unique_name: str, secret_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real Prometheus scrapes `privgw run` and evaluates the dashboard's Health row: green
    with the broker, "Stream health", "Ready" and "Broker reachable" red within the stall
    timeout of losing it (the exporter still answers, so "Workers up" alone stays green), green
    again once it is back, red again once the worker is gone. The lag panel says the lag is
    unknown rather than go blank."""
    _env(monkeypatch, PRIVGW_STALL_TIMEOUT_SECONDS=str(STALL_S), PRIVGW_LAG_INTERVAL_SECONDS="1")
    policy = small_window_policy(tmp_path, 500)
    broker = EmbeddedBroker(log_dir=tmp_path / "broker").start()
    port = free_port()
    log = tmp_path / "worker.log"
    worker = start_worker(
        broker.bootstrap, unique_name, policy, tmp_path / "state", log,
        "--metrics-port", str(port),
    )  # fmt: skip
    prom, base = start_prometheus(tmp_path, f"127.0.0.1:{port}", RULES)

    def red() -> set[str]:
        return {title for title, colours in health_colours(base).items() if "red" in colours}

    try:
        _wait("ready", lambda: _get(port, "/readyz")[0] == 200, 60, worker, log)
        _wait("the Health row green", lambda: not red() and health_colours(base), 30, worker, log)
        assert health_colours(base)["Stream health"] == ["green"]
        broker.stop()
        t_down = time.monotonic()
        _wait("the Health row red", lambda: "Stream health" in red(), STALL_S + 5, worker, log)
        turned = time.monotonic() - t_down
        assert {"Stream health", "Ready (/readyz)", "Broker reachable"} <= red(), red()
        assert "Workers up" not in red()  # the exporter answers: up alone says nothing
        # the lag panel is not blank: it counts the partitions whose lag is unknown
        (unknown,) = [e for e in dashboard_exprs() if "lag_records != " in e]
        _wait(
            "the lag unknown", lambda: query(base, unknown)[0]["value"][1] == "3", 10, worker, log
        )
        broker.start()
        settings = WorkerSettings(
            bootstrap=broker.bootstrap,
            input_topic=f"{unique_name}.in",
            output_topic=f"{unique_name}.out",
            partitions=3,
            replication_factor=1,
        )
        asyncio.run(ensure_topics(settings, settings.topics(load_policy(policy)), input_too=True))
        _wait("the Health row green again", lambda: not red(), 60, worker, log)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        deadline = time.monotonic() + 10  # a worker that cannot be scraped is red too
        while "Stream health" not in red():
            assert time.monotonic() < deadline, health_colours(base)
            time.sleep(0.2)
    finally:
        prom.terminate()
        prom.wait(10)
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        broker.stop()
    print(f"broker outage: the dashboard's Health row red {turned:.1f} s after the broker stopped")


@pytest.mark.broker
def test_sigterm_during_an_outage_exits_within_the_grace_period_naming_what_is_left(
    unique_name: str, secret_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records consumed into a window that is not due yet (30 s timer), then the broker goes
    and SIGTERM follows before the worker has noticed: the shutdown flush cannot be
    acknowledged; the worker gives up within the grace period and exits 75, naming the
    offsets it left uncommitted."""
    grace = 10.0
    _env(monkeypatch, PRIVGW_SHUTDOWN_GRACE_SECONDS=str(grace), PRIVGW_LAG_INTERVAL_SECONDS="1")
    policy = tmp_path / "policy.yaml"
    root = Path(__file__).resolve().parents[2]
    text = (root / "deploy" / "policies" / "adult.yaml").read_text()
    window = "max_seconds: 2, max_idle_seconds: 0.25,"
    assert window in text, "the Adult policy's window changed: update this test"
    policy.write_text(text.replace(window, "max_seconds: 30,"))  # nor closed when quiet
    broker = EmbeddedBroker(log_dir=tmp_path / "broker").start()
    port = free_port()
    log = tmp_path / "worker.log"
    create_input_topic(broker.bootstrap, f"{unique_name}.in", partitions=3)
    worker = start_worker(
        broker.bootstrap, unique_name, policy, tmp_path / "state", log,
        "--metrics-port", str(port),
    )  # fmt: skip
    panel = PanelSurvey(respondents=300, waves=1, seed=3, rows=load_rows())
    try:
        _wait("ready", lambda: _get(port, "/readyz")[0] == 200, 60, worker, log)
        produce(broker.bootstrap, f"{unique_name}.in", [encode(r) for r in panel.records()])
        _wait(
            "300 consumed",
            lambda: _metric(_get(port, "/metrics")[1], "privgw_records_consumed_total") == [300],
            30,
            worker,
            log,
        )
        broker.stop()
        worker.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        code = worker.wait(grace + 5)
        took = time.monotonic() - t0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        broker.stop()
    out = log.read_text()
    assert code == EXIT_BROKER_AWAY, out[-3000:]
    assert took < grace, f"exit took {took:.1f} s, past the {grace:g} s grace period"
    left = re.search(r"stopped without the broker: (\d+) records \(([^)]*)\)", out)
    assert left is not None, out[-3000:]
    assert int(left.group(1)) == 300
    assert f"{unique_name}.in/0 offsets 0-" in left.group(2)
    assert "Traceback" not in out and "internal error" not in out
    # issue 45, item 9: a client's stop cut short left its own tasks pending, to be destroyed
    assert "Task was destroyed" not in out, out[-3000:]
    print(f"SIGTERM during an outage: exit {code} after {took:.1f} s (grace {grace:g} s)")


# -- the pieces ------------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_limiter_logs_one_line_per_period_with_the_count() -> None:
    clock = _Clock()
    out = logging.getLogger("test.client_log")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    out.addHandler(keep)
    out.propagate = False
    root = logging.getLogger()
    root.addHandler(keep)
    try:
        limiter = ClientLogLimiter(10.0, clock=clock, out=out)
        error = logging.getLogger("aiokafka.conn")

        def fail(msg: str) -> None:
            limiter.handle(error.makeRecord(error.name, logging.ERROR, "x", 1, msg, (), None))

        fail("first")  # passes as it is
        for i in range(500):  # counted
            clock.now += 0.01
            fail(f"again {i}")
        assert [r.getMessage() for r in records] == ["first"]
        clock.now = 10.5
        limiter.flush_summary()  # the period is over: its count
        assert len(records) == 2
        assert "500 more warnings and errors" in records[1].getMessage()
        assert "again 499" in records[1].getMessage()
        clock.now = 15.0
        fail("within the summary's period")
        limiter.flush_summary()
        assert len(records) == 2
        clock.now = 21.0
        fail("after it")  # carries the last period's count with it: still one line
        assert len(records) == 3 and "1 more" in records[2].getMessage()
        assert "after it" in records[2].getMessage()
        clock.now = 40.0
        limiter.flush_summary()  # nothing counted since: the spell is over, nothing logged
        fail("a new spell")
        assert records[-1].getMessage() == "a new spell"
        info = error.makeRecord(error.name, logging.INFO, "x", 1, "joined", (), None)
        limiter.handle(info)  # below WARNING: never counted
        assert records[-1].getMessage() == "joined"
    finally:
        root.removeHandler(keep)


def test_the_broker_verdict_comes_within_the_stall_timeout() -> None:
    for stall in (2.0, 6.0, 30.0, 300.0):
        timing = BrokerTiming.for_stall_timeout(stall, lag_interval=5.0)
        # the last answer at most one interval before the loss, then `timeout` of silence
        assert timing.interval + timing.timeout < stall
    clock = _Clock()
    watch = BrokerWatch(BrokerTiming(interval=1, timeout=3), clock=clock)
    clock.now = 3.0
    assert watch.reachable()
    clock.now = 3.5
    assert not watch.reachable() and watch.silent_for() == 3.5
    watch.answered()
    assert watch.reachable() and watch.silent_for() == 0


def test_a_stop_gives_up_on_the_broker_at_once_when_it_is_away_else_later() -> None:
    assert give_up_after(30) == 22 and give_up_after(10) == 5

    async def main() -> None:
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        away = StopDeadline()
        away.arm(30, broker_reachable=lambda: False)
        with pytest.raises(BrokerAway):
            await away.race(never)
        assert never.cancelled()
        later = StopDeadline()
        later.arm(0.4, broker_reachable=lambda: True)  # gives up after 0.2 s
        assert await later.race(asyncio.sleep(0.05, "done")) == "done"
        t0 = time.monotonic()
        with pytest.raises(BrokerAway):
            await later.race(asyncio.sleep(30))
        assert time.monotonic() - t0 < 1
        later.close()
        reachable = [True]
        polled = StopDeadline()
        polled.arm(30, broker_reachable=lambda: reachable[0])
        waiting = asyncio.ensure_future(polled.race(asyncio.sleep(30)))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        reachable[0] = False  # the monitor's verdict: given up at the next poll
        t0 = time.monotonic()
        with pytest.raises(BrokerAway):
            await waiting
        assert time.monotonic() - t0 < 0.5
        polled.close()

    asyncio.run(main())
