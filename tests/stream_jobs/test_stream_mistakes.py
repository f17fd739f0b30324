"""Stream-side mistakes, as a user makes them: each ends quickly in exit 2 and one line naming
the setting and the fix (never `internal error`, never a silent wait)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import clikit
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from streamkit import create_input_topic, high_watermarks

from stream_jobs.commands.broker import EmbeddedBroker, free_port
from stream_jobs.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"


def privgw(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """(exit code, stderr, seconds) of `privgw ARGS` in a fresh process."""
    t0 = time.monotonic()
    proc = clikit.privgw(*args, env=env or {}, timeout=120)
    return proc.returncode, proc.stderr, time.monotonic() - t0


def assert_one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("privgw: error: ")]
    assert len(errors) == 1, err[-3000:]
    assert "internal error" not in err and "Traceback" not in err
    for needle in needles:
        assert needle in errors[0], errors[0]


def run_args(tmp_path: Path, bootstrap: str, *extra: str) -> list[str]:
    return [
        "run",
        "--policy",
        str(POLICY),
        "--bootstrap",
        bootstrap,
        "--state-dir",
        str(tmp_path / "state"),
        "--metrics-port",
        "0",
        *extra,
    ]


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never says anything."""
    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except TimeoutError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[int]:
    srv = HTTPServer(("127.0.0.1", 0), _Hello)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()
    t.join()


def test_connection_refused_names_bootstrap(tmp_path: Path, secret_env: str) -> None:
    port = free_port()
    code, err, took = privgw(*run_args(tmp_path, f"127.0.0.1:{port}"))
    assert_one_line(code, err, f"--bootstrap 127.0.0.1:{port}", "connection refused")
    assert took < 30
    code, err, _ = privgw("simulate", "--bootstrap", f"127.0.0.1:{port}")
    assert_one_line(code, err, "--bootstrap", "connection refused")


def test_an_unknown_host_names_bootstrap(tmp_path: Path, secret_env: str) -> None:
    code, err, _ = privgw(*run_args(tmp_path, "no-such-host.invalid:9092"))
    assert_one_line(code, err, "--bootstrap no-such-host.invalid:9092", "unknown host")


@pytest.mark.parametrize("server", ["silent_server", "http_server"])
def test_a_port_that_is_not_kafka_is_named_within_the_probe_timeout(
    tmp_path: Path, secret_env: str, server: str, request: pytest.FixtureRequest
) -> None:
    port = request.getfixturevalue(server)
    assert WorkerSettings().probe_timeout_s <= 10  # the default bound on the wait
    code, err, took = privgw(
        *run_args(tmp_path, f"127.0.0.1:{port}"), env={"PRIVGW_PROBE_TIMEOUT_S": "2"}
    )
    assert_one_line(code, err, f"--bootstrap 127.0.0.1:{port}", "is it a Kafka listener")
    assert took < 2 + 20  # the probe's bound plus the start of a Python process


def test_a_metrics_port_in_use_is_named(
    tmp_path: Path, secret_env: str, broker: EmbeddedBroker
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        args = run_args(tmp_path, broker.bootstrap)
        args[args.index("--metrics-port") + 1] = str(port)
        code, err, _ = privgw(*args)
    assert_one_line(
        code, err, f"--metrics-port {port} (PRIVGW_METRICS_PORT)", "already in use", "free port"
    )


def test_an_output_topic_that_is_the_input_topic_is_refused(
    tmp_path: Path, secret_env: str, broker: EmbeddedBroker
) -> None:
    code, err, _ = privgw(
        *run_args(tmp_path, broker.bootstrap, "--output-topic", "survey.responses")
    )
    assert_one_line(code, err, "output topic (--output-topic", "same topic as input topic")


def test_an_input_topic_deleting_records_before_their_wave_closes_is_refused(
    tmp_path: Path, secret_env: str, broker: EmbeddedBroker, unique_name: str
) -> None:
    """A panel keeps a wave's records unpublished, and uncommitted, for up to a week; a topic
    keeping them three days loses them at a restart after that. Refused before anything is
    written to the state directory."""
    topic = f"{unique_name}.in"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {"retention.ms": str(3 * 86_400_000)}
    for future in admin.create_topics([NewTopic(topic, 1, 1, config=config)]).values():
        future.result(30)
    code, err, _ = privgw(*run_args(tmp_path, broker.bootstrap, "--input-topic", topic))
    assert_one_line(
        code, err, f"topic {topic} deletes records after 3 days", "republication.max_wave_seconds"
    )
    assert not (tmp_path / "state").exists()


def test_reconstruct_a_missing_topic_says_so(broker: EmbeddedBroker, unique_name: str) -> None:
    topic = f"{unique_name}.nope"
    code, err, took = privgw("reconstruct", "--bootstrap", broker.bootstrap, "--topic", topic)
    assert_one_line(code, err, f"topic {topic} does not exist", "--bootstrap")
    assert took < 30


@pytest.mark.parametrize("role", ["dlq_topic", "meta_topic"])
def test_a_topic_on_the_group_changelog_is_refused(
    role: str, tmp_path: Path, secret_env: str, broker: EmbeddedBroker
) -> None:
    """Issue 32, item 3: ``output.dlq_topic: g.state-changelog`` with ``--group-id g`` sent raw
    dead letters into the partitioned backend's changelog (and into RocksDB files)."""
    text = POLICY.read_text()
    old = "output:\n"
    assert old in text, "the Adult policy's output section changed: update this test"
    policy = tmp_path / "policy.yaml"
    policy.write_text(text.replace(old, f"output:\n  {role}: g.state-changelog\n", 1))
    args = run_args(tmp_path, broker.bootstrap, "--group-id", "g", "--state-backend", "partitioned")
    args[args.index("--policy") + 1] = str(policy)
    code, err, _ = privgw(*args)
    assert_one_line(code, err, "changelog topic", "g.state-changelog", "give each its own topic")
    # issue 45, item 9: the metadata case spoke of "raw dead letters"
    mixed = {"dlq_topic": "the raw dead letters", "meta_topic": "the policy metadata"}[role]
    assert f"they would mix with {mixed}" in err, err


def test_reconstruct_from_an_unreachable_bootstrap_is_one_line() -> None:
    """Issue 32, item 9: was "internal error (KafkaConnectionError)", exit 70."""
    code, err, _ = privgw("reconstruct", "--bootstrap", "127.0.0.1:1", "--topic", "t")
    assert_one_line(code, err, "--bootstrap 127.0.0.1:1")
    assert "internal error" not in err


def test_state_check_on_a_file_that_is_not_a_database_is_one_line(tmp_path: Path) -> None:
    """Issue 32, item 9: was "internal error (DatabaseError)", exit 70."""
    (tmp_path / "state.db").write_text("not a database\n")
    code, err, _ = privgw("state-check", "--state-dir", str(tmp_path))
    assert_one_line(code, err, "state.db: corrupt database (SQLITE_NOTADB)")


@pytest.mark.parametrize("after", [0.3, 1.0, 2.0, 4.0])
def test_sigterm_at_any_moment_of_the_start_exits_cleanly(
    after: float, tmp_path: Path, secret_env: str, broker: EmbeddedBroker, unique_name: str
) -> None:
    """Issue 32, item 9: SIGTERM in the first ~2 s ended with the signal (rc -15)."""
    create_input_topic(broker.bootstrap, f"{unique_name}.in", partitions=1)
    args = run_args(tmp_path, broker.bootstrap, "--input-topic", f"{unique_name}.in")
    args += ["--output-topic", f"{unique_name}.out", "--group-id", f"{unique_name}-g"]
    log = tmp_path / "log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PRIVGW_SESSION_TIMEOUT_MS="3000"),
        )
        time.sleep(after)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, log.read_text()[-2000:]
    assert "Traceback" not in log.read_text()


def test_simulate_says_the_broker_went_away_and_exits_75(tmp_path: Path) -> None:
    """Issue 45, item 9: a broker lost in the middle of `privgw simulate` ended in "internal
    error (NodeNotReadyError)", exit 70. Its own broker: this one is stopped."""
    with EmbeddedBroker(log_dir=tmp_path / "broker") as own:
        create_input_topic(own.bootstrap, "sim.in", partitions=3)
        cmd = ["simulate", "--bootstrap", own.bootstrap, "--topic", "sim.in"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", *cmd, "--rate", "200/s", "--waves", "50"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            deadline = time.monotonic() + 60
            while high_watermarks(own.bootstrap, "sim.in") < 100:  # sending
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            own.stop()
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 75, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("privgw: error: ")]
    assert len(errors) == 1 and "internal error" not in err, err[-3000:]
    assert f"the broker at {own.bootstrap} stopped answering after" in errors[0]
    assert "run simulate again once the broker is back" in errors[0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("simulate", "--respondents", "-1"), "--respondents must be ≥ 1, got -1"),
        (("simulate", "--waves", "0"), "--waves must be ≥ 1, got 0"),
        (("simulate", "--seed", "-1"), "--seed must be a whole number ≥ 0, got -1"),
        (("simulate", "--new-share", "-1"), "--new-share must be a share in [0, 1]"),
        (("simulate", "--change-share", "nan"), "--change-share must be a share in [0, 1]"),
        (("demo", "--waves", "0"), "--waves must be ≥ 1, got 0"),
        (("demo", "--seed", "-1"), "--seed must be a whole number ≥ 0, got -1"),
    ],
)
def test_a_bad_simulation_setting_is_named_before_any_broker(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    """They ended as internal errors (a negative count or seed, a share below 0) or ran on,
    sending nothing (0 waves) or a survey with shares beyond 1."""
    where = ["--bootstrap", f"127.0.0.1:{free_port()}"] if args[0] == "simulate" else []
    where += ["--data-dir", str(tmp_path)] if args[0] == "demo" else []
    code, err, _ = privgw(*args, *where)
    assert_one_line(code, err, said)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda d: d / "missing.csv", "missing.csv: No such file or directory"),
        (lambda d: d, "Is a directory"),
        (lambda d: _write(d / "other.csv", "a,b\n1,2\n"), "no column age, capital_gain"),
        (lambda d: _write(d / "latin.csv", "age\n\xe9\n", "latin-1"), "not UTF-8 text"),
        (lambda d: _adult_with(d, "Zq9x"), "column 'age' is not a whole number at data row 2"),
    ],
)
def test_simulate_data_it_cannot_read_is_named(
    tmp_path: Path, make: Callable[[Path], Path], said: str
) -> None:
    """`privgw simulate --data` ended in "internal error" (FileNotFoundError, KeyError) before
    any broker was asked."""
    code, err, _ = privgw("simulate", "--data", str(make(tmp_path)), "--bootstrap", "127.0.0.1:1")
    assert_one_line(code, err, "--data", said)
    assert "Zq9x" not in err


def _write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_text(text, encoding=encoding)
    return path


def _adult_with(directory: Path, age: str) -> Path:
    lines = (ROOT.parent / "shared" / "data" / "adult.csv").read_text().splitlines()[:4]
    lines[2] = age + lines[2][lines[2].index(",") :]
    return _write(directory / "adult.csv", "\n".join(lines) + "\n")


def test_a_topic_name_kafka_refuses_is_named_before_any_broker_is_asked(
    tmp_path: Path, secret_env: str
) -> None:
    """A development broker creates 'a b' where Kafka refuses it; either way the worker would
    wait on a topic nobody writes. Refused as the setting is read (the port has no broker)."""
    port = free_port()
    code, err, _ = privgw(*run_args(tmp_path, f"127.0.0.1:{port}", "--input-topic", "a b"))
    assert_one_line(code, err, "PRIVGW_INPUT_TOPIC (--input-topic): must be 1 to 249")
    code, err, _ = privgw("simulate", "--bootstrap", f"127.0.0.1:{port}", "--topic", "a/b")
    assert_one_line(code, err, "--topic must be 1 to 249", "'a/b'")
