"""Read a protected topic and its metadata topic (``privgw reconstruct --bootstrap``).

Reads without a consumer group, from the beginning of every partition, until the end offsets
are reached and no record has arrived for ``quiet`` seconds: the development broker's
end-offset query ignores the newest batch (DESIGN §8), so the end it reports is only a lower
bound. Transport security comes from the ``PRIVGW_*`` environment (``WorkerSettings``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from gateway.errors import PrivgwError
from stream_jobs.kafka import check_bootstrap, security_kwargs
from stream_jobs.meta import parse_meta
from stream_jobs.settings import WorkerSettings


class TopicReadError(PrivgwError):
    """The topic to read is not there: a user's mistake (exit 2), not an internal error."""


_TOPIC_WAIT_S = 3.0  # a topic that exists is in the first metadata; a bit more for a new one


async def read_topic(
    bootstrap: str,
    topic: str,
    *,
    timeout: float = 10.0,
    quiet: float = 1.0,
    settings: WorkerSettings | None = None,
) -> list[Any]:
    """Every record of ``topic`` (aiokafka ConsumerRecords, in partition/offset order)."""
    settings = settings or WorkerSettings(bootstrap=bootstrap)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id=f"{settings.client_id}-reader",
        fetch_max_bytes=settings.fetch_max_bytes,
        max_partition_fetch_bytes=settings.max_partition_fetch_bytes,
        **security_kwargs(settings),
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + min(timeout, _TOPIC_WAIT_S)
        partitions = None
        while partitions is None:
            await consumer.topics()  # refresh metadata
            partitions = consumer.partitions_for_topic(topic)
            if partitions is None:
                if time.monotonic() > deadline:
                    raise TopicReadError(
                        f"--topic: topic {topic} does not exist on --bootstrap {bootstrap}; "
                        "give the protected topic (the policy's output.topic)"
                    )
                await asyncio.sleep(0.2)
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        records: dict[TopicPartition, list[Any]] = {tp: [] for tp in tps}
        last_new = time.monotonic()
        while True:
            batch = await consumer.getmany(timeout_ms=100, max_records=50_000)
            now = time.monotonic()
            if batch:
                last_new = now
                for tp, msgs in batch.items():
                    records[tp].extend(msgs)
                continue
            positions = [await _position(consumer, tp) for tp in tps]
            reached = all(pos >= end[tp] for pos, tp in zip(positions, tps, strict=True))
            if reached and now - last_new >= quiet:
                break
            if now - last_new >= timeout:
                break  # nothing new for a long time: the end offsets were stale
        return [m for tp in tps for m in records[tp]]
    finally:
        await consumer.stop()


async def _exists(bootstrap: str, topic: str) -> bool:
    settings = WorkerSettings(bootstrap=bootstrap)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        client_id=f"{settings.client_id}-reader",
        **security_kwargs(settings),
    )
    await consumer.start()
    try:
        return topic in await consumer.topics()
    finally:
        await consumer.stop()


async def _position(consumer: Any, tp: TopicPartition) -> int:
    return int(await consumer.position(tp))


async def read_protected_async(
    bootstrap: str, topic: str, timeout: float = 10.0, *, quiet: float = 1.0
) -> tuple[dict[str, object], list[dict[str, object]]]:
    await check_bootstrap(WorkerSettings(bootstrap=bootstrap))
    if not await _exists(bootstrap, topic):
        raise TopicReadError(
            f"--topic: topic {topic} does not exist on --bootstrap {bootstrap}; give the "
            "protected topic (the policy's output.topic)"
        )
    meta_records = await read_topic(bootstrap, f"{topic}.meta", timeout=timeout, quiet=quiet)
    if not meta_records:
        raise TopicReadError(
            f"--topic {topic}: no metadata in {topic}.meta; has the gateway started on it?"
        )
    latest = max(meta_records, key=lambda m: (m.timestamp, m.offset))
    meta = parse_meta(latest.value)
    rows = [
        orjson.loads(m.value)
        for m in await read_topic(bootstrap, topic, timeout=timeout, quiet=quiet)
        if m.value is not None
    ]
    return meta, rows


def read_protected(
    bootstrap: str, topic: str, timeout: float = 10.0
) -> tuple[dict[str, object], list[dict[str, object]]]:
    """(latest metadata of ``<topic>.meta``, all decoded records of ``topic``)."""
    return asyncio.run(read_protected_async(bootstrap, topic, timeout))
