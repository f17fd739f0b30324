"""`privgw run` as an operator runs it (a real process on the development broker): the input
topic is never created, the start banner, JSON logs, progress lines, the idle-input warning,
/healthz, /readyz and 404, build and process metrics, respondents counted without the group
registry, and the shutdown summary."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka.admin import AdminClient
from streamkit import create_input_topic, create_topics, produce, regroup_policy_path, settings_for

from gateway.policy import load_policy
from stream_jobs.commands.broker import EmbeddedBroker, free_port
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
POLICY = regroup_policy_path()


def topics_on(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def privgw_env(secret: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVGW_")}
    return env | {
        "PRIVGW_SECRET": secret,
        "PRIVGW_SESSION_TIMEOUT_MS": "3000",
        "PRIVGW_HEARTBEAT_INTERVAL_MS": "500",
        **extra,
    }


def run_args(bootstrap: str, name: str, state: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gateway",
        "run",
        "--policy",
        str(POLICY),
        "--bootstrap",
        bootstrap,
        "--group-id",
        f"{name}-g",
        "--input-topic",
        f"{name}.in",
        "--output-topic",
        f"{name}.out",
        "--partitions",
        "2",
        "--state-dir",
        str(state),
        "--metrics-port",
        str(port),
        *extra,
    ]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()
    except OSError:
        return 0, ""


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(what: str, cond: Any, proc: subprocess.Popen[bytes], log: Path, t: float = 60) -> Any:
    deadline = time.monotonic() + t
    while True:
        got = cond()
        if got:
            return got
        assert proc.poll() is None, f"privgw exited ({proc.returncode}): {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} not seen: {log.read_text()[-3000:]}"
        time.sleep(0.2)


def json_messages(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            out.append(orjson.loads(line))
    return out


def test_a_missing_input_topic_is_an_error_naming_it_and_is_not_created(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    proc = subprocess.run(
        run_args(broker.bootstrap, unique_name, tmp_path / "state", 0),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=privgw_env(secret_env),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("privgw: error:")]
    assert len(errors) == 1, proc.stderr
    assert f"input topic {unique_name}.in does not exist" in errors[0]
    assert "input.topic" in errors[0] and "PRIVGW_INPUT_TOPIC" in errors[0]
    assert not {t for t in topics_on(broker.bootstrap) if t.startswith(unique_name)}


def test_privgw_run_as_an_operator_sees_it(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    policy = load_policy(POLICY)
    settings = settings_for(broker.bootstrap, unique_name, tmp_path / "state", partitions=2)
    # the input topic alone: the worker creates the others
    create_topics(policy, settings.model_copy(update={"output_topic": f"{unique_name}.x"}))
    port = free_port()
    log = tmp_path / "privgw.log"
    env = privgw_env(
        secret_env,
        PRIVGW_LOG_FORMAT="json",
        PRIVGW_PROGRESS_INTERVAL_SECONDS="1",
        PRIVGW_INPUT_IDLE_WARNING_SECONDS="1",
        PRIVGW_ENGINE="process",
    )
    args = run_args(broker.bootstrap, unique_name, tmp_path / "state", port)
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        wait_for("/readyz 200", lambda: get(port, "/readyz")[0] == 200, proc, log)
        assert get(port, "/healthz") == (200, "progressing\n")
        assert get(port, "/")[0] == 404 and get(port, "/metrics/x")[0] == 404
        idle = wait_for(
            "the idle-input warning",
            lambda: [m for m in json_messages(log) if "has no records" in m["message"]],
            proc,
            log,
        )
        assert idle[0]["level"] == "WARNING" and f"{unique_name}.in" in idle[0]["message"]
        rows = list(PanelSurvey(respondents=400, waves=1, seed=3, rows=load_rows()).records())
        produce(broker.bootstrap, f"{unique_name}.in", [encode(r) for r in rows])

        def settled() -> str | None:
            _, text = get(port, "/metrics")
            published = metric(text, "privgw_records_published_total")
            return text if published == 400 and metric(text, "privgw_records_held") == 0 else None

        text = wait_for("all 400 records published", settled, proc, log)
        respondents = metric(text, "privgw_state_respondents")
        assert 'privgw_build_info{python="' in text and 'version="' in text
        assert (metric(text, "process_resident_memory_bytes") or 0) > 10e6
        assert (metric(text, "process_open_fds") or 0) > 0
        wait_for(
            "a progress line after the records",
            lambda: [
                m
                for m in json_messages(log)
                if m["message"].startswith("progress: 400 records consumed")
            ],
            proc,
            log,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    messages = json_messages(log)
    later = messages[messages.index(idle[0]) + 1 :]
    assert not any("has no records" in m["message"] for m in later)  # once
    banner = next(m["message"] for m in messages if m["message"].startswith("privgw "))
    assert "engine process, 1 shard(s)" in banner and "(PLAINTEXT)" in banner
    assert "0 respondents restored" in banner and str(tmp_path / "state") in banner
    fingerprint = re.search(r"key fingerprint ([0-9a-f]{16})", banner)
    assert fingerprint and secret_env not in log.read_text()
    assert any(m["message"].startswith("PRIVGW_REPLICATION_FACTOR is 3") for m in messages)
    summary = [m for m in messages if m["message"].startswith("privgw stopped after")]
    assert summary and "400 records consumed" in summary[0]["message"]
    # respondents counted without the group registry's rows: the state file holds both
    with contextlib.closing(sqlite3.connect(tmp_path / "state" / "state.db")) as db:
        keys = [k for (k,) in db.execute("SELECT key FROM state")]
    digests = sum(1 for k in keys if not bytes(k).startswith(b"group:"))
    assert len(keys) > digests == respondents == 400

    # a restart says what it restored
    log2 = tmp_path / "privgw2.log"
    with log2.open("wb") as out:
        env2 = env | {"PRIVGW_LOG_FORMAT": "text"}
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env2, cwd=ROOT)
    try:
        wait_for("/readyz 200", lambda: get(port, "/readyz")[0] == 200, proc, log2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130  # Ctrl-C: a clean stop, told as an interruption
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log2.read_text()
    assert "400 respondents restored" in text and f"key fingerprint {fingerprint.group(1)}" in text


def test_with_topic_creation_off_missing_output_topics_are_named(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    create_input_topic(broker.bootstrap, f"{unique_name}.in", partitions=2)
    proc = subprocess.run(
        run_args(broker.bootstrap, unique_name, tmp_path / "state", 0, "--no-create-topics"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=privgw_env(secret_env),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("privgw: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for topic in (f"{unique_name}.out", f"{unique_name}.in.dlq", f"{unique_name}.out.meta"):
        assert topic in errors[0]
    assert "PRIVGW_CREATE_TOPICS" in errors[0]
    assert not {t for t in topics_on(broker.bootstrap) if t.startswith(f"{unique_name}.out")}
