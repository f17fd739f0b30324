"""The partitioned backend's changelog on the real broker: a RocksStore written through
KafkaChangelog can be rebuilt, entry for entry, by a worker that never saw it (a partition
moving to another worker), and only from the partitions that worker restores; a panel roster
larger than a Kafka record goes through it in parts."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from aiokafka.admin import NewTopic

from gateway.panel.carried import CarryBlock
from gateway.panel.roster import Roster, Sealer, read_roster, roster_entries, roster_key
from gateway.state_store.state_codec import encode_state
from gateway.state_store.state_keys import state_key_partition
from state.rocks_store import RocksStore
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.kafka import create_missing_topics, make_producer
from stream_jobs.partitions.changelog import KafkaChangelog, restore_partitions
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
    # one store per partition, as the partitioned backend keeps them; its keys as the engine
    # writes them (the partition in front of the digest), values as it encodes them
    sources = {
        p: RocksStore(tmp / f"source-{p}", changelog=KafkaChangelog(producer, loop, topic, [p]))
        for p in range(PARTITIONS)
    }
    try:
        keys = [
            (i % PARTITIONS).to_bytes(2, "big") + hashlib.sha256(b"respondent %d" % i).digest()
            for i in range(3000)
        ]
        for start in range(0, 3000, 700):  # batches, as windows write them
            for p, store in sources.items():
                batch = {
                    k: encode_state({"v": 1, "i": i})
                    for i, k in enumerate(keys[start : start + 700])
                    if state_key_partition(k) == p
                }
                await loop.run_in_executor(None, store.put_many, batch)
        # a later window overwrites some: the changelog's later entries must win
        for p, store in sources.items():
            later = {k: encode_state({"v": 2}) for k in keys[:500] if state_key_partition(k) == p}
            await loop.run_in_executor(None, store.put_many, later)
        expected = {k: v for store in sources.values() for k, v in store.items()}
    finally:
        for store in sources.values():
            store.close()
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
    owned = {k: v for k, v in expected.items() if state_key_partition(k) in (0, 2)}
    assert dict(mine.items()) == owned
    assert 0 < len(owned) < len(expected)
    mine.close()


def test_a_store_is_rebuilt_from_its_changelog(
    broker: EmbeddedBroker, unique_name: str, tmp_path: Path
) -> None:
    asyncio.run(_round_trip(broker.bootstrap, f"{unique_name}.state-changelog", tmp_path))


# the values a member of the Adult panel is carried forward with
ADULT_LIKE = {
    "workclass": "Self-emp-not-inc",
    "education": "Some-college",
    "marital_status": "Married-civ-spouse",
    "occupation": "Exec-managerial",
    "relationship": "Husband",
    "race": "Asian-Pac-Islander",
    "sex": "Female",
    "native_country": "United-States",
    "income": ">50K",
}


async def _roster_round_trip(bootstrap: str, topic: str, tmp: Path) -> None:
    """A panel roster of 6,000 members (1.2 MB), then of 7,000, goes through the changelog in
    parts each under Kafka's default 1 MiB record limit, and is restored
    whole."""
    settings = WorkerSettings(bootstrap=bootstrap)
    await create_missing_topics(
        settings,
        [NewTopic(topic, 2, 1, topic_configs={"cleanup.policy": "compact"})],
    )
    producer = make_producer(settings)
    await producer.start()
    loop = asyncio.get_running_loop()
    sealer, key = Sealer(hashlib.sha256(b"carry").digest()), roster_key(1)
    # partition 1's store, written through its changelog partition, as the backend keeps it
    source = RocksStore(tmp / "source", changelog=KafkaChangelog(producer, loop, topic, [1]))
    roster = Roster()
    try:
        for wave, members in ((1, 6000), (2, 1000)):  # two writes: the parts change slot
            start = len(roster.keys)
            names = [*ADULT_LIKE, "hours"]
            carried = [[ADULT_LIKE[n]] * members for n in ADULT_LIKE] + [
                [i % 60 for i in range(members)]
            ]
            roster.add_many(
                [hashlib.sha256(b"member %d" % i).digest() for i in range(start, start + members)],
                [i // 5 for i in range(start, start + members)],
                wave=wave,
                claim=[[30.0 + i % 40 for i in range(members)], ["Private"] * members],
                carry=CarryBlock(roster.carried.names_id(names), carried),
                sampling=[1.25] * members,
            )
            entries = roster_entries(roster, sealer, key)
            assert sum(map(len, entries.values())) > 1024 * 1024  # more than one Kafka record
            assert max(map(len, entries.values())) < 1024 * 1024  # each one a Kafka record
            await loop.run_in_executor(None, source.put_many, entries)
            roster = read_roster(source.get_many, key, sealer)
    finally:
        source.close()
        await producer.stop()

    restored = RocksStore(tmp / "restored")
    await restore_partitions({1: restored}, settings, topic)
    back = read_roster(restored.get_many, key, sealer)
    assert back.keys == roster.keys and back.carried == roster.carried and len(back.keys) == 7000
    assert back.generation == 2
    restored.close()


def test_a_panel_roster_goes_through_the_changelog_in_parts(
    broker: EmbeddedBroker, unique_name: str, tmp_path: Path
) -> None:
    asyncio.run(_roster_round_trip(broker.bootstrap, f"{unique_name}.roster-changelog", tmp_path))
