"""The Kafka side of the partitioned state backend: a compacted changelog topic.

``KafkaChangelog`` is the ``state.changelog.ChangelogWriter`` a ``RocksStore`` writes through:
every entry becomes one record (key = state key, value = the stored bytes) in a compacted topic,
acknowledged by the broker (acks=all) before ``put_many`` returns. It is called from the
engine's thread and sends on the worker's event loop.

``restore_partitions`` rebuilds a store from the changelog: it reads the given partitions from
the beginning up to their end offsets at the time of the call, applies the entries in order
(later ones win), and reports how many records remain, for the log and the
``privgw_restore_records_remaining`` gauge.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiokafka import TopicPartition
from aiokafka.admin import NewTopic

from stream_jobs.kafka import (
    BatchItem,
    create_missing_topics,
    make_consumer,
    partitions_for_keys,
    send_batches,
)
from stream_jobs.settings import WorkerSettings

if TYPE_CHECKING:  # rocksdict is an optional extra (privgw[rocksdb])
    from state.rocks_store import RocksStore

log = logging.getLogger(__name__)

_WRITE_TIMEOUT_S = 120.0
_RESTORE_BATCH = 20_000
_PROGRESS_EVERY_S = 2.0


class KafkaChangelog:
    """Writes a store's entries to ``topic``; the partition of an entry follows its key."""

    def __init__(
        self, producer: Any, loop: asyncio.AbstractEventLoop, topic: str, partitions: list[int]
    ) -> None:
        if not partitions:
            raise ValueError(f"changelog topic {topic} has no partitions")
        self._producer = producer
        self._loop = loop
        self.topic = topic
        self._partitions = sorted(partitions)

    def partition_of(self, key: bytes) -> int:
        return partitions_for_keys([key], self._partitions)[0]

    def write(self, entries: Mapping[bytes, bytes]) -> None:
        """From a thread other than the loop's: returns once every entry is acknowledged."""
        future = asyncio.run_coroutine_threadsafe(self.write_async(entries), self._loop)
        future.result(_WRITE_TIMEOUT_S)

    async def write_async(self, entries: Mapping[bytes, bytes]) -> None:
        by_partition: dict[int, list[BatchItem]] = {}
        keys = list(entries)
        for key, partition in zip(keys, partitions_for_keys(keys, self._partitions), strict=True):
            by_partition.setdefault(partition, []).append((key, entries[key], None, []))
        await asyncio.gather(*await send_batches(self._producer, self.topic, by_partition))


async def ensure_changelog_topic(settings: WorkerSettings, partitions: int) -> None:
    """Create the compacted changelog topic (one partition per input partition) if missing."""
    await create_missing_topics(
        settings,
        [
            NewTopic(
                settings.changelog_topic,
                partitions,
                settings.replication_factor,
                topic_configs={"cleanup.policy": "compact"},
            )
        ],
    )


async def restore_partitions(
    stores: Mapping[int, RocksStore],
    settings: WorkerSettings,
    topic: str,
    *,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Apply each partition of the changelog ``topic`` named in ``stores`` to its store (one
    store may serve several partitions); returns the records read.

    ``progress(remaining)`` is called as the restore goes (and with 0 at the end)."""
    consumer = make_consumer(settings, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(stores)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        begins = await consumer.beginning_offsets(tps)
        remaining = sum(max(0, ends[tp] - begins[tp]) for tp in tps)
        pending = set(tps)
        total, last_report = 0, time.monotonic()
        log.info("restoring %d changelog records of %s", remaining, topic)
        if progress is not None:
            progress(remaining)
        loop = asyncio.get_running_loop()
        # ends are only a lower bound: the development broker's high watermark can stop short
        # of the last batch, so a partition is done once it is past its end offset and a
        # fetch brings nothing more (nobody else writes a partition's changelog meanwhile)
        idle: set[TopicPartition] = set()
        while pending:
            batch = await consumer.getmany(*pending, timeout_ms=200, max_records=_RESTORE_BATCH)
            for tp in list(pending):
                if batch.get(tp):
                    idle.discard(tp)
                elif await consumer.position(tp) >= ends[tp]:
                    if tp in idle:
                        pending.discard(tp)
                    idle.add(tp)
            for tp, messages in batch.items():
                if not messages:
                    continue
                entries = [(m.key, m.value) for m in messages]
                # the store's synced writes block: off the loop, which keeps serving
                await loop.run_in_executor(None, stores[tp.partition].restore, iter(entries))
                total += len(entries)
                remaining -= len(entries)
            now = time.monotonic()
            if progress is not None:
                progress(max(0, remaining))
            if now - last_report >= _PROGRESS_EVERY_S:
                log.info("restore of %s: %d records remaining", topic, max(0, remaining))
                last_report = now
        if progress is not None:
            progress(0)
        log.info("restored %d changelog records of %s", total, topic)
        return total
    finally:
        await consumer.stop()
