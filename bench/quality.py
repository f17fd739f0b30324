"""Timing of the quality measures on a streaming window and on the whole Adult file.

    .venv/bin/python bench/quality.py [--repeats 15] [--seed 7] [--data PATH]

Data: age, education_num, hours_per_week of UCI Adult (../shared/data/adult.csv, 32,561 rows),
masked by seeded Gaussian noise (sd = 10 % of each column's sd). Sizes: the first 5,000 rows
(a default window) and all rows. Each figure is the median of ``--repeats`` runs after one
warm-up. The same-run baseline is a plain numpy copy plus standardisation of the same data,
so ratios are comparable across machines.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gateway.measures import quality

COLUMNS = ["age", "education_num", "hours_per_week"]
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "adult.csv"
BUDGET_MS = 50.0  # per window, for everything except record linkage


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _baseline(x: np.ndarray) -> np.ndarray:
    y = x.copy()
    return (y - y.mean(axis=0)) / y.std(axis=0, ddof=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = ap.parse_args()

    full = pd.read_csv(args.data, usecols=COLUMNS)[COLUMNS].to_numpy(dtype=np.float64)
    rng = np.random.default_rng(args.seed)
    masked_full = full + rng.normal(size=full.shape) * (0.1 * full.std(axis=0, ddof=1))

    measures: list[tuple[str, Callable[[np.ndarray, np.ndarray], Any]]] = [
        ("sse_sst_pct", quality.sse_sst_pct),
        ("il1s", quality.il1s),
        ("il2", quality.il2),
        ("il3 (PIL)", quality.il3),
        ("interval_disclosure", quality.interval_disclosure),
        ("dld (cKDTree)", quality.dld),
        ("evaluate_numeric (all)", quality.evaluate_numeric),
    ]
    for n in (5000, full.shape[0]):
        x, xm = full[:n], masked_full[:n]
        reps = args.repeats if n <= 5000 else max(3, args.repeats // 3)
        base = _median_ms(lambda x=x: _baseline(x), reps)
        print(f"\n{n:,} × {x.shape[1]} (median of {reps}; baseline copy+standardise {base:.3f} ms)")
        print(f"  {'measure':<24}{'ms':>10}{'× baseline':>14}")
        no_linkage = 0.0
        for name, fn in measures:
            ms = _median_ms(lambda fn=fn, x=x, xm=xm: fn(x, xm), reps)
            if not name.startswith(("dld", "evaluate")):
                no_linkage += ms
            print(f"  {name:<24}{ms:>10.2f}{ms / base:>14.0f}")
        print(f"  {'sum without dld':<24}{no_linkage:>10.2f}{no_linkage / base:>14.0f}")
        if n == 5000:
            verdict = "within" if no_linkage < BUDGET_MS else "OVER"
            print(f"  → {verdict} the {BUDGET_MS:.0f} ms window budget (record linkage excluded)")
        r = quality.evaluate_numeric(x, xm)
        print(
            f"  values: SSE/SST {r.sse_sst_pct:.3f} %, IL1s {r.il1s:.4f}, "
            f"PIL {r.il3['overall']:.3f}, DLD {r.dld:.3f}, ID {r.interval_disclosure:.3f}"
        )


if __name__ == "__main__":
    main()
