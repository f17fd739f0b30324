"""What a worker split over two processes could reach: a measurement, not the product.

    .venv/bin/python bench/worker_split.py                 # 200,000 records, 2 runs
    .venv/bin/python bench/worker_split.py --repeat 3

privgw's worker is CPU-bound on one GIL: its event loop and its engine thread take turns
(docs/streaming.md). This bench builds the smallest version that uses two cores. The parent
process keeps the Kafka clients: ``getmany``, ``send_batch`` with acks=all, and a commit once a
batch's outputs are acknowledged. A child process gets each fetched batch as raw bytes and does
the worker's engine side: validation, one window per batch (``protect_window`` with keyed sticky
state in SQLite, garbage collection between windows as in the worker). It returns the encoded
records. While the child protects one batch, the parent fetches the next and produces the
previous.

Left out, because they cost little per record but need the real refactor: holds across windows
(each batch is flushed whole), the dead-letter topic (rejections are only counted), rebalances,
the state changelog and metrics. The records, broker and policy are bench/stream_throughput.py's.
Its passthrough is the baseline, measured in the same run, and privgw's own worker is timed too.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import multiprocessing as mp
import shutil
import statistics
import sys
import tempfile
import time
from array import array
from collections.abc import Sequence
from itertools import accumulate
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaProducer

from gateway.engine import Engine, SourceRef, ValidRecord
from gateway.keyed import Keyring
from gateway.policy import load_policy
from gateway.validation import Rejection, Validator
from state.sqlite_store import SQLiteStore
from stream_jobs.broker import EmbeddedBroker
from stream_jobs.kafka import ensure_topics, send_batches
from stream_jobs.settings import Topics, WorkerSettings
from stream_jobs.simulator import PanelSurvey, encode, load_rows
from stream_jobs.worker import _Collector, _tune_memory  # the worker's own settings

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"
SECRET = b"bench-secret-0123456789"
_NONE = 0xFFFFFFFF  # length that stands for a missing key

_spec = importlib.util.spec_from_file_location(
    "stream_throughput", Path(__file__).with_name("stream_throughput.py")
)
assert _spec is not None and _spec.loader is not None
stream_throughput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stream_throughput)
CpuClock, Timing = stream_throughput.CpuClock, stream_throughput.Timing
process_cpu_seconds = stream_throughput.process_cpu_seconds


def _pack(items: Sequence[bytes | None]) -> tuple[bytes, bytes]:
    """Lengths (None: ``_NONE``) and the concatenated bytes: one memcpy-friendly message."""
    lengths = array("I", [_NONE if b is None else len(b) for b in items])
    return lengths.tobytes(), b"".join(b for b in items if b is not None)


def _unpack(lengths: bytes, blob: bytes) -> list[bytes | None]:
    sizes = array("I")
    sizes.frombytes(lengths)
    ends = list(accumulate(0 if s == _NONE else s for s in sizes))
    starts = [0, *ends[:-1]]
    return [None if s == _NONE else blob[a:b] for s, a, b in zip(sizes, starts, ends, strict=True)]


def protect_batches(conn: Connection, state: Path, topic: str) -> None:
    """The child: raw batches in, encoded protected records out, until it receives None."""
    _tune_memory()
    collector = _Collector()
    collector.start(time.monotonic())
    policy = load_policy(POLICY)
    validate = Validator(policy).decode_and_validate
    store = SQLiteStore(state / "state.db")
    engine = Engine(policy, keyring=Keyring(SECRET), store=store)
    try:
        while (msg := conn.recv()) is not None:
            parts, offsets, key_lengths, keys_blob, value_lengths, values_blob = msg
            partition, offset = array("i", parts), array("q", offsets)
            now = time.monotonic()
            valid: list[ValidRecord] = []
            rejected = 0
            keys = _unpack(key_lengths, keys_blob)
            for i, value in enumerate(_unpack(value_lengths, values_blob)):
                res = validate(value, keys[i])
                if res.__class__ is Rejection:
                    rejected += 1
                    continue
                rid, values = res  # type: ignore[misc]
                valid.append(
                    ValidRecord(rid, values, SourceRef(topic, partition[i], offset[i]), now)
                )
            result = engine.protect_window(valid, now=now, flush_all=True)
            pub = result.published
            conn.send(
                (
                    array("i", [p.source.partition for p in pub]).tobytes(),  # type: ignore[union-attr]
                    *_pack([p.record_id.encode() for p in pub]),
                    *_pack([p.key for p in pub]),
                    *_pack([p.value for p in pub]),
                    result.report.window_id,
                    rejected,
                )
            )
            collector.after_window(time.monotonic())
    finally:
        store.close()
        collector.stop()


async def split_worker(  # noqa: PLR0917
    bootstrap: str, src: str, dst: str, n: int, group: str, state: Path, broker_pid: int | None
) -> tuple[Any, float]:
    """Timing of the two-process gateway over ``n`` records, and its child's CPU seconds."""
    ctx = mp.get_context("spawn")  # a clean child: no event loop or Kafka client inherited
    here, there = ctx.Pipe()
    child = ctx.Process(target=protect_batches, args=(there, state, src), daemon=True)
    child.start()
    consumer = stream_throughput.bench_consumer(bootstrap, src, group)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=1024 * 1024
    )
    await producer.start()
    await consumer.start()
    loop = asyncio.get_running_loop()
    version = load_policy(POLICY).version.encode()
    try:
        out_parts = sorted(await producer.partitions_for(dst))
        while not consumer.assignment():
            await consumer.getmany(timeout_ms=50, max_records=1)  # joins the group
        await consumer.seek_to_beginning()
        clock = CpuClock(broker_pid)
        child_cpu0 = process_cpu_seconds(child.pid)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        commits: asyncio.Queue[dict[Any, int]] = asyncio.Queue()  # one per batch, in order

        async def feed() -> None:
            fed = 0
            while fed < n:
                batch = await consumer.getmany(timeout_ms=200, max_records=5000)
                msgs = [m for ms in batch.values() for m in ms]
                if not msgs:
                    continue
                payload = (
                    array("i", [m.partition for m in msgs]).tobytes(),
                    array("q", [m.offset for m in msgs]).tobytes(),
                    *_pack([m.key for m in msgs]),
                    *_pack([m.value for m in msgs]),
                )
                await commits.put({tp: ms[-1].offset + 1 for tp, ms in batch.items() if ms})
                await loop.run_in_executor(None, here.send, payload)
                fed += len(msgs)

        async def drain() -> None:
            accounted = 0
            while accounted < n:
                reply = await loop.run_in_executor(None, here.recv)
                parts, rid_l, rid_b, key_l, key_b, val_l, val_b, window_id, rejected = reply
                wid = window_id.encode()
                by_partition: dict[int, list[Any]] = {}
                for part, rid, key, value in zip(
                    array("i", parts),
                    _unpack(rid_l, rid_b),
                    _unpack(key_l, key_b),
                    _unpack(val_l, val_b),
                    strict=True,
                ):
                    headers = [("record_id", rid), ("policy_version", version)]
                    headers.append(("window_id", wid))
                    by_partition.setdefault(out_parts[part % len(out_parts)], []).append(
                        (key, value, None, headers)
                    )
                futures = await send_batches(producer, dst, by_partition)
                await asyncio.gather(*futures)
                await consumer.commit(await commits.get())
                accounted += sum(len(v) for v in by_partition.values()) + rejected

        await asyncio.gather(feed(), drain())
        timing = Timing(time.perf_counter() - t0, *clock.elapsed())
        child_cpu = process_cpu_seconds(child.pid) - child_cpu0  # type: ignore[arg-type]
        here.send(None)
        return timing, child_cpu
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
        await consumer.stop()
        await producer.stop()


async def main_async(args: argparse.Namespace) -> None:
    survey = PanelSurvey(
        respondents=args.records // args.waves, waves=args.waves, seed=1, rows=load_rows()
    )
    records = [encode(r) for r in survey.records()][: args.records]
    n = len(records)
    parts = stream_throughput.PARTITIONS
    print(f"{n} records ({args.waves} waves of a simulated panel), {parts} partitions")
    with EmbeddedBroker() as broker:
        bs, pid = broker.bootstrap, broker.pid
        ratios: list[float] = []
        for rep in range(args.repeat):
            names = {side: (f"split{rep}.{side}.in", f"split{rep}.{side}.out") for side in "psw"}
            settings = WorkerSettings(bootstrap=bs, partitions=parts)
            for src, dst in names.values():
                topics = Topics(input=src, output=dst, dlq=f"{src}.dlq", meta=f"{dst}.meta")
                await ensure_topics(settings, topics)
                await stream_throughput.preload(bs, src, records)
            # the memory broker slows down as it fills: rotate which side goes first
            order = ["p", "s", "w"][rep % 3 :] + ["p", "s", "w"][: rep % 3]
            timed: dict[str, Any] = {}
            child_cpu = 0.0
            for side in order:
                src, dst = names[side]
                state = Path(tempfile.mkdtemp(prefix="privgw-split-"))
                try:
                    if side == "p":
                        timed[side] = await stream_throughput.passthrough(
                            bs, src, dst, n, f"p{rep}", broker_pid=pid
                        )
                    elif side == "s":
                        timed[side], child_cpu = await split_worker(
                            bs, src, dst, n, f"s{rep}", state, pid
                        )
                    else:
                        timed[side] = await stream_throughput.gateway(
                            bs, src, dst, n, f"w{rep}", state, broker_pid=pid
                        )
                finally:
                    shutil.rmtree(state, ignore_errors=True)
            p, s, w = (n / timed[x].seconds for x in "psw")
            ratios.append(s / p)
            print(
                f"run {rep + 1}: passthrough {p:>9,.0f} rec/s   two processes {s:>9,.0f} rec/s "
                f"(ratio {s / p:.2f})   worker {w:>9,.0f} rec/s (ratio {w / p:.2f})\n"
                f"       CPU s: two processes parent {timed['s'].cpu:.2f} + child {child_cpu:.2f}"
                f" in {timed['s'].seconds:.2f} s, broker {timed['s'].broker_cpu:.2f};"
                f" worker {timed['w'].cpu:.2f} in {timed['w'].seconds:.2f} s"
            )
        if len(ratios) > 1:
            print(
                f"median two-process ratio over {len(ratios)} runs: {statistics.median(ratios):.2f}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
