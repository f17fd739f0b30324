"""What encoding a wave's published records costs, held as the worker holds them: orjson alone
against ``gateway.engine.records.json_bytes``.

    .venv/bin/python bench/output_encoding.py                 # 66,666 records, 3 pairs
    .venv/bin/python bench/output_encoding.py --records 5000 --pairs 5

The worker keeps a window's encoded records until the broker acknowledges them, and under the
panel mode a wave is one window. Each side runs in a fresh process (a heap's history decides
how much of it page-faults), the sides alternating: the simulated Adult panel's records
(bench/stream_throughput.py's), each encoded and all kept, three times over in the process.
Printed per side and pass: seconds, minor page faults, and the process's peak RSS; and the
memory tracemalloc counts as held by the encoded records against their bytes.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from gateway.engine.records import json_bytes
from stream_jobs.commands.simulator import PanelSurvey, load_rows

SIDES = {"orjson.dumps": orjson.dumps, "json_bytes": json_bytes}


def one_side(side: str, records: int) -> None:
    rows = list(PanelSurvey(respondents=records, waves=1, seed=1, rows=load_rows()).records())
    encode = SIDES[side]
    for attempt in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        out = list(map(encode, rows))
        seconds = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_SELF)
        print(
            f"  {side:<13} pass {attempt + 1}: {seconds:.3f} s, "
            f"{after.ru_minflt - before.ru_minflt:>7,} page faults, "
            f"peak RSS {after.ru_maxrss // 1024:,} MiB"
        )
        del out
    tracemalloc.start()
    held = tracemalloc.get_traced_memory()[0]
    out = list(map(encode, rows[:1000]))
    held = tracemalloc.get_traced_memory()[0] - held
    tracemalloc.stop()
    print(
        f"  {side:<13} held: {held / len(out):,.0f} bytes a record "
        f"for {sum(map(len, out)) / len(out):,.0f} bytes of JSON"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=66_666)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)  # a child's
    args = ap.parse_args()
    if args.side:
        one_side(args.side, args.records)
        return
    print(f"{args.records:,} simulated Adult panel records, orjson {orjson.__version__}")
    for pair in range(args.pairs):
        order = list(SIDES) if pair % 2 == 0 else list(SIDES)[::-1]
        print(f"pair {pair + 1}:")
        for side in order:
            subprocess.run(
                [sys.executable, __file__, "--side", side, "--records", str(args.records)],
                check=True,
            )


if __name__ == "__main__":
    main()
