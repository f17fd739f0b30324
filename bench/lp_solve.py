"""Fine-grain randomized response: LP solve time against same-run baselines.

Times ``gateway.mechanisms.rr_constructions.fine_grain`` (the compact O(m) LP on HiGHS plus
matrix construction and validation) for m = 10, 50, 200, 1000 categories, and in the same run:

- the closed-form uniform mechanism at the same γ (``uniform``), the cost floor of building
  and validating an m×m mechanism;
- the naive LP with all m(m-1) row constraints written out densely (m ≤ 200; at m = 1000 it
  would need a 999,000 × 1000 constraint matrix), whose optimum must equal the compact one.

Reports medians over several runs and the ratios. Target: under 20 ms at m = 50.

    .venv/bin/python bench/lp_solve.py [--gamma 9] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable

import numpy as np
from scipy.optimize import linprog

from gateway.mechanisms.rr_constructions import fine_grain, uniform

SIZES = (10, 50, 200, 1000)
DENSE_MAX_M = 200
TARGET_MS_AT_50 = 20.0


def median_ms(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm-up (imports, caches)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def dense_lp(f: np.ndarray, gamma: float) -> float:
    """Naive fine-grain LP: 1 + (m-1) p_j ≤ γ (1 - p_i) for every ordered pair i ≠ j."""
    m = f.size
    pairs = np.array(list(itertools.permutations(range(m), 2)))
    a = np.zeros((len(pairs), m))
    a[np.arange(len(pairs)), pairs[:, 0]] += m - 1.0
    a[np.arange(len(pairs)), pairs[:, 1]] += gamma
    res = linprog(
        -f, A_ub=a, b_ub=np.full(len(pairs), gamma - 1.0), bounds=[(0, 1)] * m, method="highs"
    )
    p = res.x
    return float(f @ (p + (1.0 - p) / m))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gamma", type=float, default=9.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    gamma = args.gamma

    header = (
        f"{'m':>5} {'fine_grain ms':>14} {'uniform ms':>11} {'fg/uniform':>11} "
        f"{'dense LP ms':>12} {'dense/fg':>9} {'|Δ objective|':>14} {'retention fg':>13} "
        f"{'uniform':>8}"
    )
    print(f"fine-grain LP, gamma = {gamma:g}, weights ~ Dirichlet(0.5), medians")
    print(header)
    print("-" * len(header))
    at_50 = float("nan")
    for m in SIZES:
        cats = [f"v{i}" for i in range(m)]
        f = rng.dirichlet(np.full(m, 0.5))
        runs = 31 if m <= 200 else 11
        fg_ms = median_ms(lambda: fine_grain(cats, gamma=gamma, weights=f), runs)  # noqa: B023
        un_ms = median_ms(lambda: uniform(cats, gamma=gamma), runs)  # noqa: B023
        fg = fine_grain(cats, gamma=gamma, weights=f)
        fg_ret = fg.expected_retention(f)
        un_ret = uniform(cats, gamma=gamma).expected_retention(f)
        if m <= DENSE_MAX_M:
            dense_runs = 5 if m <= 50 else 3
            dense_ms = median_ms(lambda: dense_lp(f, gamma), dense_runs)  # noqa: B023
            gap = abs(dense_lp(f, gamma) - fg_ret)
            dense_txt = f"{dense_ms:12.2f} {dense_ms / fg_ms:9.1f} {gap:14.2e}"
        else:
            dense_txt = f"{'skipped':>12} {'-':>9} {'-':>14}"
        if m == 50:
            at_50 = fg_ms
        print(
            f"{m:5d} {fg_ms:14.2f} {un_ms:11.3f} {fg_ms / un_ms:11.1f} {dense_txt} "
            f"{fg_ret:13.4f} {un_ret:8.4f}"
        )
    verdict = "PASS" if at_50 < TARGET_MS_AT_50 else "FAIL"
    print(f"\ntarget: fine_grain at m = 50 under {TARGET_MS_AT_50:g} ms: {at_50:.2f} ms {verdict}")


if __name__ == "__main__":
    main()
