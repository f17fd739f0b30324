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
weights, use the direct exact method. Memory is O(n p): no distance matrix is formed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from gateway.errors import MechanismError

__all__ = ["Block", "group_means", "mdav_blocks", "mdav_groups", "microaggregate", "ranking_groups"]

_U64 = 2.0**-53  # unit roundoff of float64
_U32 = 2.0**-24  # unit roundoff of float32
_TINY32 = 2.0**-149  # smallest float32 subnormal: absolute rounding error below the normal range
_SAFE = 1e-9  # extra relative widening of every pruning bound (bounds are never tight)

# Remaining sets of at most this many records are processed by the direct exact method (both
# methods give the same partition). Below ~1000 records the two cost the same on 3 numeric
# columns, but on the ~70 embedded columns of a whole key with nominal attributes the direct
# steps cost m·p each: 128 rather than 1024 took MDAV on 4,900 Adult records from 122 to 91 ms.
_DIRECT_MAX = 128


# A group of columns of x and a code per record (non-negative integers) such that records with
# equal codes have equal values in those columns: a nominal attribute's one-hot block, the code
# being its category. MDAV then evaluates those columns by table look-up (_Lookup).
Block = tuple[NDArray[np.intp], NDArray[np.int64]]

# Columns of a matrix: a slice when they are consecutive (a view, no gather), else positions.
Index = slice | NDArray[np.intp]

# Rows per chunk when _Lookup checks its blocks against the data (small, cache-resident
# temporaries instead of two of n rows).
_CHECK_ROWS = 256
_SEQ_ROWS = 256  # rows per block of sdcMicro's sequential column sum (_seq_colsum_of)

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
# sdcMicro's arithmetic
# ---------------------------------------------------------------------------------------------


def _seq_colsum(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    """Column sums added strictly in row order (accumulate is sequential by definition)."""
    out: NDArray[np.float64] = np.add.accumulate(rows, axis=0)[-1]
    return out


def _seq_colsum_of(x: NDArray[np.float64], idx: NDArray[np.intp]) -> NDArray[np.float64]:
    """``_seq_colsum(x[idx])``, the same additions, a few hundred rows at a time: the running
    sum is added to a block's first row (the very addition accumulate makes there) before
    the block is accumulated, so no temporary of len(idx) rows is formed."""
    acc: NDArray[np.float64] | None = None
    for start in range(0, idx.size, _SEQ_ROWS):
        block = x[idx[start : start + _SEQ_ROWS]]
        if acc is not None:
            block[0] += acc
        acc = np.add.accumulate(block, axis=0)[-1]
    assert acc is not None
    return acc


def _sdc_weights(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """w_j = 1 / ((Σx²)/n - ((Σx)/n)²) with sequential sums; 1 where that is exactly 0."""
    n = x.shape[0]
    avr = _seq_colsum(x) / n
    sq = _seq_colsum(x * x) / n
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


def _exact_dist(
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


def _first_max(f: NDArray[np.float32], idx: NDArray[np.intp]) -> int:
    """Row index of the maximum of f, the smallest row index among equal maxima."""
    top = f.max()
    return int(idx[f == top].min())


def _k_smallest(f: NDArray[np.float32], idx: NDArray[np.intp], k: int) -> NDArray[np.intp]:
    """Positions of the first k entries ordered by (f ascending, row index descending)."""
    if f.size > k:
        kth = np.partition(f, k - 1)[k - 1]
        cand = np.flatnonzero(f <= kth)
    else:
        cand = np.arange(f.size)
    order = np.lexsort((-idx[cand], f[cand]))
    out: NDArray[np.intp] = cand[order[:k]]
    return out


# ---------------------------------------------------------------------------------------------
# MDAV engine
# ---------------------------------------------------------------------------------------------


class _Mdav:
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

    # -- bookkeeping ---------------------------------------------------------------------------

    def _emit(self, rows: NDArray[np.intp]) -> None:
        self.labels[rows] = self.next_label
        self.next_label += 1
        self.alive[rows] = False
        self.m -= rows.size

    def run(self) -> NDArray[np.int64]:
        k = self.k
        pruned = _Pruned.build(self) if self.m > self.direct_max else None
        while self.m >= 2 * k:
            two = self.m >= 3 * k
            if pruned is not None and self.m > self.direct_max:
                pruned.step(two)
            else:
                self._direct_step(two)
        if self.m:
            self._emit(np.flatnonzero(self.alive))
        return self.labels

    # -- direct exact step ---------------------------------------------------------------------

    def _direct_step(self, two: bool) -> None:
        k, w = self.k, self.wx
        idx = np.flatnonzero(self.alive)
        rows = self.x[idx]
        centre = _seq_colsum(rows) / idx.size
        r = int(np.argmax(_exact_dist(rows, centre, w)))  # argmax: first among equal maxima
        fr = _exact_dist(rows, rows[r], w)
        s_row = rows[int(np.argmax(fr))].copy()
        grp = _k_smallest(fr, idx, k)
        self._emit(idx[grp])
        if two:
            keep = np.ones(idx.size, dtype=bool)
            keep[grp] = False
            idx2 = idx[keep]
            fs = _exact_dist(rows[keep], s_row, w)
            self._emit(idx2[_k_smallest(fs, idx2, k)])

    def exact_centre(self) -> NDArray[np.float64]:
        idx = np.flatnonzero(self.alive)
        out: NDArray[np.float64] = _seq_colsum_of(self.x, idx) / idx.size
        return out


class _Pruned:
    """Exact MDAV steps that evaluate sdcMicro's float32 distances on candidate sets only.

    Notation: z = (x - mu) * sqrt(w) over the non-constant columns, so that the real squared
    distance T² = Σ w_j (a_j - b_j)² is the squared Euclidean distance between z-rows.
    sdcMicro's float32 value f then satisfies
    f ∈ [(1-ρ)T² + K - ρ|K| - τ, (1+ρ)T² + K + ρ|K| + τ], where ρ bounds the relative
    float64/float32 rounding of p terms and their float32 sum, τ float32 underflow, and K is
    the contribution of the constant columns (0 between records; between a record and the
    centroid, a value that is the same for every record).

    One matrix-vector product over the remaining records (kept compact, in any order, in the
    columns of ``acol`` = [z; |z|²] by swap-removal) gives every squared distance to a query
    point within ``eps``; records that these bounds cannot separate from the maximum (or from
    the k-th smallest) get their exact float32 distance. The centroid is tracked as a running
    sum with a bound on its distance to sdcMicro's sequential-sum centroid; when candidates
    for the farthest record remain that differ, sdcMicro's centroid is computed exactly.

    z is formed only for the columns evaluated densely (``zd``, the z-rows of ``acol``); the
    columns of the look-up blocks (``_Lookup``) exist as z only in its table of distinct
    combinations, and |z|² is the sum of both parts.

    The running sum's error is tracked as one scalar. With A_j = max |x_ij| over all records,
    any r remaining values of column j have Σ|x| ≤ r·A_j, and ``err`` keeps
    |tot_j - S_j| ≤ err·A_j for every column at once (S_j: the exact sum of the remaining
    records): err = 1.01 m² u after summing m rows afresh in any order (γ_{m-1} Σ|x|), and a
    removal of r rows, their sum taken in any order (≤ 1.01 r² u A_j) and then subtracted
    (rounding ≤ u |tot_new| ≤ u (m + e) A_j with e the error before that rounding), gives
    err ← (err + 1.01 r² u)(1 + u) + u m. sdcMicro's centroid, its sequential sum (within
    1.01 m u Σ|x| ≤ 1.01 m² u A_j of S_j) divided by m, is then within
    A_j (err/m + 1.01 m u (2 + err/m) + 6.01 u (1 + err/m)) + 4 u |mu_j| of our z's centroid
    column by column, |c_j| ≤ (1 + err/m)(1 + u) A_j covering both divisions and z's
    subtraction and product (a column-wise bound of the same form as a per-column tally of
    Σ|x|, only with Σ|x| ≤ m A_j); by the triangle inequality its z-distance is at most that
    factor times |A·sqrt(w)| plus 4u |mu·sqrt(w)|, two norms computed once.
    """

    def __init__(self, md: _Mdav, cols: NDArray[np.intp], big: NDArray[np.float64]) -> None:
        self.md = md
        x, w, n = md.x, md.w, md.n
        const = np.setdiff1d(np.arange(md.p), cols)
        self.const = const
        xs = x if cols.size == md.p else x[:, cols]  # only read: no copy of x when it can be
        self.xs = xs
        scale = np.sqrt(w[cols])
        self.scale = scale
        self.unit = bool((scale == 1.0).all())  # then (c - mu) * scale = c - mu exactly
        mu = xs.mean(axis=0)
        self.mu = mu
        look = _Lookup.build(md, cols, xs, mu, scale) if md.blocks else None
        self.look = look
        dense = _span(np.arange(cols.size) if look is None else look.dense)
        self.dense = dense
        zd = xs[:, dense] - mu[dense]  # z of the densely evaluated columns, (n, nd)
        zd *= scale[dense]
        self.zd = zd
        sq = (zd * zd).sum(axis=1)
        if look is not None:
            sq += look.sq.take(look.rcode)
        self.sq = sq  # |z|² by record
        radius = math.sqrt(float(sq.max()))
        p = md.p
        self.rho = (p + 4) * _U32 * (1.0 + _SAFE)
        self.tau = (4 * p + 4) * _TINY32
        # |float64 squared z-distance (direct or by dot products) - T²| ≤ eps: rounding of z,
        # of sqrt(w) and of the sums, all within 64 (p + 10) u (|z_a| + |z_b|)².
        # v (see _distances) is |z_x|² + Σ_j (-2 zq_j) z_xj: an inner product of length p + 1
        # (|z_x|² being a term with factor 1; the factor -2 is exact), whatever the grouping
        # of its terms. Its float64 value, in any order of summation (dense, or a lookup
        # table of partial dot products plus a dense remainder, _Lookup), is within
        # γ_{p+1} Σ_j |terms| ≤ γ_{p+1} (|z_x| + |zq|)² of the exact value with the same z:
        # the same bound as the dense product, so eps does not depend on the grouping (nor
        # on the order of the p squares summed into |z_x|² or |zq|²).
        rel = max(1e-13, 64.0 * (cols.size + 10) * _U64)
        self.eps = rel * (2.0 * radius + 1.0) ** 2 + 1e-300
        # constant columns: sdcMicro's centroid there is the sequential sum of m equal values / m
        self.const_sums = (
            np.add.accumulate(np.broadcast_to(x[0, const], (n, const.size)), axis=0)
            if const.size
            else np.zeros((n, 0))
        )
        nd = zd.shape[1]
        self.acol = np.empty((nd + 1, n))
        self.acol[:-1] = zd.T
        self.acol[-1] = sq
        self.ids = np.arange(n)  # position -> record
        self.pos = np.arange(n)  # record -> position
        self.qv = np.ones(nd + 1)
        self.qvd = self.qv[:-1]
        # the centroid's error bound (see the class docstring): two norms, then scalars only
        bs, ms = big[cols] * scale, mu * scale
        self.norm_big = math.sqrt(float(bs @ bs)) * (1.0 + 1e-6)
        self.norm_mu = math.sqrt(float(ms @ ms)) * (1.0 + 1e-6)
        self.tot = np.zeros(cols.size)
        self.err = 0.0
        self.m_sums = 0
        self._reset_sums()

    @staticmethod
    def build(md: _Mdav) -> _Pruned | None:
        w = md.w
        hi, lo = md.x.max(axis=0), md.x.min(axis=0)
        cols = np.flatnonzero(hi > lo)  # hi - lo > 0 (finite values: no cancellation to 0)
        if cols.size == 0 or not (w[cols] > 0).all():
            return None  # degenerate weights: the direct exact method handles them
        return _Pruned(md, cols, np.maximum(hi, -lo))

    # -- running centroid and removal ----------------------------------------------------------

    def _reset_sums(self) -> None:
        md = self.md
        m = md.m
        live = self.xs if m == md.n else self.xs[self.ids[:m]]
        self.tot = live.sum(axis=0)
        self.err = 1.01 * m * m * _U64  # valid for any order of summation
        self.m_sums = m
        if self.look is not None:
            self.look.compact(m, self.ids)

    def remove(self, rows: NDArray[np.intp]) -> None:
        """Bookkeeping after ``rows`` were grouped (``md.m`` already decreased)."""
        m_new = self.md.m
        r = rows.size
        self.tot -= np.add.reduce(self.xs[rows], axis=0)
        self.err = (self.err + 1.01 * r * r * _U64) * (1.0 + _U64) + _U64 * m_new
        # swap-removal: records from the tail move into the holes left in [0, m_new)
        # (the tail's records still alive, md.alive being already updated, are the movers)
        gp = self.pos[rows]
        holes = gp[gp < m_new]
        if holes.size:
            tail = self.ids[m_new : m_new + r]
            stay = self.md.alive[tail]
            moved = tail[stay]
            movers = np.flatnonzero(stay)
            movers += m_new
            self.acol[:, holes] = self.acol[:, movers]
            if self.look is not None:
                self.look.codes[holes] = self.look.codes[movers]
            self.ids[holes] = moved
            self.pos[moved] = holes

    def _approx_centre(self) -> tuple[NDArray[np.float64], float]:
        """z of the approximate centroid and a bound on its distance to sdcMicro's centroid."""
        m = self.md.m
        if m * 2 < self.m_sums:
            self._reset_sums()
        zc = self.tot / m
        zc -= self.mu
        if not self.unit:
            zc *= self.scale
        e = self.err / m
        beta = (e + 1.01 * m * _U64 * (2.0 + e) + 6.01 * _U64 * (1.0 + e)) * (1.0 + 1e-6)
        # (+1e-150: the terms of columns whose squares underflowed in the two norms)
        dz = (beta * self.norm_big + 4.0 * _U64 * self.norm_mu) * (1.0 + 1e-6) + 1e-150
        return zc, dz

    def _const_term(self) -> tuple[float, float]:
        """Value, and a bound on its magnitude, of the constant columns' centroid distance."""
        if not self.const.size:
            return 0.0, 0.0
        m = self.md.m
        d = self.md.x[0, self.const] - self.const_sums[m - 1] / m
        t = (d * d * self.md.w[self.const]).astype(np.float32).astype(np.float64)
        return float(t.sum()), float(np.abs(t).sum()) * (1.0 + 1e-6)

    # -- searches --------------------------------------------------------------------------------

    def _distances(
        self, qd: NDArray[np.float64], ql: NDArray[np.float64] | None, m: int
    ) -> NDArray[np.float64]:
        """v by position with |v + |zq|² - T(x, q)²| ≤ eps for the first m positions; the
        query's z split into its dense (``qd``) and looked-up (``ql``) columns."""
        np.multiply(qd, -2.0, out=self.qvd)
        v: NDArray[np.float64] = self.qv @ self.acol[:, :m]
        look = self.look
        if look is not None:
            assert ql is not None
            v += look.table(ql).take(look.codes[:m])
        return v

    def _record_distances(self, q: int, m: int) -> tuple[NDArray[np.float64], float]:
        """v (see ``_distances``) and |zq|² for the query record q."""
        look = self.look
        if look is None:
            return self._distances(self.zd[q], None, m), float(self.sq[q])
        c = int(look.rcode[q])
        tab = look.cache.get(c)
        if tab is None:
            tab = look.cache[c] = look.table(look.zu[c])
        np.multiply(self.zd[q], -2.0, out=self.qvd)
        v: NDArray[np.float64] = self.qv @ self.acol[:, :m]
        v += tab.take(look.codes[:m])
        return v, float(self.sq[q])

    def _farthest(
        self, v: NDArray[np.float64], q2: float, dz: float, kc: float, kabs: float
    ) -> tuple[int, NDArray[np.intp] | None]:
        """The farthest position if the bounds single it out, else (-1, candidate records).

        dz bounds the distance between the query used for v and the true query point."""
        rho, tau, eps = self.rho, self.tau, self.eps
        i = int(v.argmax())
        top = float(v[i])
        lo_t = max(math.sqrt(max(top + q2 - eps, 0.0)) - dz, 0.0)
        best_lo = ((1.0 - rho) * lo_t * lo_t + kc - rho * kabs - tau) * (1.0 - _SAFE)
        # hi(a) = (1+ρ)(√(a+eps) + dz)² + kc + ρ|K| + τ is below best_lo for every a < thr
        inner = (best_lo - kc - rho * kabs - tau) / (1.0 + rho)
        if inner <= 0.0:
            thr = -math.inf
        else:
            root = max(math.sqrt(inner) * (1.0 - _SAFE) - dz, 0.0)
            thr = root * root * (1.0 - _SAFE) - eps - q2
            thr -= 4.0 * _U64 * (abs(thr) + q2) + 1e-300
        v[i] = -math.inf
        second = float(v.max()) if v.size > 1 else -math.inf
        v[i] = top
        if second < thr:
            return i, None
        return -1, self.ids[np.flatnonzero(v >= thr)]

    def _farthest_from_centre(self) -> int:
        md = self.md
        m = md.m
        zc, dz = self._approx_centre()
        kc, kabs = self._const_term()
        look = self.look
        ql = None if look is None else zc[look.lpos]
        v = self._distances(zc[self.dense], ql, m)
        i, cand = self._farthest(v, float(zc @ zc), dz, kc, kabs)
        if cand is None:
            return int(self.ids[i])
        rows = md.x[cand]
        if (rows == rows[0]).all():
            return int(cand.min())  # identical records have identical distances
        f = _exact_dist(rows, md.exact_centre(), md.wx)
        return _first_max(f, cand)

    def _farthest_from(self, v: NDArray[np.float64], q2: float, q: int) -> int:
        md = self.md
        i, cand = self._farthest(v, q2, 0.0, 0.0, 0.0)
        if cand is None:
            return int(self.ids[i])
        f = _exact_dist(md.x[cand], md.x[q], md.wx)
        return _first_max(f, cand)

    def _nearest(self, v: NDArray[np.float64], q2: float, q: int) -> NDArray[np.intp]:
        """The k records sdcMicro groups around record q; v (overwritten) by position."""
        md = self.md
        k = md.k
        rho, tau, eps = self.rho, self.tau, self.eps
        if k <= 6:
            near = np.empty(k + 1, dtype=np.intp)
            vals = np.empty(k + 1)
            for j in range(k + 1):
                i = int(v.argmin())
                near[j] = i
                vals[j] = v[i]
                v[i] = math.inf
        else:
            near = np.argpartition(v, k)[: k + 1]
            vals = v[near]
            order = np.argsort(vals, kind="stable")
            near, vals = near[order], vals[order]
        upper = (1.0 + rho) * (float(vals[k - 1]) + q2 + eps) + tau
        # a record whose lower bound (1-ρ)(a - eps) - τ exceeds ``upper`` is not among the k
        thr = ((upper + tau) / (1.0 - rho) + eps) * (1.0 + _SAFE) - q2
        thr += 4.0 * _U64 * (abs(thr) + q2) + 1e-300
        if float(vals[k]) > thr:
            # exactly k candidates: they are the group whatever their exact distances. Their
            # order matters nowhere: labels take the set, and the swap-removal and running
            # sums that follow are exact for any order of positions (bounds for any order)
            grp: NDArray[np.intp] = self.ids[near[:k]]
            return grp
        v[near] = vals  # undo the marks of the argmin passes
        cand = self.ids[np.flatnonzero(v <= thr)]
        f = _exact_dist(md.x[cand], md.x[q], md.wx)
        out: NDArray[np.intp] = cand[_k_smallest(f, cand, k)]
        return out

    def step(self, two: bool) -> None:
        md = self.md
        m = md.m  # at least 2k here, so every v below has more than k entries
        r = self._farthest_from_centre()
        v, q2 = self._record_distances(r, m)
        s = self._farthest_from(v, q2, r) if two else -1  # chosen before r's group leaves
        grp_r = self._nearest(v, q2, r)
        md._emit(grp_r)
        if two:
            v, q2 = self._record_distances(s, m)
            v[self.pos[grp_r]] = math.inf  # r's group is no longer a candidate
            grp_s = self._nearest(v, q2, s)
            md._emit(grp_s)
            self.remove(np.concatenate((grp_r, grp_s)))
        else:
            self.remove(grp_r)


def _span(idx: NDArray[np.intp]) -> Index:
    """``idx`` (sorted, distinct) as a slice when it is a run of consecutive columns."""
    if idx.size == 0 or int(idx[-1]) - int(idx[0]) + 1 == idx.size:
        return slice(int(idx[0]) if idx.size else 0, int(idx[-1]) + 1 if idx.size else 0)
    return idx


class _Lookup:
    """The part of v (see ``_Pruned._distances``) that comes from the columns of ``blocks``.

    Records with equal codes in every block have equal z in all these columns; the remaining
    records carry one combined code (``codes``, by position, swap-removed with ``acol``;
    ``rcode`` by record) that indexes ``zu``, the distinct z-rows over these columns. For a
    query zq, their contribution Σ_j (-2 zq_j) z_xj is then ``(zu @ -2 zq)[code_x]``: one small
    matrix-vector product over the distinct combinations and a gather over the m remaining
    records, instead of a dense product over all those columns. Few distinct combinations
    (Adult's six nominal attributes: ~600 among 5,000 records, ~64 one-hot columns) make this
    several times cheaper. ``zu`` holds the values z has in these columns (the same float
    operations on the same x values), so v is the same inner product as the dense one, its
    terms only grouped differently (which the bound eps allows, see ``_Pruned``); the -2 is
    folded into ``zm2`` (an exact scaling).
    """

    def __init__(
        self,
        dense: NDArray[np.intp],
        lpos: Index,
        codes: NDArray[np.intp],
        zu: NDArray[np.float64],
    ) -> None:
        self.dense = dense  # positions in cols evaluated densely
        self.lpos = lpos  # positions in cols looked up
        self.codes = codes
        self.rcode = codes.copy()
        self.zu = zu
        self.zm2 = zu * -2.0
        self.sq = (zu * zu).sum(axis=1)  # |z|² over the looked-up columns, per combination
        self.cache: dict[int, NDArray[np.float64]] = {}  # a record query's table, by its code

    @staticmethod
    def build(
        md: _Mdav,
        cols: NDArray[np.intp],
        xs: NDArray[np.float64],
        mu: NDArray[np.float64],
        scale: NDArray[np.float64],
    ) -> _Lookup | None:
        """The look-up over ``md.blocks``, or None when it would not pay (or the blocks do not
        describe the data: then the dense product, which needs no promise, is used). ``xs``:
        x's columns ``cols``, ``mu`` and ``scale`` those of z."""
        n = md.n
        pos_of = np.full(md.p, -1, dtype=np.intp)
        pos_of[cols] = np.arange(cols.size)
        comb = np.zeros(n, dtype=np.int64)
        parts: list[NDArray[np.intp]] = []
        for bcols, bcodes in md.blocks:
            bp = pos_of[np.asarray(bcols, dtype=np.intp)]
            bp = bp[bp >= 0]
            if not bp.size:
                continue  # every column of the block is constant: not in cols
            c = np.asarray(bcodes, dtype=np.int64)
            if c.shape != (n,) or (c.size and int(c.min()) < 0):
                return None
            comb = comb * (int(c.max()) + 1) + c
            if int(comb.max()) >= 2**31:  # keep the mixed-radix code far from overflow
                comb = np.unique(comb, return_inverse=True)[1].astype(np.int64)
            parts.append(bp)
        if not parts:
            return None
        lpos = np.concatenate(parts)
        if np.unique(lpos).size != lpos.size:
            return None  # overlapping blocks
        lpos.sort()
        _, first, inv = np.unique(comb, return_index=True, return_inverse=True)
        if first.size * 4 > n:
            return None  # a table nearly as long as the data saves nothing
        lsl = _span(lpos)
        inv = inv.astype(np.intp).reshape(n)
        xu = np.ascontiguousarray(xs[first][:, lsl])
        # equal codes with different values: not a block. Checked on x (equal x, equal z) a
        # few hundred rows at a time, without temporaries of n rows.
        for start in range(0, n, _CHECK_ROWS):
            stop = start + _CHECK_ROWS
            if not np.array_equal(xs[start:stop, lsl], xu[inv[start:stop]]):
                return None
        zu = xu - mu[lsl]
        zu *= scale[lsl]
        dense = np.setdiff1d(np.arange(cols.size), lpos)
        return _Lookup(dense, lsl, inv, zu)

    def compact(self, m: int, ids: NDArray[np.intp]) -> None:
        """Drop the combinations that no remaining record (positions < m) has."""
        if m >= self.codes.size:
            return
        live = self.codes[:m]
        keep, inv = np.unique(live, return_inverse=True)
        if keep.size < self.zu.shape[0]:
            self.zu = np.ascontiguousarray(self.zu[keep])
            self.zm2 = np.ascontiguousarray(self.zm2[keep])
            self.cache.clear()
            inv = inv.reshape(m)
            self.codes[:m] = inv
            self.rcode[ids[:m]] = inv

    def table(self, ql: NDArray[np.float64]) -> NDArray[np.float64]:
        """Σ_j (-2 zq_j) z_j over the looked-up columns, per distinct combination."""
        out: NDArray[np.float64] = self.zm2 @ ql
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
    return _Mdav(x, k, w, direct_max, blocks).run()


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
    w = _sdc_weights(arr) if standardize else np.ones(arr.shape[1])
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
    if not lab.size:
        return arr.copy()
    mat = arr if arr.ndim == 2 else arr[:, None]
    counts = np.bincount(lab)
    sums = np.empty((counts.size, mat.shape[1]))
    for j in range(mat.shape[1]):
        sums[:, j] = np.bincount(lab, weights=mat[:, j], minlength=counts.size)
    used = counts > 0
    sums[used] /= counts[used, None]
    out: NDArray[np.float64] = sums[lab]
    return out if arr.ndim == 2 else out[:, 0]


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
