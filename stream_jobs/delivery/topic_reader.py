"""Read a protected topic and its metadata topic (``privgw reconstruct --bootstrap``).

Reads without a consumer group, from the beginning of every partition, until the end offsets
are reached and no record has arrived for ``quiet`` seconds: the development broker's
end-offset query ignores the newest batch (DESIGN §8), so the end it reports is only a lower
bound. Transport security comes from the ``PRIVGW_*`` environment (``WorkerSettings``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from array import array
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from gateway.errors import PrivgwError
from gateway.measures.versioned_counts import VersionedCounts
from stream_jobs.delivery.meta import is_announcement, parse_meta
from stream_jobs.kafka import check_bootstrap, security_kwargs
from stream_jobs.partitions.partition_state import SUPERSEDES
from stream_jobs.settings import WorkerSettings

log = logging.getLogger(__name__)

_BATCH = 5_000
_TOPIC_WAIT_S = 3.0  # a topic that exists is in the first metadata; a bit more for a new one
# what a missing topic is blamed on: the setting that named it, and the fix
PROTECTED_TOPIC = ("--topic", "give the protected topic (the policy's output.topic)")
META_TOPIC = (
    "--meta-topic",
    "give the metadata topic beside the protected one (the policy's output.meta_topic, by "
    "default <output.topic>.meta)",
)


class TopicReadError(PrivgwError):
    """A topic to read is missing or holds no metadata (the CLI exits 2 with the message)."""


async def read_topic(
    bootstrap: str,
    topic: str,
    *,
    timeout: float = 10.0,
    quiet: float = 1.0,
    settings: WorkerSettings | None = None,
    named_by: tuple[str, str] = PROTECTED_TOPIC,
) -> list[Any]:
    """Every record of ``topic`` (aiokafka ConsumerRecords, in partition/offset order)."""
    records: dict[int, list[Any]] = {}
    batches = iter_topic(
        bootstrap, topic, timeout=timeout, quiet=quiet, settings=settings, named_by=named_by
    )
    async with contextlib.aclosing(batches):
        async for batch in batches:
            for tp, msgs in batch.items():
                records.setdefault(tp.partition, []).extend(msgs)
    return [m for p in sorted(records) for m in records[p]]


async def iter_topic(
    bootstrap: str,
    topic: str,
    *,
    timeout: float = 10.0,
    quiet: float = 1.0,
    settings: WorkerSettings | None = None,
    named_by: tuple[str, str] = PROTECTED_TOPIC,
) -> AsyncIterator[dict[TopicPartition, list[Any]]]:
    """``topic`` from the beginning, batch by batch as fetched (each partition in offset
    order), so a reader can fold it without holding it. ``named_by``: the setting that named
    the topic and the fix, for the error when it does not exist."""
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
                    setting, fix = named_by
                    raise TopicReadError(
                        f"{setting}: topic {topic} does not exist on --bootstrap {bootstrap}; {fix}"
                    )
                await asyncio.sleep(0.2)
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        last_new = time.monotonic()
        while True:
            batch = await consumer.getmany(timeout_ms=100, max_records=_BATCH)
            now = time.monotonic()
            if batch:
                last_new = now
                yield batch
                continue
            positions = [await _position(consumer, tp) for tp in tps]
            reached = all(pos >= end[tp] for pos, tp in zip(positions, tps, strict=True))
            if reached and now - last_new >= quiet:
                break
            if now - last_new >= timeout:
                break  # nothing new for a long time: the end offsets were stale
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
    meta_records = await read_topic(
        bootstrap, f"{topic}.meta", timeout=timeout, quiet=quiet, named_by=META_TOPIC
    )
    if not meta_records:
        raise TopicReadError(
            f"--topic {topic}: no metadata in {topic}.meta; has the gateway started on it?"
        )
    meta_records = [m for m in meta_records if not is_announcement(m.key)] or meta_records
    latest = max(meta_records, key=lambda m: (m.timestamp, m.offset))
    meta = parse_meta(latest.value)
    messages = await read_topic(bootstrap, topic, timeout=timeout, quiet=quiet)
    return meta, [orjson.loads(m.value) for m in last_copies(messages) if m.value is not None]


def last_copies(messages: Sequence[Any]) -> list[Any]:
    """One message for each record id (its ``record_id`` header), as a consumer keeps them
    (docs/operating.md): a copy marked ``supersedes: true`` (protected again after a restore)
    wins over an unmarked one, else the last copy read wins; a copy replayed after a crash is
    byte-identical. A message without the header is kept. In the order read."""
    chosen: dict[bytes, tuple[int, bool]] = {}  # record id -> (position, marked)
    keep: set[int] = set()
    for i, m in enumerate(messages):
        headers = dict(m.headers or ())
        rid = headers.get("record_id")
        if rid is None:
            keep.add(i)
            continue
        marked = headers.get(SUPERSEDES[0]) == SUPERSEDES[1]
        prev = chosen.get(bytes(rid))
        if prev is None or marked or not prev[1]:
            chosen[bytes(rid)] = (i, marked)
    keep.update(i for i, _ in chosen.values())
    return [m for i, m in enumerate(messages) if i in keep]


def read_protected(
    bootstrap: str, topic: str, timeout: float = 10.0
) -> tuple[dict[str, object], list[dict[str, object]]]:
    """(latest metadata of ``<topic>.meta``, the decoded records of ``topic``, one copy of
    each record id: :func:`last_copies`)."""
    return asyncio.run(read_protected_async(bootstrap, topic, timeout))


async def read_metas_async(
    bootstrap: str, meta_topic: str, *, timeout: float = 10.0, quiet: float = 1.0
) -> dict[str, dict[str, object]]:
    """Every policy version's metadata in ``meta_topic`` (the newest record of each)."""
    metas: dict[str, tuple[tuple[int, int], dict[str, object]]] = {}
    records = await read_topic(
        bootstrap, meta_topic, timeout=timeout, quiet=quiet, named_by=META_TOPIC
    )
    for m in records:
        if m.value is None or is_announcement(m.key):  # a key fingerprint, not a policy
            continue
        try:
            meta = parse_meta(m.value)
        except ValueError:
            log.warning(
                "%s/%d/%d is not a metadata record: skipped", meta_topic, m.partition, m.offset
            )
            continue
        version, order = str(meta["policy_version"]), (m.timestamp, m.offset)
        if version not in metas or metas[version][0] < order:
            metas[version] = (order, meta)
    return {v: meta for v, (_, meta) in metas.items()}


def _version_of(message: Any, row: dict[str, Any]) -> str:
    """The record's policy version: its header, else its value's field."""
    for name, value in message.headers or ():
        if name == "policy_version":
            return bytes(value).decode("utf-8", "replace")
    return str(row.get("policy_version", "unknown"))


async def count_protected_async(
    bootstrap: str,
    topic: str,
    *,
    meta_topic: str | None = None,
    timeout: float = 10.0,
    quiet: float = 1.0,
    wave: int | None = None,
) -> VersionedCounts:
    """The protected ``topic`` folded into per-version category counts as it is read, each
    version counted against its own record in ``meta_topic`` (default ``<topic>.meta``);
    ``wave``: only that release's rows."""
    meta_topic = meta_topic or f"{topic}.meta"
    await check_bootstrap(WorkerSettings(bootstrap=bootstrap))  # one line, not a traceback
    if not await _exists(bootstrap, topic):  # the user's topic first: the clearer mistake
        raise TopicReadError(
            f"--topic: topic {topic} does not exist on --bootstrap {bootstrap}; give the "
            "protected topic (the policy's output.topic)"
        )
    metas = await read_metas_async(bootstrap, meta_topic, timeout=timeout, quiet=quiet)
    if not metas:
        raise TopicReadError(f"no metadata in {meta_topic}: has the gateway started?")
    counts = VersionedCounts(metas, wave=wave)
    add, loads = counts.add, orjson.loads
    unreadable = 0
    # a first pass finds the record ids read more than once and the copy a consumer keeps;
    # counted with their copies, 9,837 rows stood for 5,727 records after a restore
    chosen, through = await _kept_copies(bootstrap, topic, timeout=timeout, quiet=quiet)
    batches = iter_topic(bootstrap, topic, timeout=timeout, quiet=quiet)
    async with contextlib.aclosing(batches):
        async for batch in batches:
            for tp, messages in batch.items():
                end = through.get(tp.partition, -1)
                for m in messages:
                    if m.offset > end or not _kept(m, chosen):
                        continue  # appended since the first pass, or a copy not kept
                    try:
                        row = loads(m.value) if m.value is not None else None
                    except orjson.JSONDecodeError:
                        row = None
                    if isinstance(row, dict):
                        add(_version_of(m, row), row)
                    else:
                        unreadable += 1
    counts.unreadable = unreadable
    if unreadable:
        log.warning("%d records of %s are not JSON objects: left out", unreadable, topic)
    return counts


def _digest(record_id: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(record_id, digest_size=8).digest(), "little")


def _record_id(m: Any) -> bytes | None:
    for name, value in m.headers or ():
        if name == "record_id":
            return bytes(value)
    return None


def _kept(m: Any, chosen: dict[int, tuple[int, int]]) -> bool:
    rid = _record_id(m)
    if rid is None or not chosen:
        return True
    where = chosen.get(_digest(rid))
    return where is None or where == (m.partition, m.offset)


async def _kept_copies(
    bootstrap: str, topic: str, *, timeout: float, quiet: float
) -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
    """For each record id read more than once, the (partition, offset) of the copy a consumer
    keeps (:func:`last_copies`' rule: a copy marked ``supersedes`` wins, else the last); and
    the newest offset read of each partition. Kept as 8-byte digests in arrays: a topic of
    millions of records is not held."""
    digests, where, marks = array("Q"), array("q"), array("b")
    through: dict[int, int] = {}
    batches = iter_topic(bootstrap, topic, timeout=timeout, quiet=quiet)
    async with contextlib.aclosing(batches):
        async for batch in batches:
            for tp, messages in batch.items():
                for m in messages:
                    rid = _record_id(m)
                    through[tp.partition] = max(through.get(tp.partition, -1), m.offset)
                    if rid is None:
                        continue
                    digests.append(_digest(rid))
                    where.extend((m.partition, m.offset))
                    marks.append(dict(m.headers).get(SUPERSEDES[0]) == SUPERSEDES[1])
    keys = np.frombuffer(digests, dtype=np.uint64)
    unique, counts = np.unique(keys, return_counts=True)
    copied = unique[counts > 1]
    if not copied.size:
        return {}, through
    at = np.flatnonzero(np.isin(keys, copied)).tolist()  # in read order
    positions = np.frombuffer(where, dtype=np.int64).reshape(-1, 2)
    chosen: dict[int, tuple[int, int]] = {}
    marked: dict[int, bool] = {}
    for i in at:
        d, mark = int(keys[i]), bool(marks[i])
        if d not in chosen or mark or not marked[d]:
            chosen[d], marked[d] = (int(positions[i, 0]), int(positions[i, 1])), mark
    return chosen, through


def count_protected(
    bootstrap: str,
    topic: str,
    *,
    meta_topic: str | None = None,
    timeout: float = 10.0,
    wave: int | None = None,
) -> VersionedCounts:
    """``privgw reconstruct --topic``'s reader (entry point ``privgw.readers``: counts)."""
    return asyncio.run(
        count_protected_async(bootstrap, topic, meta_topic=meta_topic, timeout=timeout, wave=wave)
    )
