"""Records the Kafka client cannot decode (``stream_jobs.intake.undecodable``): a header key
that is not UTF-8 failed aiokafka's whole fetch, and the worker exited at every restart, so one
record stopped the stream for good. Now such a record is dead-lettered at its coordinates and
every other record is published (real broker; the bad record is written with aiokafka's
pure-Python record builder, which sends a header key's bytes as given)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
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

from gateway.policy import load_policy
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

pytestmark = pytest.mark.broker

MARKER = b"\xff\xfeZq9"  # a header key that is not UTF-8; never in a log line or a header

# one record with MARKER as a header key, sent to a given partition; prints its offset
_SEND = """
import asyncio, os, sys
os.environ["AIOKAFKA_NO_EXTENSIONS"] = "1"  # the pure-Python builder encodes keys with .encode()
from aiokafka import AIOKafkaProducer

class RawKey(str):
    def encode(self, *args, **kwargs):
        return bytes.fromhex(sys.argv[5])

async def main(bootstrap, topic, partition, value):
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        sent = await producer.send_and_wait(
            topic, value.encode(), key=b"undecodable", partition=int(partition),
            headers=[(RawKey("x"), b"v")],
        )
        print(sent.offset)
    finally:
        await producer.stop()

asyncio.run(main(*sys.argv[1:5]))
"""


def _send_undecodable(bootstrap: str, topic: str, partition: int, value: bytes) -> int:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _SEND,
            bootstrap,
            topic,
            str(partition),
            value.decode(),
            MARKER.hex(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout.split()[-1])


def test_a_record_the_client_cannot_decode_is_dead_lettered_and_the_rest_published(
    broker: EmbeddedBroker,
    unique_name: str,
    secret_env: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = load_policy(regroup_policy_path())
    settings = settings_for(broker.bootstrap, unique_name, tmp_path, flush_held_on_shutdown=True)
    topics = settings.topics(policy)
    create_topics(policy, settings)
    panel = [
        encode(r) for r in PanelSurvey(respondents=300, waves=1, seed=8, rows=load_rows()).records()
    ]
    bad_at: list[int] = []

    def feed() -> None:
        # two on one partition, with valid records before, between and after them
        produce(broker.bootstrap, topics.input, panel[:100])
        for part in (panel[100:200], panel[200:]):
            bad_at.append(_send_undecodable(broker.bootstrap, topics.input, 0, part[0][1] or b""))
            produce(broker.bootstrap, topics.input, part)

    worker = make_worker(policy, settings, secret_env)
    total = len(panel) + 2
    with caplog.at_level(logging.DEBUG):
        code = asyncio.run(run_until(worker, lambda w: accounted(w, total), during=feed))
    assert code == 0
    assert worker.stats.consumed == total and worker.stats.dlq["invalid_utf8"] == 2
    dlq = consume_all(broker.bootstrap, topics.dlq, expected=2, timeout=60)
    out = consume_all(broker.bootstrap, topics.output, expected=len(panel), timeout=60)
    assert len(out) == len(panel)
    headers = [{k: v.decode() for k, v in m.headers.items()} for m in dlq]
    assert sorted(
        (h["reason"], h["source_partition"], int(h["source_offset"])) for h in headers
    ) == [("invalid_utf8", "0", offset) for offset in sorted(bad_at)]
    published = {orjson.loads(m.value or b"{}")["record_id"] for m in out}
    assert len(published) == len(panel)  # every valid record, once
    assert not any(MARKER.decode("latin-1") in r.getMessage() for r in caplog.records)
    assert not any(MARKER in v for m in dlq for v in m.headers.values())
