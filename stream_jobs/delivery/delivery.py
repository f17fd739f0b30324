"""Producing and committing: a window's outputs out, acknowledged, then its offsets committed.

Delivery (DESIGN §6): a window's protected records, dead letters and forwards are produced with
acks=all (``send_batch`` per partition, from the event loop); a settling task awaits every
acknowledgement and only then commits, per partition, the offsets the window buffer returned
for it. At most one window is settling; the next window's outputs are produced only after it
(:meth:`Delivery.settled`), so outputs and commits stay in window order.

A broker that is away is waited for: an unacknowledged window is sent again (byte-identical
copies with the same record ids) and a failed commit retried, until the broker is back or the
worker stops (then the offsets stay uncommitted and the next run replays them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
)

from gateway.engine.records import PublishedRecord
from stream_jobs.intake.dlq import DeadLetter
from stream_jobs.kafka import BatchItem, partitions_for_keys, send_batches
from stream_jobs.ops.worker_stats import WorkerStats
from stream_jobs.partitions.partition_state import SUPERSEDES, PartitionStateGuard
from stream_jobs.settings import Topics
from stream_jobs.shutdown import BrokerAway, StopDeadline
from stream_jobs.windows.windows import TP, WindowBuffer

log = logging.getLogger(__name__)

_RETRY_FIRST_S, _RETRY_MAX_S = 0.5, 10.0  # backoff while the broker is unreachable

# a keyless record forwarded to be re-keyed: (key, raw value, source partition, source offset)
Forward = tuple[bytes, bytes, int, int]


def _transient(err: KafkaError) -> bool:
    """Worth waiting for: the broker is away or moving leaders (a batch that expired while it
    was away raises KafkaTimeoutError, which aiokafka does not mark retriable). Anything else —
    authorization, a record the broker refuses — fails the worker: offsets stay uncommitted,
    and retrying forever would only hide it."""
    return bool(err.retriable) or isinstance(err, KafkaTimeoutError | KafkaConnectionError)


class Delivery:
    """The worker's producer side and its commits. ``open`` at start, ``consumer`` once the
    group's consumer exists (commits go through it)."""

    def __init__(
        self,
        topics: Topics,
        version: str,
        *,
        buffer: WindowBuffer,
        stats: WorkerStats,
        deadline: StopDeadline,
        stopping: asyncio.Event,
    ) -> None:
        self.topics = topics
        self._version_b = version.encode()
        self._buffer = buffer
        self._stats = stats
        self._deadline = deadline
        self._stopping = stopping
        self.producer: Any = None
        self.consumer: Any = None
        # sqlite backend: the ledger of processed offsets, written before each commit
        self.partition_guard: PartitionStateGuard | None = None
        self._out_partitions: list[int] = []
        self._dlq_partitions: list[int] = []
        self._repartition_partitions: list[int] = []
        self._inflight: asyncio.Task[None] | None = None  # the window awaiting its acks

    async def open(self, producer: Any) -> None:
        """Produce through ``producer``, to the partitions its topics have now."""
        self.producer = producer
        self._out_partitions = sorted(await producer.partitions_for(self.topics.output))
        self._dlq_partitions = sorted(await producer.partitions_for(self.topics.dlq))
        rekey = self.topics.repartition
        if rekey is not None:
            self._repartition_partitions = sorted(await producer.partitions_for(rekey))

    # -- one window ----------------------------------------------------------------------
    async def deliver(  # noqa: PLR0917
        self,
        published: Sequence[PublishedRecord],
        window_id: str,
        dead: Sequence[DeadLetter],
        forward: Sequence[Forward],
        commits: dict[TP, int],
        settled: Callable[[], None],
    ) -> None:
        """Hand a window's outputs to the producer now; their acknowledgement and the commit
        of ``commits`` after it run in the background (:meth:`_settle`), then ``settled``.
        The window before must be settled already (:meth:`settled`)."""

        async def send() -> list[Awaitable[Any]]:
            futures: list[Awaitable[Any]] = []
            if published:
                futures += await self._produce(published, window_id)
            if dead:
                futures += await self._produce_dead(dead)
            if forward:
                futures += await self._produce_forward(forward)
            return futures

        futures = await send()
        self._inflight = asyncio.create_task(
            self._settle(send, futures, commits, settled), name="privgw-settle"
        )

    async def _settle(
        self,
        send: Callable[[], Awaitable[list[Awaitable[Any]]]],
        futures: list[Awaitable[Any]],
        commits: dict[TP, int],
        settled: Callable[[], None],
    ) -> None:
        """Await the broker's acknowledgement of a window's outputs, then commit past them.

        A broker that is away (outage, restart, leader move) is waited for, not fatal: an
        unacknowledged window is sent again — the copies are byte-identical and carry the same
        record ids — and a failed commit is retried, until the broker is back or the worker
        is stopped (then the offsets stay uncommitted and the next run replays them)."""
        delay = _RETRY_FIRST_S
        while futures:
            try:
                await self._deadline.race(asyncio.gather(*futures))
                self._stats.broker_ok = True
                break
            except KafkaError as err:
                delay = await self._back_off(err, "outputs of a window not acknowledged", delay)
                with contextlib.suppress(KafkaError):
                    futures = await send()
        delay = _RETRY_FIRST_S
        tag = ""  # who commits (partition_state): this state directory's id
        if commits and self.partition_guard is not None:
            self.partition_guard.before_commit(commits)
            tag = self.partition_guard.commit_metadata
        while commits:
            try:
                await self._deadline.race(
                    self.consumer.commit(
                        {TopicPartition(t, p): (offset, tag) for (t, p), offset in commits.items()}
                    )
                )
            except (CommitFailedError, IllegalStateError) as err:
                # the partitions moved to another member meanwhile: it replays from the last
                # commit, and replays are identical
                log.info("commit skipped (%s): partitions reassigned", err.__class__.__name__)
                break
            except KafkaError as err:
                delay = await self._back_off(err, "commit failed", delay)
                continue
            self._buffer.committed(commits)
            self._stats.commits += 1
            self._stats.broker_ok = True
            break
        settled()

    async def _back_off(self, err: KafkaError, what: str, delay: float) -> float:
        """Wait ``delay`` before trying again if ``err`` is worth waiting out (else re-raise it);
        returns the next delay."""
        if not _transient(err):
            raise err
        if self._stopping.is_set():  # a stop does not wait out the broker: read again later
            self._deadline.give_up()
            raise BrokerAway from err
        log.warning("%s (%s); trying again in %.1f s", what, err.__class__.__name__, delay)
        self._stats.retries += 1
        self._stats.broker_ok = False  # not ready; still live: waiting out the broker is
        self._stats.loop_tick = time.monotonic()  # deliberate, a restart would not help
        await asyncio.sleep(delay)
        return min(delay * 2, _RETRY_MAX_S)

    def settling_done(self) -> bool:
        """Whether a window is settling and has finished (:meth:`settled` returns at once)."""
        return self._inflight is not None and self._inflight.done()

    async def settled(self) -> None:
        """Wait for the window in flight, if any; its failure is the worker's failure."""
        task, self._inflight = self._inflight, None
        if task is not None:
            await task

    def abandon(self) -> None:
        """Forget the window in flight (a stop that gave up waiting for the broker)."""
        self._inflight = None

    # -- producing -------------------------------------------------------------------------
    def _out_partitions_of(self, published: Sequence[PublishedRecord]) -> list[int]:
        """Each output record's partition: by its key as Kafka's default partitioner puts it,
        all keys of the window hashed at once; without a key, the input partition's
        counterpart, which keeps a respondent's records in order (the input is keyed by
        respondent); without either, by its record id."""
        parts = self._out_partitions
        # a record with neither key nor source (a panel wave's, imputed or not: none carries an
        # input position) is spread by its record id
        keys = [
            rec.key if rec.key is not None else rec.record_id.encode()
            for rec in published
            if rec.key is not None or rec.source is None
        ]
        hashed = iter(partitions_for_keys(keys, parts) if keys else ())
        return [
            next(hashed)
            if rec.key is not None or rec.source is None
            else parts[rec.source.partition % len(parts)]
            for rec in published
        ]

    async def _produce(
        self, published: Sequence[PublishedRecord], window_id: str
    ) -> list[Awaitable[Any]]:
        wid = window_id.encode()
        ver = self._version_b
        guard = self.partition_guard
        # a panel's outputs name no input record: while a restored range is protected again,
        # each may be one of its records (its record id keyed per respondent and wave)
        unsourced_again = guard is not None and guard.republishing()
        by_partition: dict[int, list[BatchItem]] = {}
        for rec, partition in zip(published, self._out_partitions_of(published), strict=True):
            ts = rec.source.timestamp_ms if rec.source is not None else -1
            headers = [("record_id", rec.record_id.encode()), ("policy_version", ver)]
            headers.append(("window_id", wid))
            src = rec.source
            if (guard and src and guard.superseding((src.topic, src.partition), src.offset)) or (
                src is None and unsourced_again
            ):
                headers.append(SUPERSEDES)  # protected again after a restore
            by_partition.setdefault(partition, []).append(
                (rec.key, rec.value, ts if ts >= 0 else None, headers)
            )
        return await self._send_batches(self.topics.output, by_partition)

    async def _produce_forward(self, forward: Sequence[Forward]) -> list[Awaitable[Any]]:
        topic = self.topics.repartition
        assert topic is not None
        parts = self._repartition_partitions
        source = self.topics.input.encode()
        by_partition: dict[int, list[BatchItem]] = {}
        targets = partitions_for_keys([key for key, _, _, _ in forward], parts)
        for (key, value, partition, offset), target in zip(forward, targets, strict=True):
            headers = [
                ("source_topic", source),
                ("source_partition", str(partition).encode()),
                ("source_offset", str(offset).encode()),
            ]
            by_partition.setdefault(target, []).append((key, value, None, headers))
        return await self._send_batches(topic, by_partition)

    async def _produce_dead(self, dead: Sequence[DeadLetter]) -> list[Awaitable[Any]]:
        parts = self._dlq_partitions
        by_partition: dict[int, list[BatchItem]] = {}
        for d in dead:
            by_partition.setdefault(parts[d.partition % len(parts)], []).append(
                (d.key, d.value, d.timestamp_ms, d.headers)
            )
        return await self._send_batches(self.topics.dlq, by_partition)

    async def _send_batches(
        self, topic: str, by_partition: dict[int, list[BatchItem]]
    ) -> list[Awaitable[Any]]:
        return await send_batches(self.producer, topic, by_partition)
