"""Fixed-size microaggregation: MDAV (multivariate) and individual ranking (univariate).

MDAV (Domingo-Ferrer & Torra 2005, "Ordinal, continuous and heterogeneous k-anonymity through
microaggregation", DMKD 11(2)): while at least 3k records remain, take the record r farthest
from the centroid of the remaining records and the record s farthest from r; form a group of r
and its k-1 nearest remaining records, then one of s and its k-1 nearest; with 2k..3k-1 left,
one more group around the record farthest from the centroid and the rest form the last group;
with fewer than 2k left, they form one group. Every group has k..2k-1 members.

The partition is record for record the one of sdcMicro 5.8.1's ``microaggregation(method =
"mdav")`` (its C++ ``Mdav``, reached through ``mdav()`` with default arguments). We reproduce
its arithmetic, not only the textbook rules, because ties between equal distances decide
groups on real data (duplicate rows):

* Standardisation: no centring or rescaling of the data; each squared difference in column j
  is multiplied by w_j = 1 / var_j, where var_j = (sum x^2)/n - ((sum x)/n)^2 is the population
  variance, both sums taken sequentially in row order in float64. If that variance is exactly
  0 (a constant column), w_j = 1. Scaling by 1/sd or centring would give the same partition
  in exact arithmetic, but not the same floating-point ties.
* Distances are squared Euclidean (no square root): each term ((a-b)^2 * w_j) is computed in
  float64, rounded to float32 and added to a float32 accumulator column by column. Many more
  ties arise in float32 than in float64, and they are resolved as below.
* The centroid is the sequential float64 column sum of the remaining records (in row order)
  divided by their number.
* The record farthest from the centroid, and the record farthest from r, is the first in row
  order among equal maxima.
* The k "nearest" records are the first k after ordering the remaining records by (distance
  ascending, row index descending): sdcMicro's bucket sort inserts a record in front of
  earlier records with an equal distance, so among equal distances the later row comes first.
  Records at distance 0 from r (r itself and its duplicates) are therefore taken from the
  highest row index down, and r itself is not necessarily in "its" group when it has
  duplicates.
* s is chosen before r's group is removed and keeps its role even if it fell into r's group
  (possible only with massive ties); the second group is then formed around s's values.

Two deliberate differences from sdcMicro, both outside its domain: sdcMicro treats the value
-999 as missing (its sentinel) and uses a different univariate method (mafast) when only one
column is given; here every finite value is data and one column is microaggregated by MDAV
like any other (call ``ranking_groups`` for the univariate method).

Individual ranking (sdcMicro's ``method = "onedims"`` and ``mafast``): each column on its own
is sorted (stably, ties in row order); consecutive runs of k sorted values form groups, and the
last group takes the n mod k remaining values (so it has k..2k-1 members).

Speed. A direct implementation costs O(n^2/k) distance evaluations of p terms each, with
Python-level overhead per group. We keep sdcMicro's exact rules but evaluate its float32
distances only on small candidate sets: one float64 matrix-vector product over the remaining
records (kept compact by swap-removal) gives all squared distances to a query point within a
proven error bound, and the bounds between these approximations and sdcMicro's float32 values
leave, except for near-ties, a single candidate for "farthest" and exactly k for "nearest".
Near-ties are settled with the exact float32 arithmetic (and sdcMicro's exact centroid when a
tie involves the centroid). Remaining sets of at most ``_DIRECT_MAX`` records, and degenerate
weights, use the direct exact method. Memory is O(n p): no distance matrix is formed. The
arithmetic lives in :mod:`gateway.grouping.mdav_arith`, the pruned steps in
:mod:`gateway.grouping.mdav_pruned`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from gateway.errors import MechanismError
from gateway.grouping.mdav_arith import (
    CountedColumns,
    exact_dist,
    k_smallest,
    sdc_weights,
    seq_colsum,
    seq_colsum_of,
)
from gateway.grouping.mdav_pruned import Block, Pruned

__all__ = [
    "Block",
    "class_means",
    "group_means",
    "mdav_blocks",
    "mdav_groups",
    "microaggregate",
    "ranking_groups",
]

# Remaining sets of at most this many records are processed by the direct exact method (both
# methods give the same partition). Below ~1000 records the two cost the same on 3 numeric
# columns, but on the ~70 embedded columns of a whole key with nominal attributes the direct
# steps cost m·p each: 128 rather than 1024 took MDAV on 4,900 Adult records from 122 to 91 ms.
_DIRECT_MAX = 128


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def _check_k(k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise MechanismError("k must be an integer ≥ 2")
    kk = int(k)
    if kk < 2:
        raise MechanismError(f"k must be ≥ 2, got {kk}")
    return kk


def _as_matrix(x: object, k: int) -> NDArray[np.float64]:
    try:
        arr = np.array(x, dtype=np.float64, order="C", copy=True)
    except (TypeError, ValueError):
        # numpy's message may quote the offending value: never pass it on
        raise MechanismError("x must be a numeric matrix (records × attributes)") from None
    if arr.ndim != 2:
        raise MechanismError(
            f"x must be a 2-D matrix (records × attributes), got {arr.ndim} dimension(s)"
        )
    n, p = arr.shape
    if p < 1:
        raise MechanismError("x has no attribute (column) to microaggregate")
    if n < k:
        raise MechanismError(
            f"fewer than k records cannot be microaggregated: n={n} records, k={k}"
        )
    finite = np.isfinite(arr)
    if not finite.all():
        cols = np.flatnonzero(~finite.all(axis=0)).tolist()
        raise MechanismError(
            f"x has {int((~finite).sum())} non-finite value(s) (NaN or ±inf) in column(s) "
            f"{cols}; microaggregation needs finite numbers"
        )
    return arr


# ---------------------------------------------------------------------------------------------
# MDAV engine
# ---------------------------------------------------------------------------------------------


class Mdav:
    """One MDAV run; ``alive`` marks the records not yet grouped."""

    def __init__(
        self,
        x: NDArray[np.float64],
        k: int,
        w: NDArray[np.float64],
        direct_max: int,
        blocks: Sequence[Block] = (),
    ) -> None:
        self.x = x
        self.blocks = blocks
        self.k = k
        self.w = w
        self.wx: NDArray[np.float64] | None = None if bool((w == 1.0).all()) else w
        self.n, self.p = x.shape
        self.direct_max = direct_max
        self.alive = np.ones(self.n, dtype=bool)
        self.m = self.n
        self.labels = np.full(self.n, -1, dtype=np.int64)
        self.next_label = 0
        self._counted: CountedColumns | None = None  # built when an exact centroid is needed

    # -- bookkeeping ---------------------------------------------------------------------------

    def emit(self, rows: NDArray[np.intp]) -> None:
        self.labels[rows] = self.next_label
        self.next_label += 1
        self.alive[rows] = False
        self.m -= rows.size

    def run(self) -> NDArray[np.int64]:
        k = self.k
        pruned = Pruned.build(self) if self.m > self.direct_max else None
        while self.m >= 2 * k:
            two = self.m >= 3 * k
            if pruned is not None and self.m > self.direct_max:
                pruned.step(two)
            else:
                self._direct_step(two)
        if self.m:
            self.emit(np.flatnonzero(self.alive))
        return self.labels

    # -- direct exact step ---------------------------------------------------------------------

    def _direct_step(self, two: bool) -> None:
        k, w = self.k, self.wx
        idx = np.flatnonzero(self.alive)
        rows = self.x[idx]
        centre = seq_colsum(rows) / idx.size
        r = int(np.argmax(exact_dist(rows, centre, w)))  # argmax: first among equal maxima
        fr = exact_dist(rows, rows[r], w)
        s_row = rows[int(np.argmax(fr))].copy()
        grp = k_smallest(fr, idx, k)
        self.emit(idx[grp])
        if two:
            keep = np.ones(idx.size, dtype=bool)
            keep[grp] = False
            idx2 = idx[keep]
            fs = exact_dist(rows[keep], s_row, w)
            self.emit(idx2[k_smallest(fs, idx2, k)])

    def exact_centre(self) -> NDArray[np.float64]:
        idx = np.flatnonzero(self.alive)
        if self.blocks and self._counted is None:  # one-hot columns summed by counting
            self._counted = CountedColumns(self.x, self.blocks)
        if self._counted is not None:
            return self._counted.sums(idx, self.p) / idx.size
        out: NDArray[np.float64] = seq_colsum_of(self.x, idx) / idx.size
        return out


def _mdav_labels(
    x: NDArray[np.float64],
    k: int,
    w: NDArray[np.float64],
    direct_max: int = _DIRECT_MAX,
    blocks: Sequence[Block] = (),
) -> NDArray[np.int64]:
    """MDAV labels; ``blocks`` (optional, see :data:`Block`) only change the cost, never the
    partition: with or without them the labels are the same."""
    return Mdav(x, k, w, direct_max, blocks).run()


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def mdav_groups(x: NDArray[np.float64], k: int, *, standardize: bool = True) -> NDArray[np.int64]:
    """Group label per row (0..g-1, in order of formation) of MDAV with minimum group size k.

    Same partition as sdcMicro 5.8.1 ``microaggregation(x, aggr = k, method = "mdav")`` (see
    the module docstring for the exact rules). With ``standardize=False`` the distance is the
    plain squared Euclidean distance on the raw values (every weight 1), same arithmetic
    otherwise.

    Constant columns: like sdcMicro, a column whose computed variance is exactly 0 gets weight
    1 instead of 1/0; it then adds nothing to any distance between records (all differences
    are 0). Its contribution to the distances to the centroid is the same for every record.
    """
    kk = _check_k(k)
    return _mdav(_as_matrix(x, kk), kk, standardize)


def mdav_blocks(x: NDArray[np.float64], k: int, blocks: Sequence[Block]) -> NDArray[np.int64]:
    """``mdav_groups(x, k, standardize=False)``, the same labels, faster when ``blocks`` (see
    :data:`Block`) group many columns into few distinct values (one-hot nominal attributes).
    ``x`` is only read, never kept."""
    kk = _check_k(k)
    fresh = (  # the caller's own new matrix (embed's): no defensive copy of ~n·p values
        isinstance(x, np.ndarray)
        and x.dtype == np.float64
        and x.ndim == 2
        and x.shape[1] >= 1
        and x.shape[0] >= kk
        and x.flags.c_contiguous
        and bool(np.isfinite(x).all())
    )
    arr = x if fresh else _as_matrix(x, kk)
    return _mdav_labels(arr, kk, np.ones(arr.shape[1]), blocks=blocks)


def _mdav(arr: NDArray[np.float64], k: int, standardize: bool) -> NDArray[np.int64]:
    w = sdc_weights(arr) if standardize else np.ones(arr.shape[1])
    return _mdav_labels(arr, k, w)


def ranking_groups(x: NDArray[np.float64], k: int) -> NDArray[np.int64]:
    """Univariate individual ranking: labels of shape (n, p), each column grouped on its own.

    In column j the records are ordered by value (stable: ties in row order); sorted positions
    0..k-1 form group 0, k..2k-1 group 1, and so on, and the last group also takes the n mod k
    remaining records (k..2k-1 members). Same groups as sdcMicro's ``method = "onedims"`` and
    ``mafast``.
    """
    kk = _check_k(k)
    return _ranking(_as_matrix(x, kk), kk)


def _ranking(arr: NDArray[np.float64], k: int) -> NDArray[np.int64]:
    n, p = arr.shape
    group_of_rank = np.minimum(np.arange(n) // k, n // k - 1).astype(np.int64)
    labels = np.empty((n, p), dtype=np.int64)
    for j in range(p):
        order = np.argsort(arr[:, j], kind="stable")
        labels[order, j] = group_of_rank
    return labels


def group_means(x: NDArray[np.float64], labels: NDArray[np.int64]) -> NDArray[np.float64]:
    """Each row replaced by the mean of its group (``labels``: one label per row, 0..g-1).

    ``x`` may be 1-D (one attribute); the result then is 1-D too.
    """
    means = class_means(x, labels)
    lab = np.asarray(labels)
    return means[lab] if lab.size else np.array(x, dtype=np.float64)


def class_means(x: NDArray[np.float64], labels: NDArray[np.int64]) -> NDArray[np.float64]:
    """The mean of each group (row g: label g; 0 for a label no row has), with
    :func:`group_means`'s checks and shapes."""
    arr = np.asarray(x, dtype=np.float64)
    lab = np.asarray(labels)
    if arr.ndim not in (1, 2):
        raise MechanismError("x must be a 2-D matrix (records × attributes)")
    if lab.ndim != 1 or lab.shape[0] != arr.shape[0]:
        raise MechanismError(
            f"labels must be 1-D with one label per row: got shape {lab.shape} "
            f"for {arr.shape[0]} rows"
        )
    if lab.size and (not np.issubdtype(lab.dtype, np.integer) or int(lab.min()) < 0):
        raise MechanismError("labels must be non-negative integers")
    if not np.isfinite(arr).all():
        raise MechanismError("x has non-finite values (NaN or ±inf)")
    mat = arr if arr.ndim == 2 else arr[:, None]
    counts = np.bincount(lab)
    sums = np.empty((counts.size, mat.shape[1]))
    for j in range(mat.shape[1]):
        sums[:, j] = np.bincount(lab, weights=mat[:, j], minlength=counts.size)
    used = counts > 0
    sums[used] /= counts[used, None]
    return sums if arr.ndim == 2 else sums[:, 0]


def microaggregate(
    x: NDArray[np.float64],
    k: int,
    *,
    algorithm: str = "mdav",
    standardize: bool = True,
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Masked values (each value replaced by its group mean) and the group labels.

    ``algorithm="mdav"``: labels of shape (n,), one multivariate group per record.
    ``algorithm="ranking"``: individual ranking, labels of shape (n, p), one per value
    (``standardize`` does not apply).
    """
    algo = str(algorithm)
    if algo not in ("mdav", "ranking"):
        raise MechanismError(
            f"unknown microaggregation algorithm {algo!r}: use 'mdav' or 'ranking'"
        )
    kk = _check_k(k)
    arr = _as_matrix(x, kk)
    if algo == "mdav":
        labels = _mdav(arr, kk, standardize)
        return group_means(arr, labels), labels
    lab2 = _ranking(arr, kk)
    masked = np.empty_like(arr)
    for j in range(arr.shape[1]):
        masked[:, j] = group_means(arr[:, j], lab2[:, j])
    return masked, lab2
