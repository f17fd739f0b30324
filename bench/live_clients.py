"""The survey platform's side of bench/stream_throughput.py's live runs, each in a process of
its own (a platform's producer and an analyst's consumer do not share the gateway's CPU time
slice, its GIL):

    live_clients.py produce BOOTSTRAP TOPIC RECORDS_FILE   # waits for a line on stdin, then
                                                           # produces every record as fast as
                                                           # it can, keyed as Kafka places keys
    live_clients.py consume BOOTSTRAP TOPIC                # reads the topic from its start

Both report on stdout, one line per event, with ``time.monotonic()`` (the same clock in every
process on Linux): ``start T`` / ``done T`` for the producer, ``n COUNT T`` after every fetch
for the consumer. RECORDS_FILE is a ``marshal`` list of (key, value) pairs.
"""

from __future__ import annotations

import asyncio
import marshal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from stream_jobs.kafka import partitions_for_keys, send_batches

CHUNK = 5000  # records per round of send_batches: bounded memory in the accumulator


async def produce(bootstrap: str, topic: str, records_file: str) -> None:
    records: list[tuple[bytes, bytes]] = marshal.loads(Path(records_file).read_bytes())
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topic))
        placed = partitions_for_keys([k for k, _ in records], partitions)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        print(f"start {time.monotonic()}", flush=True)
        futures = []
        for s in range(0, len(records), CHUNK):
            by_partition: dict[int, list[tuple[bytes | None, bytes, int | None, list]]] = {}
            for (key, value), p in zip(records[s : s + CHUNK], placed[s : s + CHUNK], strict=True):
                by_partition.setdefault(p, []).append((key, value, None, []))
            futures += await send_batches(producer, topic, by_partition)
        await asyncio.gather(*futures)
        print(f"done {time.monotonic()}", flush=True)
    finally:
        await producer.stop()


async def consume(bootstrap: str, topic: str) -> None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=5000,
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=16 * 1024 * 1024,
    )
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic)
        while not parts:
            await consumer.topics()  # refreshes the metadata
            parts = consumer.partitions_for_topic(topic)
        consumer.assign([TopicPartition(topic, p) for p in sorted(parts)])
        await consumer.seek_to_beginning()
        count = 0
        print(f"n 0 {time.monotonic()}", flush=True)
        while True:
            batch = await consumer.getmany(timeout_ms=100, max_records=5000)
            got = sum(map(len, batch.values()))
            if got:
                count += got
                print(f"n {count} {time.monotonic()}", flush=True)
    finally:
        await consumer.stop()


def main() -> None:
    role, *args = sys.argv[1:]
    if role == "produce":
        asyncio.run(produce(*args))
    elif role == "consume":
        asyncio.run(consume(*args))
    else:
        raise SystemExit(f"role must be produce or consume, got {role!r}")


if __name__ == "__main__":
    main()
