"""MDAV over the mixed quasi-identifier embedding: look-up path against the dense baseline.

    .venv/bin/python bench/mixed_mdav.py                       # 4 windows of 5,000, k = 5
    .venv/bin/python bench/mixed_mdav.py --windows 2 --ks 3,5 --repeat 5

Adult (../shared/data/adult.csv) with the nine quasi-identifiers of deploy/policies/adult.yaml,
in windows of ``--size`` rows (records with a missing non-category value left out, as the
engine does). For every (window, k) it times, best of ``--repeat``:

* ``default``: ``mixed_microaggregate`` (embedding with shared category codes, MDAV with the
  nominal one-hot blocks evaluated by table look-up, centroids);
* ``baseline``: the same work as computed before the look-up path, measured in the same run:
  the embedding restated as it was (per-value codes, np.unique, dense one-hot product), the
  dense pruned MDAV (``_mdav_labels`` without blocks) and ``mixed_centroids``.

Both must give the same labels and published values; the bench stops if they do not.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.grouping import microaggregation as ma
from gateway.grouping.mixed_microaggregation import (
    QIColumn,
    QIKind,
    claim_columns,
    claim_inputs,
    mixed_centroids,
    mixed_microaggregate,
)
from gateway.policy import AttrType, policy_from_yaml

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT.parent / "shared" / "data" / "adult.csv"


def old_codes(col: QIColumn, vals: Sequence[object]) -> np.ndarray:
    index = {c: i for i, c in enumerate(col.categories)}
    return np.fromiter((index[v] for v in vals), dtype=np.int64, count=len(vals))  # type: ignore[index]


def old_embed(columns: Sequence[QIColumn], values: Sequence[Sequence[object]]) -> np.ndarray:
    n = len(values[0])
    parts = []
    for col, vals in zip(columns, values, strict=True):
        if col.kind is QIKind.NOMINAL:
            present, inverse = np.unique(old_codes(col, vals), return_inverse=True)
            onehot = np.zeros((n, present.size))
            onehot[np.arange(n), inverse] = 1.0
            f = onehot.mean(axis=0)
            total_var = 1.0 - float(f @ f)
            scale = 1.0 / np.sqrt(total_var) if total_var > 1e-12 else 0.0
            parts.append(onehot * scale)
            continue
        if col.kind is QIKind.ORDINAL:
            a = old_codes(col, vals).astype(np.float64)
        else:
            a = np.array(vals, dtype=np.float64)
        sd = float(a.std())
        parts.append(((a - a.mean()) / sd if sd > 0 else np.zeros_like(a))[:, None])
    return np.hstack(parts)


def baseline(
    columns: Sequence[QIColumn], values: Sequence[Sequence[object]], k: int
) -> tuple[list[list[object]], np.ndarray]:
    x = old_embed(columns, values)
    labels = ma._mdav_labels(x, k, np.ones(x.shape[1]))
    return mixed_centroids(columns, values, labels), labels


def windows(size: int, count: int) -> tuple[list[QIColumn], list[list[list[object]]]]:
    policy = policy_from_yaml((ROOT / "deploy" / "policies" / "adult.yaml").read_text())
    columns = claim_columns(policy)
    frame = pd.read_csv(ADULT, dtype=str, keep_default_na=False)
    out = []
    for w in range(count):
        part = frame.iloc[w * size : (w + 1) * size]
        cols = []
        for name in policy.k_claim:
            attr = policy.attributes[name]
            raw: list[Any] = [None if v in ("?", "") else v for v in part[name]]
            if attr.type is AttrType.NUMERIC:
                raw = [None if v is None else float(v) for v in raw]
            cols.append(claim_inputs(attr, raw))
        keep = [i for i in range(len(part)) if all(c[i] is not None for c in cols)]
        out.append([[c[i] for i in keep] for c in cols])
    return columns, out


def best_of(repeat: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", type=int, default=5000)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--ks", default="5")
    ap.add_argument("--repeat", type=int, default=5, help="best of N runs per method")
    args = ap.parse_args()
    columns, wins = windows(args.size, args.windows)
    print(
        f"{'window':>6} {'rows':>6} {'k':>3} {'default ms':>11} {'baseline ms':>12} {'speed-up':>9}"
    )
    tot_new = tot_old = 0.0
    for w, vals in enumerate(wins):
        for k in (int(s) for s in args.ks.split(",")):
            new_s, new = best_of(
                args.repeat, lambda v=vals, k=k: mixed_microaggregate(columns, v, k)
            )
            old_s, old = best_of(args.repeat, lambda v=vals, k=k: baseline(columns, v, k))
            if not (np.array_equal(new[1], old[1]) and new[0] == old[0]):
                print(f"window {w} k={k}: DIFFERENT partition or published values")
                return 1
            tot_new, tot_old = tot_new + new_s, tot_old + old_s
            print(
                f"{w:>6} {len(vals[0]):>6} {k:>3} {new_s * 1e3:>11.1f} {old_s * 1e3:>12.1f} "
                f"{old_s / new_s:>8.2f}x  identical"
            )
    rows = sum(len(v[0]) for v in wins) * len(args.ks.split(","))
    print(
        f"per record: default {tot_new / rows * 1e6:.2f} µs, "
        f"baseline {tot_old / rows * 1e6:.2f} µs ({tot_old / tot_new:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
