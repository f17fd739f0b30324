"""A Kafka key that is not the record's respondent id: the key picks the partition, and so where
the respondent's state lives; a second key would give the respondent a second state (with the
partitioned backend, on another partition: unchanged answers republished differently). Such a
record goes to the dead-letter topic (reason key_mismatch), or, when the policy names
``input.key_field``, is re-keyed by the respondent like a keyless one."""

from __future__ import annotations

import asyncio
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
)
from streamkit import settings_for as _settings_for

from gateway.policy import load_policy
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
ADULT = regroup_policy_path()


def _panel_with_wrong_keys() -> tuple[list[tuple[bytes, bytes]], set[int]]:
    """A 2-wave panel keyed by respondent, where every 25th record carries the key of the next
    record's respondent instead; returns the records and the indexes of the wrong ones."""
    panel = [
        encode(r) for r in PanelSurvey(respondents=300, waves=2, seed=5, rows=load_rows()).records()
    ]
    wrong = set()
    for i in range(10, len(panel) - 1, 25):
        if panel[i][0] != panel[i + 1][0]:
            panel[i] = (panel[i + 1][0], panel[i][1])
            wrong.add(i)
    return panel, wrong


@pytest.mark.parametrize("backend", ["sqlite", "partitioned"])
def test_a_key_other_than_the_respondent_id_is_dead_lettered(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path, backend: str
) -> None:
    policy = load_policy(ADULT)
    settings = _settings_for(
        broker.bootstrap,
        unique_name,
        tmp_path,
        state_backend=backend,
        engine="thread",
        flush_held_on_shutdown=True,
    )
    topics = settings.topics(policy)
    create_topics(policy, settings)
    records, wrong = _panel_with_wrong_keys()
    assert len(wrong) > 20
    sent = produce(broker.bootstrap, topics.input, records)
    worker = make_worker(policy, settings, secret_env)
    assert asyncio.run(run_until(worker, lambda w: accounted(w, len(records)))) == 0
    assert dict(worker.stats.dlq) == {"key_mismatch": len(wrong)}

    coord = [f"{topics.input}/{s.partition}/{s.offset}" for s in sent]
    dlq = consume_all(broker.bootstrap, topics.dlq, expected=len(wrong))
    out = consume_all(broker.bootstrap, topics.output, expected=len(records) - len(wrong))
    dead = {}
    for m in dlq:
        h = {k: v.decode() for k, v in m.headers.items()}
        dead[f"{h['source_topic']}/{h['source_partition']}/{h['source_offset']}"] = h["reason"]
    published = {m.headers["record_id"].decode() for m in out}
    assert dead == {coord[i]: "key_mismatch" for i in wrong}
    # every input offset is accounted for exactly once: published or dead-lettered
    assert published == {c for i, c in enumerate(coord) if i not in wrong}
    assert len(out) == len(published)


def test_with_key_field_a_wrong_key_is_replaced_by_the_respondent_id(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    text = ADULT.read_text()
    anchor = "  respondent_id: respondent_id"
    assert anchor in text, "the Adult policy's input section changed: update this test"
    path = tmp_path / "policy.yaml"
    path.write_text(text.replace(anchor, "  key_field: respondent_id\n" + anchor, 1))
    policy = load_policy(path)
    settings = _settings_for(
        broker.bootstrap, unique_name, tmp_path / "state", flush_held_on_shutdown=True
    )
    topics = settings.topics(policy)
    create_topics(policy, settings)
    records, wrong = _panel_with_wrong_keys()
    produce(broker.bootstrap, topics.input, records)
    n = len(records)
    worker = make_worker(policy, settings, secret_env)

    def done(w: object) -> bool:
        st = w.stats  # type: ignore[attr-defined]
        return st.consumed >= n + len(wrong) and st.consumed == st.accounted

    assert asyncio.run(run_until(worker, done)) == 0
    st = worker.stats
    assert st.dlq_total == 0 and st.repartitioned == len(wrong)
    forwarded = consume_all(broker.bootstrap, topics.repartition or "", expected=len(wrong))
    assert len(forwarded) == len(wrong)
    for m in forwarded:  # re-keyed by the respondent the record is about
        assert m.key == str(orjson.loads(m.value or b"")["respondent_id"]).encode()
    out = consume_all(broker.bootstrap, topics.output, expected=n)
    assert len(out) == n
