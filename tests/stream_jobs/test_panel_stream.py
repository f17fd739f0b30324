"""The panel mode through the real worker and broker (issue 43): every active member published
in every wave, an absent one's record not told apart from a present one's by anything a
consumer of the output topic sees (value bytes, field order, headers, timestamp type), and a
backlog of waves read at once decided wave by wave, in order, with nothing blanked."""

from __future__ import annotations

import asyncio
import hashlib
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import yaml
from clikit import privgw
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry
from streamkit import (
    Message,
    Sent,
    accounted,
    consume_all,
    create_input_topic,
    create_topics,
    high_watermarks,
    k_claim,
    make_worker,
    produce,
    produce_waves,
    run_until,
    settings_for,
    start_worker,
)

from gateway.keyed.keyed import Keyring
from gateway.policy import Policy, parse_policy
from gateway.state_store.state_keys import scoped_key
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.intake.wave_control import HEADER, WAVE_CLOSE
from stream_jobs.kafka import partitions_for_keys
from stream_jobs.ops.metrics import GatewayMetrics, count_respondents

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "deploy" / "policies" / "adult.yaml"
QIS = k_claim()


def _policy(*, grace: float, max_wave: float) -> Policy:
    """The shipped panel policy with windows closed every second, a short close grace, and the
    last wave closed by its maximum (a test cannot wait for a fourth wave)."""
    data = yaml.safe_load(ADULT.read_text())
    assert data["republication"]["mode"] == "panel", "the Adult policy changed: update this"
    data["window"].update(max_seconds=1, max_hold_seconds=3)
    data["window"].pop("max_idle_seconds", None)
    data["republication"].update(close_grace_seconds=grace, max_wave_seconds=max_wave)
    return parse_policy(data)


def _waves(respondents: int, waves: int, skip: float, seed: int) -> list[list[tuple[bytes, bytes]]]:
    """A simulated panel, wave by wave, ``skip`` of the respondents absent from each wave
    after the first (new respondents join along the way)."""
    rng = np.random.default_rng(seed)
    survey = PanelSurvey(respondents=respondents, waves=waves, seed=seed, rows=load_rows())
    out: list[list[tuple[bytes, bytes]]] = [[] for _ in range(waves)]
    for row in survey.records():
        wave = int(row["wave"])
        if wave > 1 and rng.random() < skip:
            continue
        key, value = encode(row)
        assert key is not None and value is not None
        out[wave - 1].append((key, value))
    return out


def _record_id(
    keyring: Keyring, respondent: str, wave: int, *, partitions: int | None = None
) -> str:
    """A member's record id in ``wave``; with ``partitions`` (partitioned state), its state key
    carries the input partition its respondent id is keyed to."""
    key = keyring.respondent_key(respondent)
    if partitions is not None:
        [partition] = partitions_for_keys([respondent.encode()], list(range(partitions)))
        key = scoped_key(partition, key)
    digest = hashlib.sha256(key + b"\x00" + str(wave).encode()).hexdigest()[:24]
    return f"{wave}-{digest}"


def _run(
    broker: EmbeddedBroker,
    name: str,
    tmp_path: Path,
    secret: str,
    waves: list[list[tuple[bytes, bytes]]],
    *,
    backlog: bool,
    shards: int | None = None,
    respondents: list[int] | None = None,
) -> tuple[list[Message], Any]:
    policy = _policy(grace=1.0, max_wave=6.0)
    settings = settings_for(broker.bootstrap, name, tmp_path, engine_shards=shards)
    topics = settings.topics(policy)
    create_topics(policy, settings)
    total = sum(len(w) for w in waves)
    sent: list[Sent] = []
    if backlog:  # every wave in the topic before the worker starts: read at once
        sent.extend(produce(broker.bootstrap, topics.input, [r for w in waves for r in w]))
    worker = make_worker(policy, settings, secret)
    if respondents is not None:  # the exporter's count, after each window
        counted = lambda *_: respondents.append(count_respondents(worker.state_store))  # noqa: E731
        worker.observers.append(counted)

    def feed() -> None:
        if not backlog:
            produce_waves(broker.bootstrap, topics.input, waves, worker, sent, seconds=30)

    def done(w: Any) -> bool:
        return accounted(w, total) and w.stats.held == 0

    code = asyncio.run(run_until(worker, done, during=feed, timeout=120))
    assert code == 0
    assert worker.stats.consumed == total and worker.stats.held == 0
    return consume_all(broker.bootstrap, topics.output), worker


@pytest.mark.parametrize("shards", [None, 2])
def test_every_member_is_published_every_wave_and_imputed_records_look_the_same(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path, shards: int | None
) -> None:
    """With engine shards too: each shard keeps the cohorts of its respondents."""
    waves = _waves(160, 3, skip=0.3, seed=43)
    counts: list[int] = []
    out, worker = _run(
        broker, unique_name, tmp_path, secret_env, waves, backlog=False, shards=shards,
        respondents=counts,
    )  # fmt: skip
    keyring = Keyring(secret_env.encode())
    by_id: dict[str, Message] = {}
    for m in out:
        row_id = m.headers["record_id"].decode()
        if row_id in by_id:  # a resent record is the same bytes
            assert by_id[row_id].value == m.value
        by_id.setdefault(row_id, m)
    seen: set[str] = set()
    present_ids: set[str] = set()
    imputed_ids: set[str] = set()
    for wave, records in enumerate(waves, start=1):
        here = {key.decode() for key, _ in records}
        seen |= here
        present_ids |= {_record_id(keyring, r, wave) for r in here}
        imputed_ids |= {_record_id(keyring, r, wave) for r in seen - here}
    assert imputed_ids, "no respondent skipped a wave: the test would check nothing"
    # the state's respondents, as privgw_state_respondents shows them: the rosters' members;
    # and as state-check counts them in the state files, the worker stopped
    assert counts[-1] == len(seen), (counts[-1], len(seen))
    checked = privgw("state-check", "--state-dir", tmp_path, check=True).stdout
    members = re.findall(r"(\d+) panel members in its roster", checked)
    assert sum(map(int, members)) == len(seen), checked
    # every active member, present or absent, is in every wave's release, once
    assert set(by_id) == present_ids | imputed_ids
    # and counted so: an absent member's record was produced but in no counter
    registry = CollectorRegistry()
    GatewayMetrics.create(registry).attach(worker)
    assert registry.get_sample_value("privgw_records_imputed_total") == len(imputed_ids)
    assert registry.get_sample_value("privgw_records_published_total") == len(present_ids)
    shapes: dict[str, set[Any]] = defaultdict(set)
    for rid, m in by_id.items():
        kind = "imputed" if rid in imputed_ids else "present"
        row = orjson.loads(m.value or b"")
        shapes[kind].add(
            (
                tuple(row),  # field names in order
                tuple(type(v).__name__ for v in row.values()),
                tuple(sorted(m.headers)),
                m.key,
                len(rid),
            )
        )
    # imputed and present records share every shape a consumer can see
    assert shapes["imputed"] <= shapes["present"], shapes["imputed"] - shapes["present"]
    # k within every wave, and one weight per class
    per_class: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for m in by_id.values():
        row = orjson.loads(m.value or b"")
        per_class[(row["wave"], *(row[q] for q in QIS))].append(row["weight"])
    assert all(len(ws) >= 5 and len(set(ws)) == 1 for ws in per_class.values())


def test_a_backlog_of_waves_is_decided_wave_by_wave_in_order(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    waves = _waves(120, 4, skip=0.3, seed=7)
    out, worker = _run(broker, unique_name, tmp_path, secret_env, waves, backlog=True)
    rows = [(m.partition, m.offset, orjson.loads(m.value or b"")) for m in out]
    suppressed = sum(row[QIS[0]] is None for _, _, row in rows)
    assert suppressed <= 0.01 * len(rows), f"{suppressed} of {len(rows)} records blanked"
    assert {row["wave"] for _, _, row in rows} == {1, 2, 3, 4}
    by_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for partition, offset, row in rows:
        by_partition[partition].append((offset, int(row["wave"])))
    for partition, entries in by_partition.items():
        order = [wave for _, wave in sorted(entries)]
        assert order == sorted(order), f"partition {partition} published waves out of order"
    del worker


def test_kill_9_during_a_backlog_loses_nothing_and_republishes_identically(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    """A backlog of four waves read at start by a real `privgw run`, killed (SIGKILL) once its
    first records are out, then restarted: every member of every wave is published, a record
    sent twice has the same bytes, nothing is blanked, and waves come out in order."""
    policy = _policy(grace=1.0, max_wave=8.0)
    path = tmp_path / "panel.yaml"
    path.write_text(yaml.safe_dump(policy.model_dump(mode="json", exclude_none=True)))
    waves = _waves(120, 4, skip=0.3, seed=11)
    create_input_topic(broker.bootstrap, f"{unique_name}.in", partitions=3)
    produce(broker.bootstrap, f"{unique_name}.in", [r for w in waves for r in w])
    keyring = Keyring(secret_env.encode())
    expected: set[str] = set()
    seen: set[str] = set()
    for wave, records in enumerate(waves, start=1):
        seen |= {key.decode() for key, _ in records}
        expected |= {_record_id(keyring, r, wave) for r in seen}
    state, log = tmp_path / "state", tmp_path / "worker.log"
    out_topic = f"{unique_name}.out"
    worker = start_worker(broker.bootstrap, unique_name, path, state, log)
    try:
        deadline = time.monotonic() + 90
        while high_watermarks(broker.bootstrap, out_topic) < 1:
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no output in 90 s"
            time.sleep(0.05)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        worker = start_worker(broker.bootstrap, unique_name, path, state, log)
        while True:
            out = consume_all(broker.bootstrap, out_topic, timeout=5)
            if {m.headers["record_id"].decode() for m in out} >= expected:
                break
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline + 60, "not every member of every wave came out"
            time.sleep(0.5)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(40) == 0, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    first: dict[str, bytes] = {}
    for m in out:
        rid = m.headers["record_id"].decode()
        assert first.setdefault(rid, m.value or b"") == m.value, "a resent record differs"
    assert set(first) == expected
    rows = [orjson.loads(v) for v in first.values()]
    suppressed = sum(row[QIS[0]] is None for row in rows)
    assert suppressed <= 0.01 * len(rows), f"{suppressed} of {len(rows)} blanked"


def test_an_operator_closes_a_wave_with_privgw_wave_close(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    """With a close grace and a wave maximum far beyond the test, wave 1 is decided only
    because `privgw wave close 1` says so: its records come out, the next wave's records wait
    for their own close, and a control record the worker cannot read is dead-lettered."""
    policy = _policy(grace=600.0, max_wave=3600.0)
    path = tmp_path / "panel.yaml"
    path.write_text(yaml.safe_dump(policy.model_dump(mode="json", exclude_none=True)))
    settings = settings_for(broker.bootstrap, unique_name, tmp_path)
    topics = settings.topics(policy)
    create_topics(policy, settings)
    first, second = _waves(60, 2, skip=0.0, seed=5)
    later = second[:10]  # wave 2 has begun: only wave 1 is to close
    produce(broker.bootstrap, topics.input, first + later)
    bad = Producer({"bootstrap.servers": broker.bootstrap})
    bad.produce(topics.input, value=b'{"wave": "one"}', headers=[(HEADER, WAVE_CLOSE)])
    assert bad.flush(10) == 0
    worker = make_worker(policy, settings, secret_env)
    total = len(first) + len(later) + 1

    def close() -> None:
        deadline = time.monotonic() + 60
        while worker.stats.consumed < total:  # every record read, none decided
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert worker.stats.published == 0, "a wave closed before the operator said so"
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "wave", "close", "1", "--policy", str(path),
             "--bootstrap", broker.bootstrap, "--input-topic", topics.input],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "wave 1 closed on 3 partitions" in done.stdout

    def decided(w: Any) -> bool:
        return w.stats.published >= len(first) and w.stats.held == len(later)

    assert asyncio.run(run_until(worker, decided, during=close, timeout=120)) == 0
    out = consume_all(broker.bootstrap, topics.output)
    assert {orjson.loads(m.value or b"")["wave"] for m in out} == {1}
    assert len({m.headers["record_id"] for m in out}) == len(first)
    assert worker.stats.dlq == {"bad_control": 1}
    assert worker.stats.control == 3  # one close a partition


def test_the_partitioned_backend_keeps_the_roster_in_parts_through_its_changelog(
    broker: EmbeddedBroker,
    unique_name: str,
    secret_env: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Panel state in the partitioned backend, rosters written in parts (the part size made
    small, as a roster above 512 KiB would be): three waves through one worker, then a worker
    with an empty state directory rebuilds every partition from the changelog and decides the
    fourth wave, publishing the members who skip it from the restored rosters."""
    import gateway.panel.roster as roster_module  # noqa: PLC0415

    monkeypatch.setattr(roster_module, "PART_BYTES", 2048)
    policy = _policy(grace=1.0, max_wave=6.0)
    waves = _waves(150, 4, skip=0.3, seed=44)
    settings = [
        settings_for(broker.bootstrap, unique_name, tmp_path / name, state_backend="partitioned")
        for name in ("first", "second")
    ]
    create_topics(policy, settings[0])
    topics = settings[0].topics(policy)
    for part, worker_settings in zip((waves[:3], waves[3:]), settings, strict=True):
        worker = make_worker(policy, worker_settings, secret_env)
        need = sum(len(w) for w in part)
        sent: list[Sent] = []

        def feed(
            part: list[list[tuple[bytes, bytes]]] = part, worker: Any = worker, sent: Any = sent
        ) -> None:
            produce_waves(broker.bootstrap, topics.input, part, worker, sent, seconds=30)

        def done(w: Any, need: int = need) -> bool:
            return accounted(w, need) and w.stats.held == 0

        assert asyncio.run(run_until(worker, done, during=feed, timeout=120)) == 0
    changelog = consume_all(broker.bootstrap, settings[0].changelog_topic)
    parts = [m for m in changelog if m.key is not None and b".panel~" in m.key]
    assert parts, "no roster was written in parts: the test would check nothing"
    keyring = Keyring(secret_env.encode())
    out = consume_all(broker.bootstrap, topics.output)
    published = {m.headers["record_id"].decode() for m in out}

    seen: set[str] = set()
    for wave, records in enumerate(waves, start=1):
        here = {key.decode() for key, _ in records}
        seen |= here
        present = {_record_id(keyring, r, wave, partitions=3) for r in here}
        imputed = {_record_id(keyring, r, wave, partitions=3) for r in seen - here}
        assert imputed or wave == 1, f"nobody skipped wave {wave}"
        assert present | imputed <= published, f"wave {wave} lost members"
        assert len(published & (present | imputed)) == len(seen)


def test_a_wave_read_again_keeps_the_age_its_records_timestamps_give_it(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    """A wave's records stay uncommitted until it closes, and a restart reads them again: its
    maximum counted from that read never ran out for a worker restarted more often (the
    panel's last wave, which no later wave closes). Here the topic holds a wave produced 95 s
    ago and nothing after it, as a restarted worker finds it: with max_wave_seconds 100 it is
    published within seconds, not 100 s after the read."""
    policy = _policy(grace=1.0, max_wave=100.0)
    settings = settings_for(broker.bootstrap, unique_name, tmp_path)
    topics = settings.topics(policy)
    create_topics(policy, settings)
    [wave] = _waves(60, 1, skip=0.0, seed=11)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    produced = int((time.time() - 95) * 1000)
    for i, (key, value) in enumerate(wave):
        producer.produce(topics.input, value=value, key=key, timestamp=produced + 10 * i)
    assert producer.flush(30) == 0
    worker = make_worker(policy, settings, secret_env)
    started = time.monotonic()

    def done(w: Any) -> bool:
        return accounted(w, len(wave)) and w.stats.held == 0

    assert asyncio.run(run_until(worker, done, timeout=60)) == 0
    assert done(worker), "the wave was still open when the test gave up"
    assert time.monotonic() - started < 60  # the read-based maximum: 100 s
    out = consume_all(broker.bootstrap, topics.output, expected=len(wave))
    assert {orjson.loads(m.value or b"")["wave"] for m in out} == {1}
    assert len(out) == len(wave)
