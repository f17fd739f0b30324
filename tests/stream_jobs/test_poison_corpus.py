"""Poison records among valid ones (DESIGN §6): every bad record ends in the dead-letter topic
with the right reason and its source coordinates, every valid one is published, and the
worker never stops."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import orjson
import pytest
from streamkit import (
    accounted,
    consume_all,
    create_topics,
    make_worker,
    produce,
    regroup_policy_path,
    run_until,
    settings_for,
)

from gateway.policy import load_policy, policy_from_yaml
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows, poison_corpus
from stream_jobs.intake.dlq import TRUNCATED_PREFIX_BYTES

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


def test_every_poison_class_is_dead_lettered_with_its_reason_and_coordinates(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    policy = load_policy(regroup_policy_path())
    settings = settings_for(broker.bootstrap, unique_name, tmp_path, flush_held_on_shutdown=True)
    topics = settings.topics(policy)
    create_topics(policy, settings)
    panel = list(PanelSurvey(respondents=1000, waves=2, seed=4, rows=load_rows()).records())
    bad = [item for _ in range(3) for item in poison_corpus(panel[0])]
    mixed: list[tuple[str | None, bytes | None, bytes | None]] = [(None, *encode(r)) for r in panel]
    rng = random.Random(7)
    for item in bad:
        mixed.insert(rng.randrange(len(mixed) + 1), item)
    sent: list = []

    def feed() -> None:
        sent.extend(
            produce(
                broker.bootstrap,
                topics.input,
                [(k, v) for _, k, v in mixed],
                message_max_bytes=4_000_000,
            )
        )

    worker = make_worker(policy, settings, secret_env)
    code = asyncio.run(run_until(worker, lambda w: accounted(w, len(mixed)), during=feed))
    assert code == 0
    assert worker.stats.consumed == len(mixed)

    expected = {
        f"{topics.input}/{s.partition}/{s.offset}": reason
        for s, (reason, _, _) in zip(sent, mixed, strict=True)
    }
    dlq = consume_all(broker.bootstrap, topics.dlq, expected=len(bad), timeout=60)
    out = consume_all(broker.bootstrap, topics.output, expected=len(panel), timeout=60)
    got = {}
    for m in dlq:
        h = {k: v.decode() for k, v in m.headers.items()}
        coord = f"{h['source_topic']}/{h['source_partition']}/{h['source_offset']}"
        got[coord] = h["reason"]
        assert h["error_class"] and h["policy_version"] == policy.version
        if h["reason"] == "too_large":  # a prefix, and what identifies the whole record
            assert h["truncated"] == "1" and len(m.value or b"") == TRUNCATED_PREFIX_BYTES
            assert int(h["original_size"]) > settings.max_message_bytes
            assert len(h["original_sha256"]) == 64
        else:
            assert "truncated" not in h
    assert got == {c: r for c, r in expected.items() if r is not None}
    published = {m.headers["record_id"].decode() for m in out}
    assert published == {c for c, r in expected.items() if r is None}
    assert worker.stats.dlq_total == len(bad)
    print(f"poison corpus: {len(mixed)} in, {len(published)} out, {len(got)} DLQ, 0 lost")


def test_a_timestamp_outside_utc_is_dead_lettered_and_the_stream_goes_on(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    """Issue 45, item 1: under `coarsen: {unit: hour}` one such record made the engine raise
    OverflowError, and every restart failed the same way (0 published, 0 dead-lettered)."""
    text = (regroup_policy_path()).read_text()
    policy = policy_from_yaml(text.replace("coarsen: {unit: day}", "coarsen: {unit: hour}"))
    settings = settings_for(broker.bootstrap, unique_name, tmp_path, flush_held_on_shutdown=True)
    topics = settings.topics(policy)
    create_topics(policy, settings)
    panel = list(PanelSurvey(respondents=200, waves=1, seed=5, rows=load_rows()).records())
    extreme = (b'"9999-12-31T23:00:00-01:00"', b'"0001-01-01T00:30:00+01:00"')
    bad = [item for item in poison_corpus(panel[0]) if any(e in (item[2] or b"") for e in extreme)]
    assert len(bad) == 2
    mixed = [*bad, *((None, *encode(r)) for r in panel), *bad]  # first in the first window
    worker = make_worker(policy, settings, secret_env)

    def feed() -> None:
        produce(broker.bootstrap, topics.input, [(k, v) for _, k, v in mixed])

    code = asyncio.run(run_until(worker, lambda w: accounted(w, len(mixed)), during=feed))
    assert code == 0
    dlq = consume_all(broker.bootstrap, topics.dlq, expected=len(bad) * 2, timeout=60)
    out = consume_all(broker.bootstrap, topics.output, expected=len(panel), timeout=60)
    headers = [{k: v.decode() for k, v in m.headers.items()} for m in dlq]
    assert [(h["reason"], h["field"]) for h in headers] == [("out_of_range", "submitted_at")] * 4
    assert all("9999-12-31" not in str(h) and "0001-01-01" not in str(h) for h in headers)
    assert len(out) == len(panel) and worker.stats.dlq_total == 4
    hours = {orjson.loads(m.value or b"{}").get("submitted_at") for m in out}
    assert all(h is None or h.endswith("+00:00") for h in hours)  # published in UTC, hourly
