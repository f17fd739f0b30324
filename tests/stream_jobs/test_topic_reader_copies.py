"""The protected topic as ``privgw attack --bootstrap`` reads it: one copy of each record id.

After a crash the worker publishes some records again, byte-identical under the same
``record_id`` header (docs/reliability.md); after a restore, again under the header
``supersedes: true``, and a consumer keeps the marked copy (docs/operating.md). Read with the
copies, a respondent's sticky values repeat within a release and the intruder stops following
it (probe intruder §6b: 141 chains read from the topic, 341 from the deduplicated file).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from confluent_kafka import Producer

from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.delivery.meta import meta_message
from stream_jobs.delivery.topic_reader import count_protected, last_copies, read_protected

ROOT = Path(__file__).resolve().parents[2]


def _message(rid: str | None, value: dict[str, object], *, marked: bool = False) -> SimpleNamespace:
    headers = [] if rid is None else [("record_id", rid.encode()), ("policy_version", b"v1")]
    if marked:
        headers.append(("supersedes", b"true"))
    return SimpleNamespace(headers=headers, value=orjson.dumps(value))


def test_one_copy_of_each_record_id_the_marked_one_winning() -> None:
    a, b = _message("1-a", {"x": 1}), _message("1-b", {"x": 2})
    b_again = _message("1-b", {"x": 2})  # a replay: the same bytes
    b_marked = _message("1-b", {"x": 3}, marked=True)  # protected again after a restore
    c, c_later = _message("1-c", {"x": 4}), _message("1-c", {"x": 5})
    bare, bare_again = _message(None, {"x": 6}), _message(None, {"x": 6})
    kept = last_copies([a, b, b_marked, b_again, c, bare, c_later, bare_again])
    # the marked copy wins over a later unmarked one; else the last copy read; no header: kept
    assert kept == [a, b_marked, bare, c_later, bare_again]
    assert last_copies([]) == []


def _send(bootstrap: str, topic: str, items: list[tuple[bytes, list[tuple[str, bytes]]]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for value, headers in items:
        producer.produce(topic, value=value, headers=headers)
    assert producer.flush(30) == 0


@pytest.mark.broker
def test_attack_on_a_topic_drops_the_replayed_copies(
    broker: EmbeddedBroker, unique_name: str
) -> None:
    topic = f"{unique_name}.protected"
    rows = [
        {"record_id": f"{w}-{i}", "wave": w, "age": 30 + 10 * (i // 3), "occ": f"o{i}"}
        for w in (1, 2)
        for i in range(6)
    ]
    items = [(orjson.dumps(r), [("record_id", str(r["record_id"]).encode())]) for r in rows]
    _send(broker.bootstrap, topic, [*items, *items[4:9]])  # a crash replays five records
    _, value, headers = meta_message({"policy_version": "v1", "k": 3})
    _send(broker.bootstrap, f"{topic}.meta", [(value, headers)])

    _, read = read_protected(broker.bootstrap, topic, timeout=5.0)
    assert sorted(str(r["record_id"]) for r in read) == sorted(str(r["record_id"]) for r in rows)

    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "attack", "--bootstrap", broker.bootstrap,
         "--topic", topic, "--sticky", "occ", "--qi", "age", "--json"],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = orjson.loads(proc.stdout)
    assert result["records"] == 12 and "duplicates_dropped" not in result
    # every respondent followed over both releases, each in its class of three (was 1 chain:
    # the replayed ones repeated within their release)
    assert result["sticky_linkage"]["chains"] == 6
    assert result["sticky_linkage"]["smallest_candidate_sets"] == [3] * 6


@pytest.mark.broker
def test_reconstruct_on_a_topic_counts_one_copy_of_each_record(
    broker: EmbeddedBroker, unique_name: str
) -> None:
    """``privgw reconstruct --bootstrap`` folds the topic as it reads it, and counted every
    copy: after a restore, 9,837 rows for 5,727 records (the replayed range weighed twice, its
    standard errors too small). The copy a consumer keeps is counted, the marked one winning."""
    topic = f"{unique_name}.protected"
    rows = [{"record_id": f"{w}-{i}", "wave": w} for w in (1, 2) for i in range(6)]
    version = [("policy_version", b"v1")]
    items = [
        (orjson.dumps(r), [("record_id", str(r["record_id"]).encode()), *version]) for r in rows
    ]
    marked = (  # "1-0" protected again after a restore, its copy now of wave 2
        orjson.dumps({"record_id": "1-0", "wave": 2}),
        [("record_id", b"1-0"), *version, ("supersedes", b"true")],
    )
    _send(broker.bootstrap, topic, [*items, *items[4:9], marked, items[0]])
    meta = {"policy_version": "v1", "k": 3, "republication": {"wave_attribute": "wave"}}
    _, value, headers = meta_message(meta)
    _send(broker.bootstrap, f"{topic}.meta", [(value, headers)])
    assert count_protected(broker.bootstrap, topic, timeout=5.0).rows == {"v1": 12}
    by_wave = [count_protected(broker.bootstrap, topic, timeout=5.0, wave=w).rows for w in (1, 2)]
    assert by_wave == [{"v1": 5}, {"v1": 7}]  # the marked copy, not the later unmarked one
