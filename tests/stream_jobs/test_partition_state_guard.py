"""Partitions that arrive without their state (issue 30, item 5): with the sqlite backend a
partition's state is in the state directory of the worker that protected its records. A
worker assigned a partition that another worker processed stops before touching it (exit 2,
one line naming the partitions), unless `--allow-missing-partition-state` accepts the loss
(then a WARNING names them). Real `privgw run` processes on the development broker.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from streamkit import (
    consume_all,
    create_input_topic,
    k_claim,
    produce,
    small_window_policy,
    start_worker,
)

from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.partitions.partition_state import (
    COMMIT_TAG,
    LEDGER,
    PartitionLedger,
    PartitionStateGuard,
    _committer,
    missing,
)

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


def _marked_again(
    bootstrap: str, topic: str, wanted: set[bytes], worker: Any, log: Path, *, seconds: float
) -> tuple[list[Any], set[bytes]]:
    """Wait until every record id of ``wanted`` is in ``topic`` marked ``supersedes: true``,
    then stop ``worker`` (it must exit 0): the topic's records, and the ids marked."""
    try:
        deadline = time.monotonic() + seconds
        while True:
            out = consume_all(bootstrap, topic, timeout=3)
            again = {m.headers["record_id"] for m in out if m.headers.get("supersedes") == b"true"}
            if again >= wanted:
                return out, again
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{len(again & wanted)} of {len(wanted)} marked"
            time.sleep(0.5)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0


def _privgw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


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
        # issue 45, item 8: each says at once, loudly and with the fix, that it cannot fail over
        for log in logs:
            warned = [x for x in log.read_text().splitlines() if "cannot fail over" in x]
            assert warned and " WARNING " in warned[-1], log.read_text()[-3000:]
            assert "--state-backend partitioned" in warned[-1] and "--workers N" in warned[-1]
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
    assert doc == {
        "version": 1,
        "state_id": ledger.state_id,
        "processed": {"in": {"0": 10, "1": 3}},
        "republish": {},
    }
    assert not list(tmp_path.glob("*.tmp"))


def test_a_restore_from_backup_is_named_and_privgw_offsets_takes_the_group_back(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    """Issue 45, item 7, as the runbook goes: a cold backup after wave 1, wave 2 protected,
    the backup restored. The refusal says the state was restored (not "another worker"),
    `privgw offsets reset` takes the group back with no outside tool, and wave 2 is protected
    again: every copy carries `supersedes: true`, wave 1 is not republished."""
    policy = small_window_policy(tmp_path, 500)
    in_topic, out_topic = f"{unique_name}.in", f"{unique_name}.out"
    create_input_topic(broker.bootstrap, in_topic, partitions=3)
    state, backup = tmp_path / "state", tmp_path / "backup"
    group = ("--group-id", f"{unique_name}-g", "--bootstrap", broker.bootstrap)

    def wave(seed: int, log: Path, total: int) -> set[bytes]:
        """A wave of 1,000: with fewer, the groups formed anew happen to be the same."""
        w = start_worker(broker.bootstrap, unique_name, policy, state, log)
        sent = produce(broker.bootstrap, in_topic, _records(1000, seed=seed))
        ids = {f"{in_topic}/{s.partition}/{s.offset}".encode() for s in sent}
        _published(broker.bootstrap, out_topic, ids, w, log, total=total + len(ids))
        w.send_signal(signal.SIGTERM)
        assert w.wait(30) == 0
        return ids

    first = wave(1, tmp_path / "w1.log", 0)
    shutil.copytree(state, backup)  # the cold backup
    second = wave(2, tmp_path / "w2.log", len(first))
    shutil.rmtree(state)
    shutil.copytree(backup, state)  # the restore

    log = tmp_path / "w3.log"
    w = start_worker(broker.bootstrap, unique_name, policy, state, log)
    assert w.wait(60) == 2, log.read_text()[-3000:]
    line = _refusal(log)
    # the development broker drops commit metadata, so the worker cannot tell who committed
    # (test_the_refusal_says_who_committed): it names both cases, each with its fix
    assert "restored from an older backup" in line and "privgw offsets reset" in line, line
    assert "were protected by another worker" not in line, line

    shown = _privgw("offsets", "show", "--state-dir", str(state), *group)
    assert shown.returncode == 0, shown.stderr
    assert f"{in_topic}/0" in shown.stdout
    assert "aiokafka" not in shown.stderr, shown.stderr  # a table, not the client's chatter
    dry = _privgw("offsets", "reset", "--state-dir", str(state), *group, "--dry-run")
    assert dry.returncode == 0 and f"{len(second)} records protected again" in dry.stdout, dry
    # a member of the group still running: the group refuses the reset, in one line, and the
    # range marked ahead of the commit is unmarked (it was left in partitions.json)
    ledger = (state / "partitions.json").read_text()
    member = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{unique_name}-g"})
    try:
        member.subscribe([in_topic])
        deadline = time.monotonic() + 30
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.2)
        refused = _privgw("offsets", "reset", "--state-dir", str(state), *group)
    finally:
        member.close()
    assert refused.returncode == 2 and "refused the reset" in refused.stderr, refused
    assert "aiokafka" not in refused.stderr, refused.stderr
    assert (state / "partitions.json").read_text() == ledger
    reset = _privgw("offsets", "reset", "--state-dir", str(state), *group)
    assert reset.returncode == 0, reset.stderr
    assert f"{len(second)} records are protected again" in reset.stdout, reset.stdout

    log = tmp_path / "w4.log"
    w = start_worker(broker.bootstrap, unique_name, policy, state, log)
    out, again = _marked_again(broker.bootstrap, out_topic, second, w, log, seconds=90)
    assert again == second
    copies: dict[bytes, list[Any]] = {}
    for m in out:
        copies.setdefault(m.headers["record_id"], []).append(m)
    assert all(len(copies[r]) == 1 for r in first), "wave 1 was republished"
    assert all(len(copies[r]) == 2 for r in second)
    # the copy protected again is the marked one (not necessarily the later one to read:
    # output partitions follow the output key)
    pairs = {}
    for r in second:
        marks = sorted(copies[r], key=lambda m: "supersedes" in m.headers)
        assert ["supersedes" in m.headers for m in marks] == [False, True], r
        pairs[r] = marks
    changed = [r for r in second if pairs[r][0].value != pairs[r][1].value]
    fields: set[str] = set()
    for r in changed:
        old, new = (json.loads(m.value) for m in pairs[r])
        fields |= {f for f in old if old[f] != new.get(f)}
    print(f"republished after the restore: {len(changed)} of {len(second)} with other bytes;"
          f" fields that differ: {sorted(fields)}")  # fmt: skip
    # what the runbook says changes: only the quasi-identifiers' group values (the groups are
    # formed anew); randomized and other values are republished identically (keyed draws)
    assert fields <= set(k_claim(policy)), fields


def test_the_refusal_says_who_committed(tmp_path: Path) -> None:
    """Kafka keeps each commit's metadata, where the worker writes its state's id: its own id
    beyond its ledger is a restore, another id another worker's state (issue 45, item 7)."""
    guard = PartitionStateGuard(tmp_path, allow_missing=False, has_state=False)
    own = guard.commit_metadata
    assert own.startswith(COMMIT_TAG) and guard.ledger.state_id in own
    gone = {("in", 0): (10, 20)}
    assert _committer({("in", 0): own}, guard.ledger.state_id) == "self"
    assert _committer({("in", 0): COMMIT_TAG + "0123"}, guard.ledger.state_id) == "other"
    assert _committer({("in", 0): ""}, guard.ledger.state_id) == "unknown"
    restored = guard._refusal(gone, "self")
    assert "restored from a backup" in restored and "privgw offsets reset" in restored
    assert "another worker" not in restored and "--workers" not in restored
    other = guard._refusal(gone, "other")
    assert "another worker" in other and "offsets reset" not in other
    # the id survives with the ledger (a backup keeps it), and ranges to protect again are
    # forgotten once passed
    guard.ledger.republish[("in", 0)] = 20
    guard.before_commit({("in", 0): 15})
    again = PartitionLedger(tmp_path)
    assert again.state_id == guard.ledger.state_id and again.superseding(("in", 0), 19)
    again.record({("in", 0): 20})
    assert not PartitionLedger(tmp_path).superseding(("in", 0), 19)


def test_a_panel_restored_from_backup_marks_every_record_it_protects_again(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    """A panel's outputs name no input record (their ids are keyed per respondent and wave),
    so the mark, which went by the input record's offset, was on none of them: wave 2
    protected again after a restore carried no `supersedes: true`."""
    policy = small_window_policy(tmp_path, 500, mode="panel")
    in_topic, out_topic = f"{unique_name}.in", f"{unique_name}.out"
    create_input_topic(broker.bootstrap, in_topic, partitions=3)
    state, backup = tmp_path / "state", tmp_path / "backup"
    group = ("--group-id", f"{unique_name}-g", "--bootstrap", broker.bootstrap)
    survey = [encode(r) for r in PanelSurvey(300, waves=2, seed=3, rows=load_rows()).records()]
    waves = {w: [r for r in survey if json.loads(r[1] or b"{}")["wave"] == w] for w in (1, 2)}

    def ids() -> set[bytes]:
        return {m.headers["record_id"] for m in consume_all(broker.bootstrap, out_topic, timeout=3)}

    def wave(w: int, log: Path, before: set[bytes]) -> set[bytes]:
        worker = start_worker(broker.bootstrap, unique_name, policy, state, log)
        produce(broker.bootstrap, in_topic, waves[w])
        close = ("wave", "close", str(w), "--policy", str(policy), "--input-topic", in_topic)
        assert _privgw(*close, "--bootstrap", broker.bootstrap).returncode == 0
        deadline = time.monotonic() + 60
        while len(new := ids() - before) < len(waves[w]):
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{len(new)} of wave {w} published"
            time.sleep(0.5)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        return ids() - before

    first = wave(1, tmp_path / "w1.log", set())
    shutil.copytree(state, backup)
    second = wave(2, tmp_path / "w2.log", first)
    shutil.rmtree(state)
    shutil.copytree(backup, state)
    reset = _privgw("offsets", "reset", "--state-dir", str(state), *group)
    assert reset.returncode == 0, reset.stderr
    log = tmp_path / "w3.log"
    worker = start_worker(broker.bootstrap, unique_name, policy, state, log)
    out, again = _marked_again(broker.bootstrap, out_topic, second, worker, log, seconds=60)
    assert again == second  # wave 2's records, each marked; wave 1's not republished
    assert all(sum(m.headers["record_id"] == r for m in out) == 1 for r in first)
