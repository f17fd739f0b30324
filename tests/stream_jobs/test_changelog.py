"""The partitioned backend's changelog on the real broker: a RocksStore written through
KafkaChangelog can be rebuilt, entry for entry, by a worker that never saw it (a partition
moving to another worker), and only from the partitions that worker restores."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from aiokafka.admin import NewTopic

from state.rocks_store import RocksStore
from stream_jobs.broker import EmbeddedBroker
from stream_jobs.changelog import KafkaChangelog, restore_partitions
from stream_jobs.kafka import create_missing_topics, make_producer
from stream_jobs.settings import WorkerSettings

pytestmark = pytest.mark.broker

PARTITIONS = 4


async def _round_trip(bootstrap: str, topic: str, tmp: Path) -> None:
    settings = WorkerSettings(bootstrap=bootstrap)
    await create_missing_topics(
        settings,
        [NewTopic(topic, PARTITIONS, 1, topic_configs={"cleanup.policy": "compact"})],
    )
    producer = make_producer(settings)
    await producer.start()
    loop = asyncio.get_running_loop()
    changelog = KafkaChangelog(producer, loop, topic, list(range(PARTITIONS)))
    source = RocksStore(tmp / "source", changelog=changelog)
    try:
        keys = [hashlib.sha256(b"respondent %d" % i).digest() for i in range(3000)]
        for start in range(0, 3000, 700):  # batches, as windows write them
            batch = {k: b"state-v1-%d" % i for i, k in enumerate(keys[start : start + 700])}
            await loop.run_in_executor(None, source.put_many, batch)
        # a later window overwrites some: the changelog's later entries must win
        await loop.run_in_executor(None, source.put_many, {k: b"state-v2" for k in keys[:500]})
        expected = dict(source.items())
    finally:
        source.close()
        await producer.stop()

    remaining: list[int] = []
    everything = RocksStore(tmp / "everything")
    read = await restore_partitions(
        dict.fromkeys(range(PARTITIONS), everything), settings, topic, progress=remaining.append
    )
    assert read == 3500
    assert dict(everything.items()) == expected
    assert everything.count() == 3000
    assert 0 < remaining[0] <= 3500  # the end offsets are a lower bound on this broker
    assert remaining[-1] == 0
    everything.close()

    # a worker that takes over partitions 0 and 2 gets exactly their respondents
    mine = RocksStore(tmp / "mine")
    await restore_partitions({0: mine, 2: mine}, settings, topic)
    owned = {k: v for k, v in expected.items() if changelog.partition_of(k) in (0, 2)}
    assert dict(mine.items()) == owned
    assert 0 < len(owned) < len(expected)
    mine.close()


def test_a_store_is_rebuilt_from_its_changelog(
    broker: EmbeddedBroker, unique_name: str, tmp_path: Path
) -> None:
    asyncio.run(_round_trip(broker.bootstrap, f"{unique_name}.state-changelog", tmp_path))
