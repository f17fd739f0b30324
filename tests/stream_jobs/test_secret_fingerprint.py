"""A state dir is never silently used with another deployment secret (issue 20, item 1).

From the operator's side, for every backend and a sharded state dir: `privgw run` protects a
wave with secret A; the same state dir with secret B is refused (exit 2, both key fingerprints
and the rotation flag named, nothing published); with `--rotate-secret` it runs, logs the
privacy event, `privgw_secret_rotations_total` is 1, and the state then holds B's fingerprint.
"""

from __future__ import annotations

import re
import signal
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from streamkit import consume_all, produce, small_window_policy, start_worker

from gateway.keyed.keyed import Keyring
from state.layout import shard_paths
from state.sqlite_store import SQLiteStore
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SECRET_A = "operator-secret-A-0123456789abcdef"
SECRET_B = "operator-secret-B-fedcba9876543210"

CONFIGS = {
    "sqlite-process": (),
    "sqlite-thread": ("--engine", "thread"),
    "shards-2-process": ("--engine-shards", "2"),
    "shards-2-thread": ("--engine-shards", "2", "--engine", "thread"),
    "partitioned": ("--state-backend", "partitioned"),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metric(port: int, name: str, proc: Any, log: Path) -> float:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            assert time.monotonic() < deadline, "no /metrics"
            time.sleep(0.3)
            continue
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        assert found, f"{name} not exported"
        return float(found.group(1))


def _wait_out(bootstrap: str, topic: str, n: int, proc: Any, log: Path) -> int:
    deadline = time.monotonic() + 120
    while True:
        got = len({m.headers["record_id"] for m in consume_all(bootstrap, topic, timeout=5)})
        if got >= n:
            return got
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{got} of {n} out"
        time.sleep(0.5)


def _stop(proc: Any) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


def _stored_fingerprints(state: Path, config: str) -> list[str | None]:
    if config == "partitioned":
        from state.rocks_store import RocksStore  # noqa: PLC0415

        found: list[str | None] = []
        for path in sorted((state / "partitions").iterdir()):
            with RocksStore(path) as store:
                found += store.key_fingerprints()
        return found
    shards = 2 if "shards-2" in config else 1
    found = []
    for path in shard_paths(state, shards):
        with SQLiteStore(path) as store:
            found += store.key_fingerprints()
    return found


@pytest.mark.parametrize("config", list(CONFIGS))
def test_another_secret_is_refused_unless_rotated(
    config: str,
    broker: EmbeddedBroker,
    unique_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PRIVGW_SECRET_FILE", raising=False)
    monkeypatch.delenv("PRIVGW_ROTATE_SECRET", raising=False)
    fp_a = Keyring(SECRET_A.encode()).fingerprint()
    fp_b = Keyring(SECRET_B.encode()).fingerprint()
    policy = small_window_policy(tmp_path, 1000)  # waves decided 3 s after they open
    state = tmp_path / "state"
    in_topic, out_topic = f"{unique_name}.in", f"{unique_name}.out"
    panel = PanelSurvey(respondents=150, waves=2, seed=3, new_share=0.0, rows=load_rows())
    waves: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for r in panel.records():
        waves.setdefault(int(r["wave"]), []).append(encode(r))
    extra = CONFIGS[config]

    def launch(secret: str, log: Path, *more: str) -> Any:
        monkeypatch.setenv("PRIVGW_SECRET", secret)
        return start_worker(broker.bootstrap, unique_name, policy, state, log, *extra, *more)

    # secret A: wave 1 protected, the state records A's fingerprint (every shard, partition)
    log_a, port_a = tmp_path / "a.log", _free_port()
    first = launch(SECRET_A, log_a, "--metrics-port", str(port_a))
    try:
        assert consume_all(broker.bootstrap, f"{out_topic}.meta", expected=1, timeout=60)
        assert _metric(port_a, "privgw_secret_rotations_total", first, log_a) == 0
        n1 = len(produce(broker.bootstrap, in_topic, waves[1]))
        out1 = _wait_out(broker.bootstrap, out_topic, n1, first, log_a)
    finally:
        _stop(first)
    text_a = log_a.read_text()
    assert f"key fingerprint {fp_a}" in text_a
    assert f"key fingerprint {fp_a} recorded in the state" in text_a
    stored = _stored_fingerprints(state, config)
    assert stored and set(stored) == {fp_a}, stored

    # secret B, same state dir: refused before anything of wave 2 is published
    n2 = len(produce(broker.bootstrap, in_topic, waves[2]))
    log_b = tmp_path / "b.log"
    refused = launch(SECRET_B, log_b)
    assert refused.wait(120) == 2, log_b.read_text()[-3000:]
    text_b = log_b.read_text()
    error = [line for line in text_b.splitlines() if line.startswith("privgw: error:")]
    assert len(error) == 1, text_b[-3000:]
    assert fp_a in error[0] and fp_b in error[0], error[0]
    assert "--rotate-secret" in error[0] and "PRIVGW_ROTATE_SECRET" in error[0]
    assert "Traceback" not in text_b
    assert SECRET_A not in text_b and SECRET_B not in text_b
    assert set(_stored_fingerprints(state, config)) == {fp_a}, "a refused run wrote"
    out = consume_all(broker.bootstrap, out_topic, timeout=5)
    assert len({m.headers["record_id"] for m in out}) == out1, "a refused run published"

    # secret B with --rotate-secret (or its variable): a privacy event, counted; wave 2 goes out
    log_r, port_r = tmp_path / "rotate.log", _free_port()
    rotate: tuple[str, ...] = ("--rotate-secret",)
    if config == "sqlite-thread":
        monkeypatch.setenv("PRIVGW_ROTATE_SECRET", "1")
        rotate = ()
    rotated = launch(SECRET_B, log_r, *rotate, "--metrics-port", str(port_r))
    try:
        _wait_out(broker.bootstrap, out_topic, n1 + n2, rotated, log_r)
        assert _metric(port_r, "privgw_secret_rotations_total", rotated, log_r) == 1
    finally:
        _stop(rotated)
    text_r = log_r.read_text()
    events = [line for line in text_r.splitlines() if "privacy event: secret rotated" in line]
    assert len(events) == 1 and " WARNING " in events[0], text_r[-3000:]
    assert fp_a in events[0] and fp_b in events[0]
    assert SECRET_A not in text_r and SECRET_B not in text_r
    stored = _stored_fingerprints(state, config)
    assert stored and set(stored) == {fp_b}, stored


@pytest.mark.parametrize("config", ["sqlite-process", "partitioned"])
def test_a_wrong_secret_leaves_a_fresh_state_directory_untouched(
    config: str,
    broker: EmbeddedBroker,
    unique_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 45, item 5: the metadata topic announces A's fingerprint; a start with secret B
    on a new state directory is refused (exit 2) and leaves it as it was — an empty one
    empty, a missing one missing —, so the start with the right secret then runs."""
    monkeypatch.delenv("PRIVGW_SECRET_FILE", raising=False)
    monkeypatch.delenv("PRIVGW_ROTATE_SECRET", raising=False)
    fp_a = Keyring(SECRET_A.encode()).fingerprint()
    fp_b = Keyring(SECRET_B.encode()).fingerprint()
    policy = small_window_policy(tmp_path, 1000)
    extra = CONFIGS[config]

    def launch(secret: str, state: Path, log: Path) -> Any:
        monkeypatch.setenv("PRIVGW_SECRET", secret)
        return start_worker(broker.bootstrap, unique_name, policy, state, log, *extra)

    first = launch(SECRET_A, tmp_path / "a", tmp_path / "a.log")
    try:
        assert consume_all(broker.bootstrap, f"{unique_name}.out.meta", expected=1, timeout=60)
    finally:
        _stop(first)

    empty, missing = tmp_path / "empty", tmp_path / "missing"
    empty.mkdir()
    for state in (empty, missing):
        log = tmp_path / f"{state.name}.log"
        refused = launch(SECRET_B, state, log)
        assert refused.wait(120) == 2, log.read_text()[-3000:]
        error = [x for x in log.read_text().splitlines() if x.startswith("privgw: error:")]
        assert len(error) == 1 and fp_a in error[0] and fp_b in error[0], error
    assert list(empty.iterdir()) == [], "a refused start wrote to the state directory"
    assert not missing.exists(), "a refused start created the state directory"

    # the secret fixed: the same directory starts under A's fingerprint (the partitioned
    # backend's state is the group's changelog, which has it already)
    log = tmp_path / "fixed.log"
    fixed = launch(SECRET_A, empty, log)
    started = re.compile(rf"key fingerprint {fp_a} (recorded in|matches) the state")
    try:
        deadline = time.monotonic() + 60
        while not started.search(log.read_text()):
            assert fixed.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
    finally:
        _stop(fixed)
