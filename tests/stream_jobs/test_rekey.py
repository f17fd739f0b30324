"""Input without keys, policy ``input.key_field``: the worker re-keys through a repartition topic
(issue: scale-out, item 1), so that every record of a respondent lands on one partition — the
one whose worker holds the respondent's state — and is protected when it comes back from there.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from aiokafka.partitioner import DefaultPartitioner
from confluent_kafka import Consumer, TopicPartition
from streamkit import (
    Sent,
    assert_consistent_republication,
    consume_all,
    k_claim,
    make_worker,
    produce,
    regroup_policy_path,
    run_until,
    settings_for,
)

from gateway.policy import load_policy
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.kafka import ensure_topics

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


def _keyed_by_field_policy(tmp: Path) -> Path:
    text = (regroup_policy_path()).read_text()
    old = (
        "  respondent_id: respondent_id        # the record key; never published (pseudonym: drop)"
    )
    assert old in text, "the Adult policy's input section changed: update this test"
    path = tmp / "policy.yaml"
    path.write_text(text.replace(old, "  key_field: respondent_id\n" + old))
    return path


def test_keyless_records_are_rekeyed_by_respondent_and_then_protected(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    policy = load_policy(_keyed_by_field_policy(tmp_path))
    settings = settings_for(broker.bootstrap, unique_name, tmp_path / "state")
    topics = settings.topics(policy)
    assert topics.repartition == f"{topics.input}.repartition"
    asyncio.run(ensure_topics(settings, topics, input_too=True))
    panel = PanelSurvey(respondents=600, waves=3, seed=8, new_share=0.0, rows=load_rows())
    records = [(None, value) for _, value in (encode(r) for r in panel.records())]
    no_id = orjson.dumps({**orjson.loads(records[0][1]), "respondent_id": None})
    records.append((None, no_id))  # invalid before any re-keying: DLQ missing_field
    n = len(records)
    sent = produce(broker.bootstrap, topics.input, records)
    ends: dict[int, int] = {}
    for rec in sent:
        ends[rec.partition] = max(ends.get(rec.partition, 0), rec.offset + 1)

    worker = make_worker(policy, settings, secret_env)

    def done(w: object) -> bool:
        st = w.stats  # type: ignore[attr-defined]
        return st.consumed >= 2 * n - 1 and st.consumed == st.accounted  # held ones count

    assert asyncio.run(run_until(worker, done, timeout=60)) == 0
    st = worker.stats
    assert st.repartitioned == n - 1
    assert st.consumed == 2 * n - 1  # every valid record read twice: input, then repartition
    assert st.published + st.held == n - 1 and dict(st.dlq) == {"missing_field": 1}

    forwarded = consume_all(broker.bootstrap, topics.repartition or "", expected=n - 1)
    assert len(forwarded) == n - 1
    partitions_of: dict[bytes, set[int]] = {}
    for m in forwarded:
        truth = orjson.loads(m.value or b"")
        assert m.key == str(truth["respondent_id"]).encode()
        partitions_of.setdefault(m.key, set()).add(m.partition)
    assert all(len(p) == 1 for p in partitions_of.values()), "a respondent on two partitions"
    default = DefaultPartitioner()  # where a Java or aiokafka producer puts the same key
    assert all(m.partition == default(m.key, [0, 1, 2], [0, 1, 2]) for m in forwarded)
    assert len({p for ps in partitions_of.values() for p in ps}) == 3

    out = consume_all(broker.bootstrap, topics.output, expected=st.published)
    first = {m.headers["record_id"]: m.value or b"" for m in out}
    source = {
        f"{topics.repartition}/{m.partition}/{m.offset}".encode(): Sent(
            m.key, m.value, m.partition, m.offset
        )
        for m in forwarded
    }
    assert len(first) == st.published
    assert set(first) <= set(source)  # protected as read back from the repartition topic
    checked = assert_consistent_republication(
        first, source, rr=("occupation", "income"), qis=k_claim()
    )
    assert checked > 1000

    # the input's offsets were committed past everything (after the forwards were acked)
    reader = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": settings.group_id})
    try:
        committed = reader.committed(
            [TopicPartition(topics.input, p) for p in range(3)], timeout=10
        )
    finally:
        reader.close()
    assert {tp.partition: tp.offset for tp in committed if tp.offset >= 0} == ends
