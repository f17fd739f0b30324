"""What encoding a wave's published records costs, held as the worker holds them: orjson alone,
``gateway.engine.records.json_bytes`` of one mapping a record, and the worker's path from the
engine's columns, before (a mapping a record built, then ``json_bytes``) and since 2026-11-29
(``encode_rows``: msgspec writes the rows in bulk).

    .venv/bin/python bench/output_encoding.py                 # 66,666 records, 3 rounds
    .venv/bin/python bench/output_encoding.py --records 5000 --pairs 5

The worker keeps a window's encoded records until the broker acknowledges them, and under the
panel mode a wave is one window. Each side runs in a fresh process (a heap's history decides
how much of it page-faults), the sides taking turns in a rotated order: the simulated Adult
panel's records (bench/stream_throughput.py's), as columns and as mappings built beforehand,
each encoded and all kept, three times over in the process. Printed per side and pass: seconds,
minor page faults, and the process's peak RSS; and the memory tracemalloc counts as held by the
encoded records against their bytes.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from gateway.engine.records import encode_published, encode_rows, json_bytes, output_rows
from stream_jobs.commands.simulator import PanelSurvey, load_rows

Names = list[str]
Columns = list[list[Any]]
Rows = list[dict[str, Any]]
SIDES: dict[str, Callable[[Names, Columns, Rows], list[bytes]]] = {
    "orjson.dumps": lambda names, columns, rows: list(map(orjson.dumps, rows)),
    "json_bytes": lambda names, columns, rows: list(map(json_bytes, rows)),
    "mappings": lambda names, columns, rows: encode_published(output_rows(names, columns)),
    "encode_rows": lambda names, columns, rows: encode_rows(names, columns),
}


def one_side(side: str, records: int) -> None:
    survey = PanelSurvey(respondents=records, waves=1, seed=1, rows=load_rows())
    given = list(survey.records())
    names = list(dict.fromkeys(name for row in given for name in row))
    columns = [[row.get(name) for row in given] for name in names]
    rows = output_rows(names, columns)
    encode = SIDES[side]
    for attempt in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        out = encode(names, columns, rows)
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
    out = encode(names, [column[:1000] for column in columns], rows[:1000])
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
        order = list(SIDES)[pair % len(SIDES) :] + list(SIDES)[: pair % len(SIDES)]
        print(f"pair {pair + 1}:")
        for side in order:
            subprocess.run(
                [sys.executable, __file__, "--side", side, "--records", str(args.records)],
                check=True,
            )


if __name__ == "__main__":
    main()
