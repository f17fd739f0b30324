"""Records the Kafka client cannot decode.

aiokafka decodes a record's header keys as UTF-8 while it hands out a fetch: one header key of
other bytes (the broker accepts any) failed the whole ``getmany`` with UnicodeDecodeError, again
at every restart, so one record stopped the worker for good. Where that happens the worker reads
each partition one record at a time from where its reading stands: the records before the bad
one come back to be ingested as usual, the bad one is found at its offset, skipped (a seek past
it) and dead-lettered. Its bytes stay in the input topic at the coordinates the dead letter
names: the client never hands them out.

No record is lost on the way. The failed fetch may have advanced other partitions past records
it never returned, so every partition is first put back to the record after the last one the
worker consumed (``Intake.rewind_to_consumed``); aiokafka then advances a partition's position
only as it returns records, so the position at the failure is the undecodable record's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

# what aiokafka raises for a record it cannot decode (the header key; a value is bytes)
UNDECODABLE = (UnicodeDecodeError,)


@dataclass(frozen=True, slots=True)
class Unread:
    """A record the client could not decode, as far as a dead letter needs it."""

    offset: int
    key: None = None
    value: None = None
    timestamp: None = None


_PATIENCE = 10  # empty reads of a partition with records ahead before moving on


async def _behind(consumer: Any, tp: TopicPartition) -> bool:
    """Whether the partition has records past the consumer's position."""
    highwater = consumer.highwater(tp)
    return highwater is not None and highwater > await consumer.position(tp)


async def read_around(
    consumer: Any, limit: int, timeout_ms: int
) -> tuple[dict[TopicPartition, list[Any]], list[tuple[TopicPartition, Unread]]]:
    """Each assigned partition's next records, one at a time (at most ``limit`` of them, as
    many as the failed fetch could hold), up to the first the client cannot decode: the records
    read, and the undecodable ones (each partition is then past its own)."""
    batch: dict[TopicPartition, list[Any]] = {}
    unread: list[tuple[TopicPartition, Unread]] = []
    for tp in sorted(consumer.assignment()):
        got: list[Any] = []
        empty = 0
        while len(got) < limit:
            try:
                part = await consumer.getmany(tp, timeout_ms=timeout_ms, max_records=1)
            except UNDECODABLE:
                offset = await consumer.position(tp)
                consumer.seek(tp, offset + 1)
                unread.append((tp, Unread(offset)))
                break
            if not part:
                # a fetch still on its way after the seek back: on a quiet machine the
                # partition came back empty every time, the full fetch failed again on the
                # record, and the worker read no further (231 of 302 records consumed)
                empty += 1
                if empty < _PATIENCE and await _behind(consumer, tp):
                    continue
                break
            got.extend(part.get(tp, ()))
        if got:
            batch[tp] = got
    return batch, unread
