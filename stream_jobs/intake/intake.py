"""Consuming and validation: where each fetched record goes.

A fetched batch (aiokafka ``getmany``: thousands of records) is decoded and validated in one
pass. Each record then takes one of four ways, and its offset is covered by the next window's
commit whichever it takes:

- valid: into the window buffer (``stream_jobs.windows.windows``), to be protected;
- invalid: a dead letter, with its raw bytes and the reason (``stream_jobs.intake.dlq``);
- valid but keyless (or keyed by another respondent) where the policy re-keys
  (``input.key_field``): forwarded, keyed, to the repartition topic, protected when it comes
  back from there;
- with the partitioned backend, valid but on a partition whose state is not its own: forwarded
  to the repartition topic, or dead-lettered where there is none
  (``stream_jobs.partitions.state_routing``).

Dead letters and forwards wait here until their window is handed to the engine (:meth:`take`),
and go out with its outputs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiokafka import TopicPartition

from gateway.engine.records import SourceRef, ValidRecord
from gateway.policy import Policy
from gateway.validation import DLQReason, Rejection, Validator, rejection
from stream_jobs.delivery.delivery import Forward
from stream_jobs.intake.dlq import DeadLetter, dead_letter
from stream_jobs.intake.wave_control import WaveCloses, control_wave
from stream_jobs.ops.worker_stats import WorkerStats
from stream_jobs.partitions.state_routing import StateRouting
from stream_jobs.settings import Topics, WorkerSettings
from stream_jobs.windows.windows import WindowBuffer

log = logging.getLogger(__name__)

_NO_KEY_VALUE = rejection(DLQReason.MISSING_KEY)  # keyless, and the key field is missing too
_KEY_MISMATCH = rejection(DLQReason.KEY_MISMATCH)  # keyed, but not by the respondent
_WRONG_PARTITION = rejection(DLQReason.WRONG_PARTITION)  # its key's state lives elsewhere
_BAD_CONTROL = rejection(DLQReason.BAD_CONTROL)
_UNDECODABLE = rejection(DLQReason.INVALID_UTF8)  # a header key (stream_jobs.intake.undecodable)


async def seek_reset(consumer: Any, tp: TopicPartition, auto_offset_reset: str) -> None:
    """Where a partition with no usable position starts: as auto_offset_reset says."""
    if auto_offset_reset == "earliest":
        await consumer.seek_to_beginning(tp)
    else:
        await consumer.seek_to_end(tp)


async def seek_back(
    consumer: Any, tp: TopicPartition, auto_offset_reset: str, position: int | None = None
) -> None:
    """A partition to ``position``, else to its committed offset, else where
    auto_offset_reset says: to read again what a fetch advanced past."""
    if position is None:
        position = await consumer.committed(tp)
    if position is not None:
        consumer.seek(tp, position)
    else:
        await seek_reset(consumer, tp, auto_offset_reset)


class Intake:
    """The worker's consuming side: ``consumer`` once it exists, ``routing`` with the
    partitioned backend, ``on_buffered`` to see each run of valid records buffered."""

    def __init__(  # noqa: PLR0917
        self,
        policy: Policy,
        settings: WorkerSettings,
        topics: Topics,
        version: str,
        buffer: WindowBuffer,
        stats: WorkerStats,
    ) -> None:
        self.settings = settings
        self.topics = topics
        self.validator = Validator(
            policy, max_bytes=settings.max_message_bytes, max_depth=settings.max_depth
        )
        self._version = version
        self._buffer = buffer
        self._stats = stats
        self.consumer: Any = None
        self.routing: StateRouting | None = None  # the partitioned backend's (state_routing)
        # called with each partition's run of valid records once buffered (packing ahead)
        self.on_buffered: Callable[[list[ValidRecord]], None] | None = None
        self.dead: list[DeadLetter] = []
        # keyless records to re-key: (key, raw value, source partition, source offset)
        self.forward: list[Forward] = []
        self.wave_closes = WaveCloses()  # operators' closes of panel waves
        key_field = policy.input.key_field
        self._key_is_id = key_field is not None and key_field == policy.input.respondent_id
        self._key_field = key_field
        self._rerouted = False  # warned that records arrive on the wrong partition

    def take(self) -> tuple[list[DeadLetter], list[Forward]]:
        """The dead letters and forwards gathered since the last window: they go with it."""
        dead, self.dead = self.dead, []
        forward, self.forward = self.forward, []
        return dead, forward

    def ingest(self, batch: dict[TopicPartition, list[Any]], now: float) -> None:
        validate = self.validator.decode_and_validate
        add_batch = self._buffer.add_partition_batch
        stats = self._stats
        rekey_from = self.topics.input if self._key_field is not None else None
        key_field = self._key_field or ""
        expected_key = self.validator.expected_key
        for tp, messages in batch.items():
            topic, partition = tp.topic, tp.partition
            keyless_here = topic == rekey_from
            if messages and self._buffer.rewind((topic, partition), messages[0].offset):
                log.warning(
                    "%s/%d restarted at offset %d, below offsets already consumed: the broker "
                    "lost its log or the topic was recreated; commits start again from there",
                    topic,
                    partition,
                    messages[0].offset,
                )
            valid: list[ValidRecord] = []
            routed: list[tuple[Any, str | None, dict[str, object]]] | None = (
                [] if self.routing is not None else None
            )
            for m in messages:
                if m.headers and self._control(m, topic, partition, now):
                    continue
                res = validate(m.value, m.key)
                if res.__class__ is Rejection:
                    self._reject(res, m, topic, partition, now)  # type: ignore[arg-type]
                    continue
                rid, values = res  # type: ignore[misc]
                key = m.key
                # keyed by someone else: the respondent would get a second state elsewhere
                wrong = bool(key) and expected_key is not None and key != expected_key(rid, values)
                if keyless_here and (wrong or not key):  # the policy re-keys: a wrong key too
                    self._rekey(m, rid if self._key_is_id else values.get(key_field), topic, now)
                    continue
                if wrong:
                    self._reject(_KEY_MISMATCH, m, topic, partition, now)
                    continue
                if routed is not None:  # protected where its state lives (state_routing)
                    routed.append((m, rid, values))
                    continue
                valid.append(
                    ValidRecord(
                        rid, values, SourceRef(topic, partition, m.offset, m.timestamp), now
                    )
                )
            if routed:
                valid = self._route(routed, topic, partition, now)
            add_batch(valid)
            if self.on_buffered is not None and valid:
                self.on_buffered(valid)
            stats.consumed += len(messages)
            if messages:
                highwater = self.consumer.highwater(tp)
                if highwater is not None:
                    stats.lag[(topic, partition)] = max(0, highwater - messages[-1].offset - 1)
        stats.valid = stats.consumed - stats.dlq_total - stats.control

    def _control(self, m: Any, topic: str, partition: int, now: float) -> bool:
        """Whether ``m`` is an operator's control record (``stream_jobs.intake.wave_control``): a
        close is noted, one that cannot be read is dead-lettered."""
        try:
            wave = control_wave(m.headers, m.value)
        except ValueError:
            self._reject(_BAD_CONTROL, m, topic, partition, now)
            return True
        if wave is None:
            return False
        self.wave_closes.mark(topic, partition, wave)
        self._buffer.consumed(topic, partition, m.offset, now)
        self._stats.control += 1
        log.info("wave %d closed by an operator on %s/%d", wave, topic, partition)
        return True

    def _route(
        self,
        routed: list[tuple[Any, str | None, dict[str, object]]],
        topic: str,
        partition: int,
        now: float,
    ) -> list[ValidRecord]:
        """Of a partition's accepted records, those protected here — their key picks this
        partition's state — and the others forwarded to the repartition topic, or, where there
        is none or they came from it, dead-lettered (``stream_jobs.partitions.state_routing``)."""
        routing = self.routing
        assert routing is not None
        expected_key = self.validator.expected_key
        keys = [expected_key(rid, values) if expected_key else None for _, rid, values in routed]
        known = [k for k in keys if k is not None]
        placed = iter(routing.state_partitions(known) if known else ())
        owned = (routing.topic, partition) in {
            (tp.topic, tp.partition) for tp in self.consumer.assignment()
        }
        valid: list[ValidRecord] = []
        for (m, rid, values), key in zip(routed, keys, strict=True):
            state = next(placed) if key is not None else partition
            if owned and routing.stays(topic, partition, state):
                source = SourceRef(topic, partition, m.offset, m.timestamp)
                valid.append(ValidRecord(rid, values, source, now))
            elif routing.rekeys and topic != routing.topic and key is not None:
                if not self._rerouted and routing.direct:
                    self._rerouted = True
                    log.warning(
                        "records of %s arrive on partitions their key does not pick: they go "
                        "through %s to reach their state (produce with Kafka's default "
                        "partitioner, murmur2 — librdkafka: partitioner=murmur2_random — to "
                        "spare the extra hop)",
                        topic,
                        routing.topic,
                    )
                self._forward_keyed(m, key, topic, now)
            else:
                self._reject(_WRONG_PARTITION, m, topic, partition, now)
        return valid

    def _rekey(self, m: Any, key_value: object, topic: str, now: float) -> None:
        """A valid record without a key: forwarded, keyed by the policy's key field, to the
        repartition topic, where every record of a respondent lands on one partition; it is
        protected when it comes back from there. Its input offset is committed once the
        forward is acknowledged."""
        if key_value is None:
            self._reject(_NO_KEY_VALUE, m, topic, m.partition, now)
            return
        self._forward_keyed(m, str(key_value).encode(), topic, now)

    def _forward_keyed(self, m: Any, key: bytes, topic: str, now: float) -> None:
        self.forward.append((key, m.value, m.partition, m.offset))
        self._buffer.consumed(topic, m.partition, m.offset, now)
        self._stats.repartitioned += 1

    def _reject(self, rej: Rejection, m: Any, topic: str, partition: int, now: float) -> None:
        self.dead.append(
            dead_letter(
                rej,
                raw=m.value,
                key=m.key,
                topic=topic,
                partition=partition,
                offset=m.offset,
                timestamp_ms=m.timestamp,
                policy_version=self._version,
                max_value_bytes=self.settings.max_message_bytes,
            )
        )
        self._buffer.consumed(topic, partition, m.offset, now)
        self._stats.dlq[rej.reason.value] += 1
        log.debug("dead-lettered %s/%d/%d: %s", topic, partition, m.offset, rej.reason.value)

    async def rewind_to_consumed(self) -> None:
        """Every assigned partition back to the record after the last one consumed (else its
        committed offset, else where auto_offset_reset says): a fetch that failed may have
        advanced other partitions past records it never returned."""
        reset = self.settings.auto_offset_reset
        for tp in self.consumer.assignment():
            position = self._buffer.position((tp.topic, tp.partition))
            await seek_back(self.consumer, tp, reset, position)

    def undecodable(self, unread: list[tuple[TopicPartition, Any]], now: float) -> None:
        """Records the client could not decode (``stream_jobs.intake.undecodable``): each is
        dead-lettered ``invalid_utf8`` with its coordinates, and counted as consumed."""
        for tp, m in unread:
            self._reject(_UNDECODABLE, m, tp.topic, tp.partition, now)
            log.warning(
                "%s/%d/%d: a record the Kafka client cannot decode (a header key that is not "
                "UTF-8) was dead-lettered; it stays in the topic at that offset",
                tp.topic,
                tp.partition,
                m.offset,
            )
        self._stats.consumed += len(unread)  # and dead-lettered: the valid count stays

    async def check_truncated_logs(self) -> None:
        """A partition whose high watermark fell below the offsets already consumed lost its
        log (a broker that keeps it in memory restarted, or the topic was recreated). Kafka
        consumers detect that only when they fetch beyond the end; a broker that answers such
        fetches with no records would leave us waiting for offsets that are now in the past.
        Start again from the beginning (or the end), as auto_offset_reset says."""
        consumer = self.consumer
        for tp in consumer.assignment():
            highwater = consumer.highwater(tp)
            position = self._buffer.position((tp.topic, tp.partition))
            if highwater is None or position is None or highwater >= position:
                continue
            log.warning(
                "%s/%d: high watermark %d is below the consumed offset %d; reading it again "
                "from the %s",
                tp.topic,
                tp.partition,
                highwater,
                position,
                "beginning" if self.settings.auto_offset_reset == "earliest" else "end",
            )
            await seek_reset(consumer, tp, self.settings.auto_offset_reset)
            self._buffer.rewind((tp.topic, tp.partition), 0)
