"""sdcMicro 5.8.1's MDAV arithmetic, reproduced bit for bit (see
:mod:`gateway.grouping.microaggregation` for why): sequential column sums, its variance
weights, float32 squared distances accumulated column by column, and its tie rules for
"farthest" (first maximum) and "nearest" (distance ascending, row index descending)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gateway.errors import MechanismError

U64 = 2.0**-53  # unit roundoff of float64
U32 = 2.0**-24  # unit roundoff of float32
TINY32 = 2.0**-149  # smallest float32 subnormal: absolute rounding error below the normal range
SAFE = 1e-9  # extra relative widening of every pruning bound (bounds are never tight)
SEQ_ROWS = 256  # rows per block of sdcMicro's sequential column sum (seq_colsum_of)
# rows per chunk when a block's promise is checked against the data (rows_match)
CHECK_ROWS = 256


def seq_colsum(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    """Column sums added strictly in row order."""
    if rows.ndim == 2 and rows.shape[0] and rows.shape[1] >= 2 and rows.flags.c_contiguous:
        out: NDArray[np.float64] = np.add.reduce(rows, axis=0)
        return out
    # one column, or another layout: accumulate, sequential by definition (and a copy)
    acc: NDArray[np.float64] = np.add.accumulate(rows, axis=0)[-1]
    return acc


def seq_colsum_of(x: NDArray[np.float64], idx: NDArray[np.intp]) -> NDArray[np.float64]:
    """``seq_colsum(x[idx])``, the same additions, a few hundred rows at a time: the running
    sum is added to a block's first row (the very addition a sequential sum makes there) before
    the block is summed, so no temporary of len(idx) rows is formed.

    A C-ordered block of two or more columns is reduced over its rows with the columns as the
    inner loop: numpy adds row after row (pairwise summation applies only along the axis
    contiguous in memory), three times faster than accumulate, which also writes every partial
    sum. ``tests/gateway/test_microaggregation.py`` checks it against a loop of additions."""
    acc: NDArray[np.float64] | None = None
    for start in range(0, idx.size, SEQ_ROWS):
        block = x[idx[start : start + SEQ_ROWS]]  # a gather: a new C-ordered array
        if acc is not None:
            block[0] += acc
        acc = seq_colsum(block)
    assert acc is not None
    return acc


def sdc_weights(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """w_j = 1 / ((Σx²)/n - ((Σx)/n)²) with sequential sums; 1 where that is exactly 0."""
    n = x.shape[0]
    avr = seq_colsum(x) / n
    sq = seq_colsum(x * x) / n
    var = sq - avr * avr
    w = np.ones(x.shape[1])
    nz = var != 0.0
    with np.errstate(divide="ignore", over="ignore"):
        w[nz] = 1.0 / var[nz]
    if not np.isfinite(w).all():
        cols = np.flatnonzero(~np.isfinite(w)).tolist()
        raise MechanismError(
            f"column(s) {cols} cannot be standardised: their variance underflows; "
            "rescale them or pass standardize=False"
        )
    return w


def exact_dist(
    rows: NDArray[np.float64], q: NDArray[np.float64], w: NDArray[np.float64] | None
) -> NDArray[np.float32]:
    """sdcMicro's distance: Σ_j float32(float64((a_j - q_j)²) · w_j), summed in float32.
    ``w`` None: every weight 1 (the product by 1 is exact, so it is skipped)."""
    d = rows - q
    d *= d
    if w is not None:
        d *= w
    if d.shape[0] <= 64:
        out: NDArray[np.float32] = np.add.accumulate(d.astype(np.float32), axis=1)[:, -1]
        return out
    t = d.T.astype(np.float32)  # (p, c): one contiguous row per column, added in order
    acc: NDArray[np.float32] = t[0].copy()
    for j in range(1, t.shape[0]):
        acc += t[j]
    return acc


def rows_match(
    x: NDArray[np.float64],
    cols: slice | NDArray[np.intp],
    table: NDArray[np.float64],
    codes: NDArray[np.intp],
) -> bool:
    """Whether each row of x, in columns ``cols``, is ``table``'s row of its code: checked a
    few hundred rows at a time (small, cache-resident temporaries instead of two of n rows)."""
    for start in range(0, x.shape[0], CHECK_ROWS):
        stop = start + CHECK_ROWS
        if not np.array_equal(x[start:stop, cols], table[codes[start:stop]]):
            return False
    return True


def first_max(f: NDArray[np.float32], idx: NDArray[np.intp]) -> int:
    """Row index of the maximum of f, the smallest row index among equal maxima."""
    top = f.max()
    return int(idx[f == top].min())


def k_smallest(f: NDArray[np.float32], idx: NDArray[np.intp], k: int) -> NDArray[np.intp]:
    """Positions of the first k entries ordered by (f ascending, row index descending)."""
    if f.size > k:
        kth = np.partition(f, k - 1)[k - 1]
        cand = np.flatnonzero(f <= kth)
    else:
        cand = np.arange(f.size)
    order = np.lexsort((-idx[cand], f[cand]))
    out: NDArray[np.intp] = cand[order[:k]]
    return out


class CountedColumns:
    """sdcMicro's sequential column sums of one-hot columns, by counting.

    A column whose values are 0 and one value c (a nominal attribute's one-hot column scaled
    by c) has, over any rows in any order, the sequential sum of as many c's as rows hold c:
    adding 0 leaves a float sum unchanged. That sum is ``steps[c][count - 1]`` (the running
    sum of c's, computed once), so the exact centroid needs only a count per category, not a
    pass over every column of every remaining row. ``columns`` holds the columns it counts;
    the others are summed in order as before."""

    def __init__(self, x: NDArray[np.float64], blocks: Sequence[tuple[Any, Any]]) -> None:
        n = x.shape[0]
        counted: list[NDArray[np.intp]] = []
        self._parts: list[tuple[NDArray[np.intp], NDArray[np.intp], int, NDArray[np.float64]]] = []
        steps: dict[float, NDArray[np.float64]] = {}
        for bcols, bcodes in blocks:
            part = _one_hot(x, np.asarray(bcols, dtype=np.intp), np.asarray(bcodes))
            if part is None:
                continue
            cols, codes, c = part
            if c not in steps:
                steps[c] = np.add.accumulate(np.full(n, c))
            self._parts.append((cols, codes, cols.size, steps[c]))
            counted.append(cols)
        self.columns = np.concatenate(counted) if counted else np.empty(0, dtype=np.intp)
        self.rest = np.setdiff1d(np.arange(x.shape[1]), self.columns)
        # the columns summed in order, each contiguous: a gather and a running sum per column
        # is faster than row-wise sums over a few columns (2.5x for 3 columns)
        self._rest = [np.ascontiguousarray(x[:, j]) for j in self.rest.tolist()]

    def sums(self, idx: NDArray[np.intp], p: int) -> NDArray[np.float64]:
        """``seq_colsum_of(x, idx)``, every value the same."""
        out = np.zeros(p)
        if not idx.size:
            return out
        for j, column in zip(self.rest.tolist(), self._rest, strict=True):
            out[j] = np.add.accumulate(column[idx])[-1]
        for cols, codes, ncodes, steps in self._parts:
            count = np.bincount(codes[idx], minlength=ncodes)
            has = count > 0
            out[cols[has]] = steps[count[has] - 1]
        return out


def _one_hot(
    x: NDArray[np.float64], bcols: NDArray[np.intp], bcodes: NDArray[Any]
) -> tuple[NDArray[np.intp], NDArray[np.intp], float] | None:
    """(column of each code, codes, c) when the block's columns are one-hot, code q putting
    c in the q-th column and 0 elsewhere (checked on every row); else None."""
    n, width = x.shape[0], bcols.size
    if width == 0 or bcodes.shape != (n,) or n == 0 or bcodes.dtype.kind not in "iu":
        return None
    codes = bcodes.astype(np.intp)
    if int(codes.min()) < 0 or int(codes.max()) >= width:
        return None
    c = float(x[0, bcols[codes[0]]])
    if not (math.isfinite(c) and c > 0.0):
        return None
    table = np.zeros((width, width))
    np.fill_diagonal(table, c)
    return (bcols, codes, c) if rows_match(x, bcols, table, codes) else None
