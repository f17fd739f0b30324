"""Restore time of the partitioned state backend: 1,000,000 respondents from a changelog topic.

    .venv/bin/python bench/state_restore.py                 # 1,000,000 respondents, 6 partitions
    .venv/bin/python bench/state_restore.py --n 200000

A RocksStore writes through a KafkaChangelog (compacted topic on the development broker) in
batches of 5,000, as the engine does per window; then a fresh RocksStore (a worker that takes
the partitions over) is rebuilt with ``restore_partitions``. Printed: changelog write rate,
restore time (target: 1,000,000 respondents in <= 60 s), and, as the baseline of the same run,
a plain aiokafka read of the same partitions without applying anything (what fetching costs).
Values are ~250-byte state entries like the engine's; keys are 32-byte respondent digests.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import TopicPartition
from aiokafka.admin import NewTopic

from state.rocks_store import RocksStore
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.kafka import create_missing_topics, make_consumer, make_producer
from stream_jobs.partitions.changelog import KafkaChangelog, restore_partitions
from stream_jobs.settings import WorkerSettings

PARTITIONS = 6
BATCH = 5_000
TOPIC = "privgw-bench.state-changelog"


def _value(i: int) -> bytes:
    return (
        b'{"current":["%016x","%032x"],"first_wave":1,"last_wave":3,'
        b'"qi":{"%032x":["%016x",[38.4,10.2,40.0]]},'
        b'"rr":{"income":{"%032x":[">50K","0123456789ab"]},"occupation":{"%032x":["Sales","ab"]}}}'
        % (i, i, i, i, i, i)
    )


async def plain_read(settings: WorkerSettings, n: int) -> float:
    consumer = make_consumer(settings, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        t0, got = time.perf_counter(), 0
        while got < n:
            batch = await consumer.getmany(timeout_ms=500, max_records=20_000)
            got += sum(len(m) for m in batch.values())
        return time.perf_counter() - t0
    finally:
        await consumer.stop()


async def main_async(n: int) -> None:
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        settings = WorkerSettings(bootstrap=broker.bootstrap, max_poll_records=20_000)
        await create_missing_topics(
            settings,
            [NewTopic(TOPIC, PARTITIONS, 1, topic_configs={"cleanup.policy": "compact"})],
        )
        producer = make_producer(settings)
        await producer.start()
        changelog = KafkaChangelog(
            producer, asyncio.get_running_loop(), TOPIC, list(range(PARTITIONS))
        )
        source = RocksStore(Path(tmp) / "source", changelog=changelog)
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        for start in range(0, n, BATCH):
            entries = {
                hashlib.sha256(b"r%d" % i).digest(): _value(i)
                for i in range(start, min(n, start + BATCH))
            }
            # put_many blocks on the changelog's acknowledgement: from a thread, as the engine
            await loop.run_in_executor(None, source.put_many, entries)
        t_write = time.perf_counter() - t0
        source.close()
        await producer.stop()
        print(f"{n:,} respondents written through the changelog: {n / t_write:,.0f}/s")

        t_read = await plain_read(settings, n)
        target = RocksStore(Path(tmp) / "target")
        remaining: list[int] = []
        t0 = time.perf_counter()
        read = await restore_partitions(
            dict.fromkeys(range(PARTITIONS), target), settings, TOPIC, progress=remaining.append
        )
        t_restore = time.perf_counter() - t0
        count = target.count()
        target.close()
        print(
            f"restore: {read:,} records, {count:,} respondents in {t_restore:.1f} s "
            f"({read / t_restore:,.0f}/s; target <= 60 s for 1,000,000); "
            f"progress reported {len(remaining)} times"
        )
        print(
            f"baseline, plain read of the same partitions: {t_read:.1f} s "
            f"({n / t_read:,.0f}/s); restore/read = {t_restore / t_read:.2f}"
        )
        if count != n:
            raise SystemExit(f"restored {count} respondents, expected {n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    args = ap.parse_args()
    asyncio.run(main_async(args.n))


if __name__ == "__main__":
    main()
