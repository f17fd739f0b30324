"""Exact MDAV steps on candidate sets only: one float64 matrix-vector product over the
remaining records bounds every squared distance to a query point, and the bounds between these
approximations and sdcMicro's float32 values leave, except for near-ties, one candidate for
"farthest" and exactly k for "nearest" (:mod:`gateway.grouping.microaggregation`). Columns of
one-hot nominal attributes are evaluated by table look-up (:class:`Lookup`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from gateway.grouping.mdav_anchor import Anchors
from gateway.grouping.mdav_arith import (
    SAFE,
    TINY32,
    U32,
    U64,
    exact_dist,
    first_max,
    k_smallest,
    rows_match,
)

# A group of columns of x and a code per record (non-negative integers) such that records with
# equal codes have equal values in those columns: a nominal attribute's one-hot block, the code
# being its category. MDAV then evaluates those columns by table look-up (Lookup).
Block = tuple[NDArray[np.intp], NDArray[np.int64]]

# Columns of a matrix: a slice when they are consecutive (a view, no gather), else positions.
Index = slice | NDArray[np.intp]


class Mdav(Protocol):
    """What the pruned steps read and advance of one MDAV run (``Mdav`` in
    :mod:`gateway.grouping.microaggregation`, which runs them): the matrix and its weights, the
    records not yet grouped, and the groups emitted."""

    x: NDArray[np.float64]
    w: NDArray[np.float64]
    wx: NDArray[np.float64] | None
    blocks: Sequence[Block]
    k: int
    n: int
    p: int
    m: int
    alive: NDArray[np.bool_]

    def exact_centre(self) -> NDArray[np.float64]: ...

    def emit(self, rows: NDArray[np.intp]) -> None: ...


class Pruned:
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

    The first search of a step, the record farthest from the centroid, evaluates v only on
    the records an :class:`~gateway.grouping.mdav_anchor.Anchor` (the farthest records from an
    earlier centroid) cannot rule out, and makes the full pass only when it cannot tell.

    z is formed only for the columns evaluated densely (``zd``, the z-rows of ``acol``); the
    columns of the look-up blocks (``Lookup``) exist as z only in its table of distinct
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

    def __init__(self, md: Mdav, cols: NDArray[np.intp], big: NDArray[np.float64]) -> None:
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
        look = Lookup.build(md, cols, xs, mu, scale) if md.blocks else None
        self.look = look
        dense = span(np.arange(cols.size) if look is None else look.dense)
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
        self.rho = (p + 4) * U32 * (1.0 + SAFE)
        self.tau = (4 * p + 4) * TINY32
        # |float64 squared z-distance (direct or by dot products) - T²| ≤ eps: rounding of z,
        # of sqrt(w) and of the sums, all within 64 (p + 10) u (|z_a| + |z_b|)².
        # v (see _distances) is |z_x|² + Σ_j (-2 zq_j) z_xj: an inner product of length p + 1
        # (|z_x|² being a term with factor 1; the factor -2 is exact), whatever the grouping
        # of its terms. Its float64 value, in any order of summation (dense, or a lookup
        # table of partial dot products plus a dense remainder, Lookup), is within
        # γ_{p+1} Σ_j |terms| ≤ γ_{p+1} (|z_x| + |zq|)² of the exact value with the same z:
        # the same bound as the dense product, so eps does not depend on the grouping (nor
        # on the order of the p squares summed into |z_x|² or |zq|²).
        rel = max(1e-13, 64.0 * (cols.size + 10) * U64)
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
        self.anchors = Anchors()  # the farthest from an earlier centroid

    @staticmethod
    def build(md: Mdav) -> Pruned | None:
        w = md.w
        hi, lo = md.x.max(axis=0), md.x.min(axis=0)
        cols = np.flatnonzero(hi > lo)  # hi - lo > 0 (finite values: no cancellation to 0)
        if cols.size == 0 or not (w[cols] > 0).all():
            return None  # degenerate weights: the direct exact method handles them
        return Pruned(md, cols, np.maximum(hi, -lo))

    # -- running centroid and removal ----------------------------------------------------------

    def _reset_sums(self) -> None:
        md = self.md
        m = md.m
        live = self.xs if m == md.n else self.xs[self.ids[:m]]
        self.tot = live.sum(axis=0)
        self.err = 1.01 * m * m * U64  # valid for any order of summation
        self.m_sums = m
        if self.look is not None:
            self.look.compact(m, self.ids)

    def remove(self, rows: NDArray[np.intp]) -> None:
        """Bookkeeping after ``rows`` were grouped (``md.m`` already decreased)."""
        m_new = self.md.m
        r = rows.size
        self.tot -= np.add.reduce(self.xs[rows], axis=0)
        self.err = (self.err + 1.01 * r * r * U64) * (1.0 + U64) + U64 * m_new
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
        beta = (e + 1.01 * m * U64 * (2.0 + e) + 6.01 * U64 * (1.0 + e)) * (1.0 + 1e-6)
        # (+1e-150: the terms of columns whose squares underflowed in the two norms)
        dz = (beta * self.norm_big + 4.0 * U64 * self.norm_mu) * (1.0 + 1e-6) + 1e-150
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

    def _distances_at(
        self, qd: NDArray[np.float64], ql: NDArray[np.float64] | None, at: NDArray[np.intp]
    ) -> NDArray[np.float64]:
        """``_distances`` at the positions ``at`` only."""
        np.multiply(qd, -2.0, out=self.qvd)
        v: NDArray[np.float64] = self.qv @ self.acol[:, at]
        look = self.look
        if look is not None:
            assert ql is not None
            v += look.table(ql).take(look.codes[at])
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

    def _farthest(  # noqa: PLR0917 - the bounds' terms
        self,
        v: NDArray[np.float64],
        q2: float,
        dz: float,
        kc: float,
        kabs: float,
        ids: NDArray[np.intp],
    ) -> tuple[int, NDArray[np.intp] | None]:
        """The farthest record if the bounds single it out, else (-1, candidate records);
        ``ids``: the record of each entry of v (which holds every record the bounds cannot
        rule out).

        dz bounds the distance between the query used for v and the true query point."""
        rho, tau, eps = self.rho, self.tau, self.eps
        i = int(v.argmax())
        top = float(v[i])
        lo_t = max(math.sqrt(max(top + q2 - eps, 0.0)) - dz, 0.0)
        best_lo = ((1.0 - rho) * lo_t * lo_t + kc - rho * kabs - tau) * (1.0 - SAFE)
        # hi(a) = (1+ρ)(√(a+eps) + dz)² + kc + ρ|K| + τ is below best_lo for every a < thr
        inner = (best_lo - kc - rho * kabs - tau) / (1.0 + rho)
        if inner <= 0.0:
            thr = -math.inf
        else:
            root = max(math.sqrt(inner) * (1.0 - SAFE) - dz, 0.0)
            thr = root * root * (1.0 - SAFE) - eps - q2
            thr -= 4.0 * U64 * (abs(thr) + q2) + 1e-300
        v[i] = -math.inf
        second = float(v.max()) if v.size > 1 else -math.inf
        v[i] = top
        if second < thr:
            return int(ids[i]), None
        return -1, ids[np.flatnonzero(v >= thr)]

    def _farthest_from_centre(self) -> int:
        md = self.md
        m = md.m
        zc, dz = self._approx_centre()
        kc, kabs = self._const_term()
        look = self.look
        ql = None if look is None else zc[look.lpos]
        q2 = float(zc @ zc)
        # the width of _farthest's bounds in distance, with room (mdav_anchor)
        extra = 3.0 * dz + 6.0 * math.sqrt(self.eps)
        extra += 2.0 * math.sqrt(2.0 * self.rho * kabs + 2.0 * self.tau + SAFE * kabs)
        near = self.anchors.candidates(zc, md.alive, 4.0 * self.rho + 1e-4, extra)
        if near is None:  # a full pass, and a new anchor from it
            v = self._distances(zc[self.dense], ql, m)
            self.anchors.full_pass(zc, v, q2, self.ids, self.eps)
            i, cand = self._farthest(v, q2, dz, kc, kabs, self.ids)
        else:
            v = self._distances_at(zc[self.dense], ql, self.pos[near])
            i, cand = self._farthest(v, q2, dz, kc, kabs, near)
        if cand is None:
            return i
        rows = md.x[cand]
        if (rows == rows[0]).all():
            return int(cand.min())  # identical records have identical distances
        f = exact_dist(rows, md.exact_centre(), md.wx)
        return first_max(f, cand)

    def _farthest_from(self, v: NDArray[np.float64], q2: float, q: int) -> int:
        md = self.md
        i, cand = self._farthest(v, q2, 0.0, 0.0, 0.0, self.ids[: v.size])
        if cand is None:
            return i
        f = exact_dist(md.x[cand], md.x[q], md.wx)
        return first_max(f, cand)

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
        thr = ((upper + tau) / (1.0 - rho) + eps) * (1.0 + SAFE) - q2
        thr += 4.0 * U64 * (abs(thr) + q2) + 1e-300
        if float(vals[k]) > thr:
            # exactly k candidates: they are the group whatever their exact distances. Their
            # order matters nowhere: labels take the set, and the swap-removal and running
            # sums that follow are exact for any order of positions (bounds for any order)
            grp: NDArray[np.intp] = self.ids[near[:k]]
            return grp
        v[near] = vals  # undo the marks of the argmin passes
        cand = self.ids[np.flatnonzero(v <= thr)]
        f = exact_dist(md.x[cand], md.x[q], md.wx)
        out: NDArray[np.intp] = cand[k_smallest(f, cand, k)]
        return out

    def step(self, two: bool) -> None:
        md = self.md
        m = md.m  # at least 2k here, so every v below has more than k entries
        r = self._farthest_from_centre()
        v, q2 = self._record_distances(r, m)
        s = self._farthest_from(v, q2, r) if two else -1  # chosen before r's group leaves
        grp_r = self._nearest(v, q2, r)
        md.emit(grp_r)
        if two:
            v, q2 = self._record_distances(s, m)
            v[self.pos[grp_r]] = math.inf  # r's group is no longer a candidate
            grp_s = self._nearest(v, q2, s)
            md.emit(grp_s)
            self.remove(np.concatenate((grp_r, grp_s)))
        else:
            self.remove(grp_r)


def span(idx: NDArray[np.intp]) -> Index:
    """``idx`` (sorted, distinct) as a slice when it is a run of consecutive columns."""
    if idx.size == 0 or int(idx[-1]) - int(idx[0]) + 1 == idx.size:
        return slice(int(idx[0]) if idx.size else 0, int(idx[-1]) + 1 if idx.size else 0)
    return idx


class Lookup:
    """The part of v (see ``Pruned._distances``) that comes from the columns of ``blocks``.

    Records with equal codes in every block have equal z in all these columns; the remaining
    records carry one combined code (``codes``, by position, swap-removed with ``acol``;
    ``rcode`` by record) that indexes ``zu``, the distinct z-rows over these columns. For a
    query zq, their contribution Σ_j (-2 zq_j) z_xj is then ``(zu @ -2 zq)[code_x]``: one small
    matrix-vector product over the distinct combinations and a gather over the m remaining
    records, instead of a dense product over all those columns. Few distinct combinations
    (Adult's six nominal attributes: ~600 among 5,000 records, ~64 one-hot columns) make this
    several times cheaper. ``zu`` holds the values z has in these columns (the same float
    operations on the same x values), so v is the same inner product as the dense one, its
    terms only grouped differently (which the bound eps allows, see ``Pruned``); the -2 is
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
        md: Mdav,
        cols: NDArray[np.intp],
        xs: NDArray[np.float64],
        mu: NDArray[np.float64],
        scale: NDArray[np.float64],
    ) -> Lookup | None:
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
        lsl = span(lpos)
        inv = inv.astype(np.intp).reshape(n)
        xu = np.ascontiguousarray(xs[first][:, lsl])
        # equal codes with different values: not a block (checked on x: equal x, equal z)
        if not rows_match(xs, lsl, xu, inv):
            return None
        zu = xu - mu[lsl]
        zu *= scale[lsl]
        dense = np.setdiff1d(np.arange(cols.size), lpos)
        return Lookup(dense, lsl, inv, zu)

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
