"""What an operator sees when the engine process hangs: `privgw run` under a steady feed, its
engine child stopped (SIGSTOP) for 32 s, then continued. The feed stops 8 s before the stall
ends, so that the exported lag (measured every 5 s) and the independent reading agree.

    .venv/bin/python bench/stall_detection.py                  # 32 s stall, 2,000 records/s
    .venv/bin/python bench/stall_detection.py --stall 45 --rate 5000

Printed: when /healthz turned 503 (the stall timeout is 30 s by default), privgw_stalled and
privgw_seconds_since_progress at the end of the stall, the exported lag against the group's lag
read independently (confluent-kafka: high watermark minus committed offset), /readyz, and how
soon /healthz answered 200 after SIGCONT; then the worker's stall log lines.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stream_jobs.commands.broker import EmbeddedBroker, free_port
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

ROOT = Path(__file__).resolve().parents[1]
TOPIC, GROUP, PARTITIONS = "stall.in", "stall-g", 3


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()
    except OSError:
        return 0, ""


def group_lag(bootstrap: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        total = 0
        for tp in c.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=10):
            low, high = c.get_watermark_offsets(TopicPartition(TOPIC, tp.partition), timeout=10)
            total += high - (tp.offset if tp.offset >= 0 else low)
        return total
    finally:
        c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--stall", type=float, default=32.0, help="seconds the engine is stopped")
    ap.add_argument("--rate", type=int, default=2000, help="records per second fed")
    args = ap.parse_args()
    rows = PanelSurvey(respondents=50_000, waves=3, seed=1, rows=load_rows()).records()
    records = [encode(r) for r in rows]
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        bs = broker.bootstrap
        admin = AdminClient({"bootstrap.servers": bs})  # kept alive until the topic exists
        for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
            future.result(30)
        port = free_port()
        env = dict(
            os.environ,
            PRIVGW_SECRET="bench-secret-not-for-production-0123456789",
            PRIVGW_SESSION_TIMEOUT_MS="3000",
            PRIVGW_HEARTBEAT_INTERVAL_MS="500",
            PRIVGW_ENGINE="process",
        )
        log = Path(tmp) / "worker.log"
        run = ["run", "--policy", str(ROOT / "deploy" / "policies" / "adult.yaml")]
        run += ["--bootstrap", bs, "--input-topic", TOPIC, "--output-topic", "stall.out"]
        run += ["--group-id", GROUP, "--state-dir", f"{tmp}/state", "--metrics-port", str(port)]
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "gateway", *run],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
            )
        try:
            while get(port, "/readyz")[0] != 200:
                assert worker.poll() is None, log.read_text()[-2000:]
                time.sleep(0.2)
            stop = threading.Event()

            def feed() -> None:
                producer = Producer({"bootstrap.servers": bs, "linger.ms": 5})
                step = max(1, args.rate // 10)
                for i in range(0, len(records), step):
                    if stop.is_set():
                        break
                    for key, value in records[i : i + step]:
                        producer.produce(TOPIC, value=value, key=key)
                    producer.poll(0)
                    time.sleep(0.1)
                producer.flush(30)

            feeder = threading.Thread(target=feed)
            feeder.start()
            time.sleep(5)
            engine = int(
                subprocess.check_output(
                    ["pgrep", "-P", str(worker.pid), "-f", "engine_child"]
                ).split()[0]
            )
            os.kill(engine, signal.SIGSTOP)
            t0 = time.monotonic()
            first_503 = None
            try:
                while time.monotonic() - t0 < args.stall:
                    if time.monotonic() - t0 > args.stall - 8:
                        stop.set()  # the last lag measurement (every 5 s) then sees the end
                    if first_503 is None and get(port, "/healthz")[0] == 503:
                        first_503 = time.monotonic() - t0
                    time.sleep(0.25)
                _, text = get(port, "/metrics")
                ready = get(port, "/readyz")
                independent = group_lag(bs)
            finally:
                os.kill(engine, signal.SIGCONT)
            t1 = time.monotonic()
            while get(port, "/healthz")[0] != 200:
                time.sleep(0.05)
            back = time.monotonic() - t1
            stop.set()
            feeder.join()
            lines = text.splitlines()
            exported = sum(
                float(x.rsplit(" ", 1)[1])
                for x in lines
                if x.startswith("privgw_consumer_lag_records{")
            )
            print(
                f"engine stopped {args.stall:.0f} s at {args.rate} records/s fed: /healthz 503 "
                f"after {first_503 if first_503 is not None else float('nan'):.1f} s; "
                + "; ".join(
                    x
                    for x in lines
                    if x.startswith(("privgw_stalled ", "privgw_seconds_since_progress "))
                )
                + f"; exported lag {exported:.0f} vs the group's {independent} (confluent-kafka);"
                f" /readyz {ready[0]} ({ready[1].strip()}); /healthz 200 {back:.1f} s after "
                "SIGCONT"
            )
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(60)
        for line in log.read_text().splitlines():
            if "stalled" in line or "progressing again" in line or "stopped after" in line:
                print(line)


if __name__ == "__main__":
    main()
