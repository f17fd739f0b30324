"""Throughput with 1, 2 and 3 `privgw run` processes sharing six partitions (static assignment).

    .venv/bin/python bench/scale_out.py                  # 60,000 records, 1,2,3 workers
    .venv/bin/python bench/scale_out.py --records 200000 --workers 1,2

The same simulated panel (keyed by respondent id) waits in a fresh input topic for every run;
the workers start together (start-up and partition assignment included) and the clock stops
when 99 % of the record ids are in the output topic (the last ones wait up to
max_hold_seconds for k new neighbours); the time to 100 % is printed too.
Printed: records/s, records/s per worker, and per worker-core (this machine's cores are shared
by the workers, the broker and this script), plus how many records were lost (must be 0). The
baseline is the single worker of the same run.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

ROOT = Path(__file__).resolve().parents[1]
SECRET = "bench-scale-out-secret-0123456789"


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    for key, value in records:
        while True:
            try:
                p.produce(topic, value=value, key=key)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def count_ids(consumer: Consumer, seen: set[bytes]) -> None:
    for m in consumer.consume(num_messages=20_000, timeout=0.2):
        if m.error() is None:
            seen.add(dict(m.headers() or [])["record_id"])


def run(bootstrap: str, name: str, workers: int, records: list[tuple[bytes, bytes]]) -> float:
    tmp = Path(tempfile.mkdtemp(prefix="privgw-scale-"))
    env = dict(
        os.environ,
        PRIVGW_SECRET=SECRET,
        PRIVGW_SESSION_TIMEOUT_MS="3000",
        PRIVGW_HEARTBEAT_INTERVAL_MS="500",
        PRIVGW_LOG_LEVEL="WARNING",
    )
    common = [
        "--bootstrap",
        bootstrap,
        "--group-id",
        f"{name}-g",
        "--input-topic",
        f"{name}.in",
        "--output-topic",
        f"{name}.out",
        "--partitions",
        "6",
        "--metrics-port",
        "0",
        "--policy",
        str(ROOT / "deploy/policies/adult.yaml"),
    ]
    # topics first (one worker creates them), then the records, then all workers together
    boot = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway",
            "run",
            *common,
            "--state-dir",
            str(tmp / "boot"),
            "--worker-index",
            "0",
            "--workers",
            "6",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{name}-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    while True:
        meta = consumer.list_topics(f"{name}.out", timeout=10).topics.get(f"{name}.out")
        if meta is not None and meta.partitions:
            break
        time.sleep(0.2)
    boot.send_signal(signal.SIGKILL)
    boot.wait()
    produce(bootstrap, f"{name}.in", records)
    consumer.assign([TopicPartition(f"{name}.out", p, 0) for p in meta.partitions])
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "run",
                *common,
                "--state-dir",
                str(tmp / f"w{i}"),
                "--worker-index",
                str(i),
                "--workers",
                str(workers),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(workers)
    ]
    seen: set[bytes] = set()
    deadline = time.monotonic() + 600
    t99 = None
    while len(seen) < len(records) and time.monotonic() < deadline:
        count_ids(consumer, seen)
        if t99 is None and len(seen) >= 0.99 * len(records):
            t99 = time.perf_counter() - t0
    total = time.perf_counter() - t0
    # the last records of a run wait for k new neighbours up to max_hold_seconds (30 s in
    # the Adult policy) and then go out suppressed: throughput is timed to 99 %
    elapsed = t99 if t99 is not None else total
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)
    consumer.close()
    lost = len(records) - len(seen)
    print(
        f"  {workers} worker(s): {len(records) / elapsed:9,.0f} rec/s "
        f"(99 % in {elapsed:.1f} s, all in {total:.1f} s)"
        f"  per worker {len(records) / elapsed / workers:8,.0f}"
        f"  per core {len(records) / elapsed / min(workers, os.cpu_count() or 1):8,.0f}"
        f"  lost {lost}"
    )
    return len(records) / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--workers", default="1,2,3")
    args = ap.parse_args()
    panel = PanelSurvey(respondents=args.records // 3, waves=3, seed=4, rows=load_rows())
    records = [encode(r) for r in panel.records()][: args.records]
    print(f"{len(records)} records, 6 partitions, static assignment, {os.cpu_count()} cores")
    with EmbeddedBroker() as broker:
        base = None
        for n in (int(w) for w in args.workers.split(",")):
            rate = run(broker.bootstrap, f"scale{n}-{int(time.time())}", n, records)
            base = base or rate
            print(f"     speed-up over 1 worker: {rate / base:.2f}x")


if __name__ == "__main__":
    main()
