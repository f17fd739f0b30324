"""The cohorts' neighbour search (``gateway.grouping.refine._neighbour_groups``) against the
argpartition it replaced, in the same run, on real whole-key centroids.

    .venv/bin/python bench/refine_neighbours.py               # Adult, 1x 2x 4x copies
    .venv/bin/python bench/refine_neighbours.py --copies 1,8 --repeat 3

The centroids are those of the MDAV groups (k = 5) of ../shared/data/adult.csv's whole key,
embedded as the engine embeds it (deploy/policies/adult.yaml's claim: numeric and one-hot
nominal columns). ``--copies c`` stacks c copies, each but the first moved by a small normal
jitter, for a wave of c times Adult's groups. For each size it prints both methods' best time,
their ratio, and how many groups get the same neighbours in the same order (the two differ
only among equal float32 distances, where argpartition's pick is arbitrary and the argmin passes
take the lower group number).
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mdav import best_of

from gateway.files.evaluate import claim_frame
from gateway.grouping import refine
from gateway.grouping.claim_partition import ClaimPartition
from gateway.grouping.microaggregation import mdav_groups
from gateway.grouping.mixed_microaggregation import embed
from gateway.policy import load_policy

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT.parent / "shared" / "data" / "adult.csv"
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"


def by_argpartition(centres: NDArray[np.float64]) -> NDArray[np.int64]:
    """The search before 2026-11-28: one argpartition of each distance block."""
    groups = centres.shape[0]
    m = min(refine._NEIGHBOURS, groups - 1)
    out = np.empty((groups, m), dtype=np.int64)
    c32 = np.ascontiguousarray(centres, dtype=np.float32)
    c2 = np.einsum("gd,gd->g", c32, c32)
    for start in range(0, groups, refine._CHUNK):
        cs = c32[start : start + refine._CHUNK]
        rows = np.arange(cs.shape[0])
        d = c2[None, :] - 2.0 * (cs @ c32.T)
        d[rows, start + rows] = np.inf
        part = np.argpartition(d, m - 1, axis=1)[:, :m]
        order = np.argsort(d[rows[:, None], part], axis=1, kind="stable")
        out[start : start + cs.shape[0]] = part[rows[:, None], order]
    return out


def adult_centres() -> NDArray[np.float64]:
    policy = load_policy(POLICY)
    claim = ClaimPartition(policy)
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False, skipinitialspace=True)
    frame = claim_frame(df, policy, published=False).dropna()  # the records MDAV can group
    x = embed(claim.columns, [frame[n].tolist() for n in policy.k_claim])
    labels = mdav_groups(x, policy.microaggregation.k, standardize=False)
    return refine._centres(x, labels, np.bincount(labels))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--copies", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=2, help="best of N runs per method")
    args = ap.parse_args()
    base = adult_centres()
    rng = np.random.default_rng(20261128)
    spread = base.std(axis=0)
    print(
        f"{'groups':>7} {'columns':>7} {'argpartition s':>15} {'argmin passes s':>16} "
        f"{'speed-up':>8} {'same neighbours':>16}"
    )
    for copies in (int(c) for c in args.copies.split(",")):
        parts = [base] + [
            base + rng.normal(scale=0.01, size=base.shape) * spread for _ in range(copies - 1)
        ]
        centres = np.vstack(parts)
        t_old, old = best_of(args.repeat, partial(by_argpartition, centres))
        t_new, new = best_of(args.repeat, partial(refine._neighbour_groups, centres))
        same = float((old == new).all(axis=1).mean())
        print(
            f"{centres.shape[0]:>7} {centres.shape[1]:>7} {t_old:>15.3f} {t_new:>16.3f} "
            f"{t_old / t_new:>7.1f}x {same:>15.1%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
