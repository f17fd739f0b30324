"""Output partitions of a window's keyed records: aiokafka's per-key partitioner against the
worker's window-at-once murmur2 (stream_jobs.kafka.partitions_for_keys), in the same run.

    .venv/bin/python bench/output_partitions.py            # windows of 5,000 keys, 20 windows

Keys are what the worker hashes: HMAC pseudonyms (``output.pseudonym: hmac``) on output
records, respondent ids on records forwarded to the repartition topic, state keys on the
partitioned backend's changelog. Both sides must give the same partitions (checked here too).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka.partitioner import DefaultPartitioner

from gateway.keyed.keyed import Keyring
from stream_jobs.kafka import partitions_for_keys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--window", type=int, default=5000)
    ap.add_argument("--windows", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=12)
    args = ap.parse_args()
    keyring = Keyring(b"bench-secret-0123456789")
    keys = [keyring.pseudonym(f"p{i:07d}").encode() for i in range(args.window)]
    parts = list(range(args.partitions))
    default = DefaultPartitioner()
    per_key, window = [], []
    for _ in range(args.windows):
        t0 = time.perf_counter()
        one_by_one = [default(k, parts, parts) for k in keys]
        t1 = time.perf_counter()
        at_once = partitions_for_keys(keys, parts)
        t2 = time.perf_counter()
        assert at_once == one_by_one
        per_key.append((t1 - t0) / len(keys) * 1e6)
        window.append((t2 - t1) / len(keys) * 1e6)
    a, b = statistics.median(per_key), statistics.median(window)
    print(
        f"{args.windows} windows of {len(keys)} keys ({len(keys[0])} bytes), "
        f"{args.partitions} partitions, medians:\n"
        f"  aiokafka DefaultPartitioner, key by key  {a:6.2f} µs/key\n"
        f"  partitions_for_keys, window at once      {b:6.2f} µs/key   ({a / b:.0f}x faster)"
    )


if __name__ == "__main__":
    main()
