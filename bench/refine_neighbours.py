"""The cohorts' local search (``gateway.grouping.refine``) against what it replaced, in the same
run, on Adult's whole key: its neighbour search against the argpartition before it, and the whole
search (``refine_groups``) against its pass before 2026-11-28, on every column and by category.

    .venv/bin/python bench/refine_neighbours.py               # Adult, 1x 2x 4x copies
    .venv/bin/python bench/refine_neighbours.py --copies 1,8 --repeat 3

The centroids are those of the MDAV groups (k = 5) of ../shared/data/adult.csv's whole key,
embedded as the engine embeds it (deploy/policies/adult.yaml's claim: numeric and one-hot
nominal columns). ``--copies c`` stacks c copies, each but the first moved by a small normal
jitter, for a wave of c times Adult's groups. For each size it prints both methods' best time,
their ratio, and how many groups get the same neighbours in the same order (the two differ
only among equal float32 distances, where argpartition's pick is arbitrary and the argmin passes
take the lower group number).

The whole search runs on the records' embedded rows and their MDAV labels (k = 5), stacked, the
copies jittered in their numeric columns (the one-hot columns stay one-hot). Three ways: the pass
before 2026-11-28 and today's on every column, which must give the same labels (the same
arithmetic, fewer temporaries; the bench checks it), and today's by category (the one-hot blocks
given, as the engine gives them), whose sums differ by rounding: it prints the share of records
in the same group and the ratio of the sums of squares.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mdav import best_of

from gateway.files.evaluate import claim_frame
from gateway.grouping import refine
from gateway.grouping.claim_partition import ClaimPartition
from gateway.grouping.microaggregation import mdav_groups
from gateway.grouping.mixed_microaggregation import _embed
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


def old_pass(  # noqa: PLR0917 - refine._pass's signature
    geometry: Any,
    lab: NDArray[np.int64],
    sizes: NDArray[np.int64],
    near: NDArray[np.int64],
    k: int,
    cap: int,
) -> float:
    """refine._pass before 2026-11-28 (every column; each difference formed twice, delta not
    in place)."""
    x = geometry.x
    groups = sizes.size
    centres = refine._centres(x, lab, sizes)
    members = refine._members(lab, groups, cap)
    gains: list[NDArray[np.float64]] = []
    ops: list[NDArray[np.int64]] = []
    own = np.einsum("nd,nd->n", x - centres[lab], x - centres[lab])
    for col in range(near.shape[1]):
        h_all = near[lab, col]
        to_h = np.einsum("nd,nd->n", x - centres[h_all], x - centres[h_all])
        i = np.flatnonzero(to_h < own)
        g, h = lab[i], h_all[i]
        js = members[h]
        valid = js >= 0
        jj = np.where(valid, js, 0)
        delta = x[jj] - x[i][:, None, :]
        dc = (centres[g] - centres[h])[:, None, :]
        inv = (1.0 / sizes[g] + 1.0 / sizes[h])[:, None]
        gain = -2.0 * np.einsum("nmd,nmd->nm", dc, delta) - inv * np.einsum(
            "nmd,nmd->nm", delta, delta
        )
        gain = np.where(valid, gain, np.inf)
        rows = np.arange(i.size)
        best = np.argmin(gain, axis=1)
        g_best = gain[rows, best]
        ok = g_best < 0
        gains.append(g_best[ok])
        ops.append(np.column_stack([i[ok], jj[rows, best][ok], g[ok], h[ok]]))
        can = (sizes[g] > k) & (sizes[h] < cap)
        if can.any():
            ii, gi, hi = i[can], g[can], h[can]
            mg = sizes[hi] / (sizes[hi] + 1.0) * to_h[ii] - sizes[gi] / (sizes[gi] - 1.0) * own[ii]
            ok = mg < 0
            gains.append(mg[ok])
            ops.append(np.column_stack([ii[ok], np.full(int(ok.sum()), -1), gi[ok], hi[ok]]))
    gain_all = np.concatenate(gains)
    op_all = np.concatenate(ops)
    order = np.lexsort((op_all[:, 0], gain_all))
    used = np.zeros(groups, dtype=bool)
    removed = 0.0
    for (i_, j_, g_, h_), gv in zip(op_all[order].tolist(), gain_all[order].tolist(), strict=True):
        if used[g_] or used[h_]:
            continue
        used[g_] = used[h_] = True
        lab[i_] = h_
        if j_ >= 0:
            lab[j_] = g_
        else:
            sizes[g_] -= 1
            sizes[h_] += 1
        removed -= gv
    return removed


def refine_with(
    pass_: Any, x: NDArray[np.float64], labels: NDArray[np.int64], k: int, blocks: Any = ()
) -> Any:
    """refine_groups with ``pass_`` as its pass."""
    kept = refine._pass
    refine._pass = pass_
    try:
        return refine.refine_groups(x, labels, k, blocks=blocks)
    finally:
        refine._pass = kept


def adult_rows() -> tuple[NDArray[np.float64], NDArray[np.int64], int, list[Any]]:
    """Adult's embedded whole-key rows (standardized, as the policy's claim embeds them), their
    MDAV labels, k and the one-hot blocks."""
    policy = load_policy(POLICY)
    claim = ClaimPartition(policy)
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False, skipinitialspace=True)
    frame = claim_frame(df, policy, published=False).dropna()  # the records MDAV can group
    x, blocks, _ = _embed(claim.columns, [frame[n].tolist() for n in policy.k_claim], True)
    k = policy.microaggregation.k
    return x, mdav_groups(x, k, standardize=False), k, blocks


def jittered(base: NDArray[np.float64], copies: int, rng: np.random.Generator) -> Any:
    """``copies`` stacked copies of ``base``, each but the first moved by a small jitter."""
    spread = base.std(axis=0)
    parts = [base] + [
        base + rng.normal(scale=0.01, size=base.shape) * spread for _ in range(copies - 1)
    ]
    return np.vstack(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--copies", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=2, help="best of N runs per method")
    args = ap.parse_args()
    x, labels, k, blocks = adult_rows()
    base = refine._centres(x, labels, np.bincount(labels))
    rng = np.random.default_rng(20261128)
    print(
        f"{'groups':>7} {'columns':>7} {'argpartition s':>15} {'argmin passes s':>16} "
        f"{'speed-up':>8} {'same neighbours':>16}"
    )
    for copies in (int(c) for c in args.copies.split(",")):
        centres = jittered(base, copies, rng)
        t_old, old = best_of(args.repeat, partial(by_argpartition, centres))
        t_new, new = best_of(args.repeat, partial(refine._neighbour_groups, centres))
        same = float((old == new).all(axis=1).mean())
        print(
            f"{centres.shape[0]:>7} {centres.shape[1]:>7} {t_old:>15.3f} {t_new:>16.3f} "
            f"{t_old / t_new:>7.1f}x {same:>15.1%}"
        )
    print(
        f"\n{'records':>8} {'groups':>7} {'pass before s':>14} {'every column s':>15} "
        f"{'by category s':>14} {'speed-up':>8} {'same groups':>12} {'SSE ratio':>10}"
    )
    dense_cols = np.setdiff1d(np.arange(x.shape[1]), np.concatenate([c for c, _ in blocks]))
    for copies in (int(c) for c in args.copies.split(",")):
        rows = np.vstack([x] * copies)  # copies jittered in their numeric columns only
        rows[x.shape[0] :, dense_cols] = jittered(x[:, dense_cols], copies, rng)[x.shape[0] :]
        coded = [(cols, np.tile(codes, copies)) for cols, codes in blocks]
        # each copy's groups numbered after the previous copies'
        lab = np.concatenate([labels + c * (int(labels.max()) + 1) for c in range(copies)])
        t_old, old = best_of(args.repeat, partial(refine_with, old_pass, rows, lab, k))
        t_new, new = best_of(args.repeat, partial(refine_with, refine._pass, rows, lab, k))
        t_cat, cat = best_of(args.repeat, partial(refine_with, refine._pass, rows, lab, k, coded))
        if not np.array_equal(old, new):
            raise SystemExit("the two passes on every column gave different groups")
        print(
            f"{rows.shape[0]:>8} {int(lab.max()) + 1:>7} {t_old:>14.3f} {t_new:>15.3f} "
            f"{t_cat:>14.3f} {t_old / t_cat:>7.2f}x {float((cat == new).mean()):>11.2%} "
            f"{sse(rows, cat) / sse(rows, new):>10.5f}"
        )
    return 0


def sse(x: NDArray[np.float64], labels: NDArray[np.int64]) -> float:
    """The within-group sum of squares."""
    diff = x - refine._centres(x, labels, np.bincount(labels))[labels]
    return float(np.einsum("nd,nd->", diff, diff))


if __name__ == "__main__":
    raise SystemExit(main())
