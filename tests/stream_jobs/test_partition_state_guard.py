"""Partitions that arrive without their state (issue 30, item 5): with the sqlite backend a
partition's state is in the state directory of the worker that protected its records. A
worker assigned a partition that another worker processed stops before touching it (exit 2,
one line naming the partitions), unless `--allow-missing-partition-state` accepts the loss
(then a WARNING names them). Real `privgw run` processes on the development broker.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
from streamkit import consume_all, create_input_topic, produce, small_window_policy, start_worker

from stream_jobs.broker import EmbeddedBroker
from stream_jobs.partition_state import LEDGER, PartitionLedger, missing
from stream_jobs.simulator import PanelSurvey, encode, load_rows

pytestmark = [pytest.mark.broker]


def _records(n: int, seed: int) -> list[tuple[bytes | None, bytes | None]]:
    panel = PanelSurvey(respondents=n, waves=1, seed=seed, rows=load_rows())
    return [encode(r) for r in panel.records()]


def _published(
    bootstrap: str, topic: str, wanted: set[bytes], worker: object, log: Path, *, total: int
) -> None:
    """Wait until ``wanted`` are in ``topic``, which then holds ``total`` distinct records."""
    deadline = time.monotonic() + 60
    while True:
        out = consume_all(bootstrap, topic, expected=total, timeout=3)
        seen = {m.headers["record_id"] for m in out}
        if wanted <= seen:
            return
        assert worker.poll() is None, log.read_text()[-3000:]  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"{len(wanted - seen)} records not published"


def _refusal(log: Path) -> str:
    lines = [line for line in log.read_text().splitlines() if line.startswith("privgw: error:")]
    assert len(lines) == 1, log.read_text()[-3000:]
    return lines[0]


def test_a_worker_refuses_partitions_another_worker_processed_unless_told(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    """Static assignment changed from 2 workers to 1 on a new state directory, then back."""
    policy = small_window_policy(tmp_path, 500)
    in_topic, out_topic = f"{unique_name}.in", f"{unique_name}.out"
    create_input_topic(broker.bootstrap, in_topic, partitions=3)
    sent = produce(broker.bootstrap, in_topic, _records(300, seed=1))
    ids = {p: {f"{in_topic}/{s.partition}/{s.offset}".encode() for s in sent if s.partition == p}
           for p in range(3)}  # fmt: skip
    a_state, b_state = tmp_path / "a", tmp_path / "b"

    # worker 0 of 2 protects partitions 0 and 2, then stops
    log = tmp_path / "a.log"
    a = start_worker(broker.bootstrap, unique_name, policy, a_state, log,
                     "--workers", "2", "--worker-index", "0")  # fmt: skip
    _published(broker.bootstrap, out_topic, ids[0] | ids[2], a, log, total=len(ids[0] | ids[2]))
    a.send_signal(signal.SIGTERM)
    assert a.wait(30) == 0
    assert set(PartitionLedger(a_state).offsets) == {(in_topic, 0), (in_topic, 2)}

    # one worker for all partitions, on a new state directory: 0 and 2 are someone else's
    log = tmp_path / "b.log"
    b = start_worker(broker.bootstrap, unique_name, policy, b_state, log,
                     "--workers", "1", "--worker-index", "0")  # fmt: skip
    assert b.wait(60) == 2, log.read_text()[-3000:]
    line = _refusal(log)
    assert f"{in_topic}/0, {in_topic}/2 were assigned" in line, line
    assert f"{in_topic}/1" not in line.split("were assigned")[0]
    assert str(b_state) in line and "--allow-missing-partition-state" in line
    out = consume_all(broker.bootstrap, out_topic, timeout=3)
    assert not [m for m in out if m.headers["record_id"] in ids[1]], "processed before refusing"

    # told to accept it: a warning names them, and everything is protected
    b = start_worker(broker.bootstrap, unique_name, policy, b_state, log,
                     "--workers", "1", "--worker-index", "0",
                     "--allow-missing-partition-state")  # fmt: skip
    more = produce(broker.bootstrap, in_topic, _records(300, seed=2))
    wanted = ids[1] | {f"{in_topic}/{s.partition}/{s.offset}".encode() for s in more}
    _published(broker.bootstrap, out_topic, wanted, b, log, total=len(wanted | ids[0] | ids[2]))
    b.send_signal(signal.SIGTERM)
    assert b.wait(30) == 0
    warning = [x for x in log.read_text().splitlines() if "arrive without their state" in x]
    assert len(warning) == 1 and f"{in_topic}/0, {in_topic}/2 arrive" in warning[0], warning

    # the first worker back on its old state: its partitions moved on without it (stale)
    log = tmp_path / "a2.log"
    a = start_worker(broker.bootstrap, unique_name, policy, a_state, log,
                     "--workers", "2", "--worker-index", "0")  # fmt: skip
    assert a.wait(60) == 2, log.read_text()[-3000:]
    line = _refusal(log)
    assert re.search(rf"offsets {re.escape(in_topic)}/0 \d+-\d+", line), line


def test_group_mode_on_sqlite_a_survivor_does_not_take_a_killed_members_partitions(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    """The issue's reproduction: two `privgw run --group-id g` on SQLite, one killed; the
    survivor is assigned its partitions and stops, naming them, instead of regrouping their
    respondents from nothing."""
    policy = small_window_policy(tmp_path, 500)
    in_topic, out_topic = f"{unique_name}.in", f"{unique_name}.out"
    create_input_topic(broker.bootstrap, in_topic, partitions=3)
    logs = [tmp_path / "w0.log", tmp_path / "w1.log"]
    states = [tmp_path / "s0", tmp_path / "s1"]
    workers = [start_worker(broker.bootstrap, unique_name, policy, s, log)
               for s, log in zip(states, logs, strict=True)]  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        # both members hold partitions (their ledgers say which) before records come
        while (
            not all((s / LEDGER).is_file() for s in states)
            or sum(len(PartitionLedger(s).offsets) for s in states) != 3
        ):
            assert time.monotonic() < deadline, [x.read_text()[-2000:] for x in logs]
            time.sleep(0.2)
        sent = produce(broker.bootstrap, in_topic, _records(300, seed=3))
        assert len(consume_all(broker.bootstrap, out_topic, expected=len(sent), timeout=60)) >= 300
        victim = 0 if len(PartitionLedger(states[0]).offsets) == 1 else 1
        theirs = sorted(p for _, p in PartitionLedger(states[victim]).offsets)
        workers[victim].kill()
        workers[victim].wait(10)
        survivor = workers[1 - victim]
        assert survivor.wait(60) == 2, logs[1 - victim].read_text()[-3000:]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(10)
    line = _refusal(logs[1 - victim])
    named = ", ".join(f"{in_topic}/{p}" for p in theirs)
    assert f"partitions {named} were assigned" in line, line


def test_the_ledger_rules() -> None:
    assert not missing(None, None) and not missing(None, 0), "never committed: a clean start"
    assert missing(None, 5), "committed by someone, unknown here"
    assert not missing(5, 5) and not missing(7, 5), "this state got at least that far"
    assert missing(5, 9), "someone went on from where this state stopped"


def test_the_ledger_is_written_whole_and_only_forward(tmp_path: Path) -> None:
    ledger = PartitionLedger(tmp_path)
    assert not ledger.existed
    ledger.record({("in", 0): 10, ("in", 1): 3})
    ledger.record({("in", 0): 7})  # never lowered
    again = PartitionLedger(tmp_path)
    assert again.existed and again.offsets == {("in", 0): 10, ("in", 1): 3}
    doc = json.loads((tmp_path / LEDGER).read_text())
    assert doc == {"version": 1, "processed": {"in": {"0": 10, "1": 3}}}
    assert not list(tmp_path.glob("*.tmp"))
