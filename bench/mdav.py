"""MDAV timing, against a same-run baseline, with the identical-partition check.

    .venv/bin/python bench/mdav.py              # 20,000x5 (shared/data), 100,000x5; k = 3, 10
    .venv/bin/python bench/mdav.py --sizes 20000 --ks 3 --repeat 3

For every (data set, k) it times ``mdav_groups`` (the pruned exact method, the default) and,
as the baseline measured in the same run, the direct exact method: sdcMicro's own algorithm
(every step scans all remaining records with float32 distances), forced by ``direct_max = n``.
Both must give the same labels, record for record; the bench stops if they do not.

For context only (not measured here — R and sdcMicro are not installable on this machine):
sdcMicro 5.8.1 ``microaggregation(method = "mdav")`` takes about 1.3-1.9 s on 20,000x5 at
k = 3 and about 68 s on 100,000x5 at k = 3 on this machine class (figures from the issue).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.grouping import microaggregation as ma
from gateway.grouping.mdav_arith import sdc_weights

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "synth_gauss_20000x5.csv"
SDCMICRO_K3_SECONDS = {20_000: (1.3, 1.9), 100_000: (68.0, 68.0)}


def dataset(n: int, seed: int) -> tuple[str, np.ndarray]:
    if n == 20_000 and SHARED.is_file():
        return "synth_gauss_20000x5.csv", pd.read_csv(SHARED).to_numpy(dtype=np.float64)
    rng = np.random.default_rng(seed)
    return f"gaussian {n}x5 (seed {seed})", rng.standard_normal((n, 5))


def best_of(repeat: int, fn: object) -> tuple[float, np.ndarray]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
    assert out is not None
    return best, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="20000,100000")
    ap.add_argument("--ks", default="3,10")
    ap.add_argument("--repeat", type=int, default=1, help="best of N runs per method")
    ap.add_argument("--seed", type=int, default=20261123)
    args = ap.parse_args()
    print(f"{'data':32} {'k':>3} {'default s':>10} {'direct s':>10} {'speed-up':>9}  partition")
    for n in (int(s) for s in args.sizes.split(",")):
        name, x = dataset(n, args.seed)
        w = sdc_weights(x)
        for k in (int(s) for s in args.ks.split(",")):
            fast_s, fast = best_of(args.repeat, lambda x=x, k=k: ma.mdav_groups(x, k))
            slow_s, slow = best_of(
                args.repeat, lambda x=x, k=k, w=w: ma._mdav_labels(x, k, w, direct_max=len(x))
            )
            same = bool(np.array_equal(fast, slow))
            print(
                f"{name:32} {k:>3} {fast_s:>10.3f} {slow_s:>10.3f} {slow_s / fast_s:>8.1f}x  "
                f"{'identical' if same else 'DIFFERENT'}"
            )
            if not same:
                return 1
            if k == 3 and n in SDCMICRO_K3_SECONDS:
                lo, hi = SDCMICRO_K3_SECONDS[n]
                print(
                    f"{'':32} {'':>3} sdcMicro 5.8.1 (issue's figure): {lo:.1f}-{hi:.1f} s "
                    f"-> {lo / fast_s:.1f}x-{hi / fast_s:.1f}x"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
