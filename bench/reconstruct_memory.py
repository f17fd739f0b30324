"""Peak memory of ``privgw reconstruct --topic``: the topic read whole and decoded (the reader
``attack`` still uses, which ``reconstruct`` used before) against the streamed per-version
category counts, in the same run, each in a process of its own (its peak RSS, VmHWM).

    .venv/bin/python bench/reconstruct_memory.py              # 20,000 records x 20: 400,000 rows
    .venv/bin/python bench/reconstruct_memory.py --copies 5

Rows are the Adult policy's engine output for simulated answers, produced ``--copies`` times
to an embedded broker topic (memory only), with their metadata record.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy
from gateway.validation import Validator
from state.memory_store import MemoryStore
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.delivery.meta import meta_message

ROOT = Path(__file__).resolve().parents[1]

# VmHWM, the peak RSS of this process image: ru_maxrss survives exec, so a child started by
# this (large) process would report the parent's peak
PEAK = """
def peak_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
"""

WHOLE = (
    PEAK
    + """
import sys
from stream_jobs.delivery.topic_reader import read_protected
from gateway.measures.published import mechanisms_from_meta, reconstruct_rows
meta, rows = read_protected(sys.argv[1], sys.argv[2])
est = reconstruct_rows(rows, mechanisms_from_meta(meta))
print(len(rows), est["income"]["em"][0], peak_kib())
"""
)

STREAMED = (
    PEAK
    + """
import sys
from stream_jobs.delivery.topic_reader import count_protected
counts = count_protected(sys.argv[1], sys.argv[2])
est = counts.reconstruct()
print(sum(counts.rows.values()), est["income"]["em"][0], peak_kib())
"""
)


def _fill(bootstrap: str, topic: str, records: int, copies: int) -> None:
    policy = load_policy(ROOT / "deploy" / "policies" / "adult.yaml")
    validator = Validator(policy)
    survey = PanelSurvey(respondents=records, waves=1, seed=1, new_share=0.0, rows=load_rows())
    window = []
    for offset, (key, value) in enumerate(encode(r) for r in survey.records()):
        rid, values = validator.decode_and_validate(value, key)  # type: ignore[misc]
        window.append(ValidRecord(rid, values, SourceRef("in", 0, offset, 1000), 0.0))
    engine = Engine(policy, keyring=Keyring(b"bench-secret-0123456789"), store=MemoryStore())
    published = []
    for start in range(0, len(window), 5000):
        part = window[start : start + 5000]
        published += engine.protect_window(part, now=0.0, flush_all=True).published
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
    key, value, headers = meta_message(engine.metadata())
    producer.produce(f"{topic}.meta", value=value, key=key, headers=headers)
    version = [("policy_version", engine.version.encode())]
    for _ in range(copies):
        for rec in published:
            while True:
                try:
                    producer.produce(topic, value=rec.value, key=rec.key, headers=version)
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--copies", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as logs, EmbeddedBroker(log_dir=Path(logs)) as broker:
        topic = "bench.protected"
        _fill(broker.bootstrap, topic, args.records, args.copies)
        for name, code in (("read whole (before)", WHOLE), ("streamed counts", STREAMED)):
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", code, broker.bootstrap, topic],
                capture_output=True, text=True, check=True, cwd=ROOT,
            )  # fmt: skip
            rows, em, rss_kib = out.stdout.split()
            print(
                f"{name:>20}: {int(rows):,} rows, peak RSS {int(rss_kib) / 1024:,.0f} MiB, "
                f"{time.perf_counter() - t0:.1f} s (income EM[0] {float(em):.4f})"
            )


if __name__ == "__main__":
    main()
