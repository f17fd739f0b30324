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

from gateway.errors import PrivgwError
from gateway.state_store.state_codec import decode_state
from gateway.state_store.state_keys import state_key_partition
from state.changelog import FINGERPRINT_ENTRY, META_ENTRY_PREFIX
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


class RestoreError(PrivgwError):
    """A changelog partition that cannot be restored: the worker stops before it publishes."""


class _Audit:
    """What a restore must refuse: a tombstone (the gateway never deletes a respondent's state:
    its next record would draw fresh values, which an averaging intruder exploits), a value that
    does not decode, a key of another partition. Each is forgiven when a later valid record of
    the same key supersedes it (the repair: produce the key's good value again)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.bad: dict[tuple[int, bytes], tuple[int, str]] = {}  # -> (offset, what)

    def check(self, partition: int, messages: list[Any]) -> list[tuple[bytes, bytes]]:
        entries: list[tuple[bytes, bytes]] = []
        for m in messages:
            key, value = m.key, m.value
            problem = _problem(partition, key, value)
            if problem is not None:
                self.bad.setdefault((partition, key or b""), (m.offset, problem))
                continue
            self.bad.pop((partition, key), None)
            entries.append((key, value))
        return entries

    def raise_unresolved(self) -> None:
        if not self.bad:
            return
        (partition, _), (offset, what) = min(self.bad.items(), key=lambda kv: kv[1][0])
        more = f" (and {len(self.bad) - 1} more)" if len(self.bad) > 1 else ""
        raise RestoreError(
            f"changelog {self.topic} partition {partition} offset {offset}: {what}{more}; the "
            "state cannot be restored, so nothing was published. Repair: produce the key's last "
            "good value again (a later record supersedes it), or start with a new --group-id"
        )


def _problem(partition: int, key: bytes | None, value: bytes | None) -> str | None:
    if not key:
        return "a record without a key"
    if value is None:
        return "a tombstone (null value); the gateway never deletes a respondent's state"
    if key == FINGERPRINT_ENTRY:
        return None if value else "an empty key fingerprint"
    if key.startswith(META_ENTRY_PREFIX):  # a fact about the partition (its draw derivation)
        return None if value else "an empty state fact"
    owner = state_key_partition(key)
    if owner != partition:
        return f"a key of state partition {owner}" if owner is not None else "a foreign key"
    try:
        decode_state(value)
    except Exception:  # a corrupt value, whatever the decoder raises
        return "a value that does not decode"
    return None


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
    audit = _Audit(topic)
    try:
        await consumer.topics()  # fresh metadata
        have = consumer.partitions_for_topic(topic) or set()
        missing = sorted(set(stores) - set(have))
        if missing:
            raise RestoreError(
                f"changelog {topic} has no partition {missing[0]} (it has {len(have)}): the state "
                "of that partition cannot be restored; see the partition count check at start"
            )
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
                entries = audit.check(tp.partition, messages)
                # the store's synced writes block: off the loop, which keeps serving
                await loop.run_in_executor(None, stores[tp.partition].restore, iter(entries))
                total += len(messages)
                remaining -= len(messages)
            now = time.monotonic()
            if progress is not None:
                progress(max(0, remaining))
            if now - last_report >= _PROGRESS_EVERY_S:
                log.info("restore of %s: %d records remaining", topic, max(0, remaining))
                last_report = now
        audit.raise_unresolved()
        if progress is not None:
            progress(0)
        log.info("restored %d changelog records of %s", total, topic)
        return total
    finally:
        await consumer.stop()
