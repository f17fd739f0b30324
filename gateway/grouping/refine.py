"""Local improvement of a microaggregation partition: exchanges and moves of single records
between neighbouring groups that lower the within-group sum of squares, group sizes kept in
k..max_size.

MDAV builds groups greedily from the outside in, so a record often sits in a group whose
centroid is farther than a neighbouring group's: the classic remedy is a k-means-like
pass constrained by the group sizes (Domingo-Ferrer & Mateo-Sanz 2002, "Practical
data-oriented microaggregation for statistical disclosure control", §5; Laszlo & Mukherjee
2005). Each pass evaluates, for every record, the exchange with every member of its group's
nearest groups and the move to them, then applies the best non-overlapping ones (each group in at
most one operation a pass), so every applied operation lowers the total exactly by its
computed gain. The total strictly decreases; the search stops after a few passes or when a
pass gains little, since the first passes give nearly all of it.

For a record i of group g and j of group h, with centroids c and sizes n, δ = x_j - x_i:

* exchange: ΔSSE = -2 (c_g - c_h)·δ - |δ|² (1/n_g + 1/n_h);
* move of i to h: ΔSSE = n_h/(n_h+1) |x_i - c_h|² - n_g/(n_g-1) |x_i - c_g|².
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from gateway.errors import MechanismError
from gateway.grouping.mdav_pruned import Block

_NEIGHBOURS = 4  # other groups looked at per group
_CHUNK = 256  # groups per distance block: _CHUNK x groups floats, reused (cache-sized at ~5,000)
_MAX_PASSES = 8
_ENOUGH = 1e-4  # a pass removing less than this share of the total sum of squares is the last


def refine_groups(
    x: NDArray[np.float64],
    labels: NDArray[np.int64],
    k: int,
    *,
    max_size: int | None = None,
    blocks: Sequence[Block] = (),
) -> NDArray[np.int64]:
    """``labels`` (0..g-1, every group k..max_size, default 2k-1) improved, on a copy: same
    number of groups, same size bounds, a lower or equal sum of squared distances of the rows
    of ``x`` to their group's centroid. Deterministic for the same input.

    ``blocks``: x's one-hot blocks (columns, each record's category among them), as the
    embedding gives them to MDAV: distances are then taken on the dense columns and, per
    block, from the record's category alone (:class:`_Coded`), not on every column."""
    lab = np.array(labels, dtype=np.int64)
    n = lab.size
    if x.shape[0] != n:
        raise MechanismError(f"{x.shape[0]} rows but {n} labels")
    if n == 0:
        return lab
    sizes = np.bincount(lab)
    cap = max(2 * k - 1 if max_size is None else max_size, int(sizes.max()))
    if sizes.size < 2 or int(sizes.min()) < k:
        return lab  # nothing to exchange with, or not a partition this search keeps valid
    near = _neighbour_groups(_centres(x, lab, sizes))
    total = float(np.einsum("nd,nd->", x, x))
    geometry: _Dense | _Coded = _Coded.of(x, blocks) or _Dense(x)
    for _ in range(_MAX_PASSES):
        gained = _pass(geometry, lab, sizes, near, k, cap)
        if gained <= _ENOUGH * total:
            break
    return lab


def _centres(
    x: NDArray[np.float64], lab: NDArray[np.int64], sizes: NDArray[np.int64]
) -> NDArray[np.float64]:
    order = np.argsort(lab, kind="stable")
    starts = np.searchsorted(lab[order], np.arange(sizes.size))
    sums: NDArray[np.float64] = np.add.reduceat(x[order], starts, axis=0)
    return sums / sizes[:, None]


def _pass(  # noqa: PLR0917 - the search's state, passed whole
    geometry: _Dense | _Coded,
    lab: NDArray[np.int64],
    sizes: NDArray[np.int64],
    near: NDArray[np.int64],
    k: int,
    cap: int,
) -> float:
    """One pass: each row against the members of its group's neighbour groups ``near``.
    Returns the sum of squares it removed (0: nothing improved)."""
    groups = sizes.size
    centres = geometry.centres(lab, sizes)
    members = _members(lab, groups, cap)
    gains: list[NDArray[np.float64]] = []
    ops: list[NDArray[np.int64]] = []  # (i, j or -1, g, h)
    to = geometry.to(centres)
    own = to(lab)
    for col in range(near.shape[1]):
        h_all = near[lab, col]
        to_h = to(h_all)
        # only rows nearer h's centroid than their own look for a partner in h: the others'
        # exchanges rarely gain, and this keeps the pass to a few per cent of the rows
        i = np.flatnonzero(to_h < own)
        g, h = lab[i], h_all[i]
        js = members[h]  # rows x cap, -1 padded
        valid = js >= 0
        jj = np.where(valid, js, 0)
        dot, sq = geometry.pairs(centres, i, g, h, jj)  # (c_g - c_h)·δ and |δ|², δ = x_j - x_i
        inv = (1.0 / sizes[g] + 1.0 / sizes[h])[:, None]
        gain = -2.0 * dot - inv * sq
        gain = np.where(valid, gain, np.inf)
        rows = np.arange(i.size)
        best = np.argmin(gain, axis=1)
        g_best = gain[rows, best]
        ok = g_best < 0
        gains.append(g_best[ok])
        ops.append(np.column_stack([i[ok], jj[rows, best][ok], g[ok], h[ok]]))
        # moves where both sizes allow
        can = (sizes[g] > k) & (sizes[h] < cap)
        if can.any():
            ii, gi, hi = i[can], g[can], h[can]
            mg = sizes[hi] / (sizes[hi] + 1.0) * to_h[ii] - sizes[gi] / (sizes[gi] - 1.0) * own[ii]
            ok = mg < 0
            gains.append(mg[ok])
            ops.append(np.column_stack([ii[ok], np.full(int(ok.sum()), -1), gi[ok], hi[ok]]))
    gain_all = np.concatenate(gains)
    op_all = np.concatenate(ops)
    order = np.lexsort((op_all[:, 0], gain_all))  # best gain first, ties by row
    used = np.zeros(groups, dtype=bool)
    removed = 0.0
    for (i_, j_, g_, h_), gv in zip(op_all[order].tolist(), gain_all[order].tolist(), strict=True):
        if used[g_] or used[h_]:
            continue  # each group in one operation a pass: the gains stay exact
        used[g_] = used[h_] = True
        lab[i_] = h_
        if j_ >= 0:
            lab[j_] = g_
        else:
            sizes[g_] -= 1
            sizes[h_] += 1
        removed -= gv
    return removed


class _Dense:
    """Distances on every column of x."""

    def __init__(self, x: NDArray[np.float64]) -> None:
        self.x = x

    def centres(self, lab: NDArray[np.int64], sizes: NDArray[np.int64]) -> NDArray[np.float64]:
        return _centres(self.x, lab, sizes)

    def to(
        self, centres: NDArray[np.float64]
    ) -> Callable[[NDArray[np.int64]], NDArray[np.float64]]:
        """Squared distance of every row to the centroid of the group given per row."""
        x = self.x
        diff = np.empty_like(x)  # one buffer for each difference, formed once

        def sq(groups: NDArray[np.int64]) -> NDArray[np.float64]:
            np.subtract(x, centres[groups], out=diff)
            out: NDArray[np.float64] = np.einsum("nd,nd->n", diff, diff)
            return out

        return sq

    def pairs(
        self,
        centres: NDArray[np.float64],
        i: NDArray[np.int64],
        g: NDArray[np.int64],
        h: NDArray[np.int64],
        jj: NDArray[np.int64],
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        x = self.x
        delta = x[jj]  # rows x cap x columns, less each row's own (in place: no second copy)
        delta -= x[i][:, None, :]
        dc = (centres[g] - centres[h])[:, None, :]
        return np.einsum("nmd,nmd->nm", dc, delta), np.einsum("nmd,nmd->nm", delta, delta)


class _Coded:
    """Distances on x's dense columns plus, per one-hot block, a record's category alone: the
    record holds ``value`` in its category's column and 0 in the block's others, so for a
    centroid c the block adds |c_block|² - 2·value·c[category] + value², and between two
    records 2·value² if their categories differ. The same sums as on every column (up to
    rounding), at the cost of a few columns instead of every category's."""

    def __init__(
        self,
        x: NDArray[np.float64],
        dense: NDArray[np.intp],
        column: NDArray[np.intp],
        value: NDArray[np.float64],
        spans: list[tuple[int, int]],
    ) -> None:
        self.x = x
        self.dense_cols = dense
        self.dense = np.ascontiguousarray(x[:, dense])
        self.column = column  # rows x blocks: the column of each record's category
        self.value = value  # per block
        self.spans = spans  # per block, its columns [start, stop)

    @staticmethod
    def of(x: NDArray[np.float64], blocks: Sequence[Block]) -> _Coded | None:
        """x's layout, or None when the blocks do not describe it exactly (or save nothing):
        consecutive columns each, one value per block in each record's category's column, 0
        in the others."""
        if not blocks:
            return None
        n, p = x.shape
        spans, columns, values = [], [], []
        in_block = np.zeros(p, dtype=bool)
        for block_cols, codes in blocks:
            cols = np.asarray(block_cols, dtype=np.intp)
            if cols.size == 0 or not np.array_equal(cols, np.arange(cols[0], cols[0] + cols.size)):
                return None
            if codes.shape != (n,) or in_block[cols].any():
                return None
            at = cols[np.asarray(codes, dtype=np.intp)]
            held = x[np.arange(n), at]
            part = x[:, cols[0] : cols[-1] + 1]
            if n and (not (held == held[0]).all() or not (part.sum(axis=1) == held).all()):
                return None
            if n and not (np.count_nonzero(part, axis=1) <= 1).all():
                return None
            in_block[cols] = True
            spans.append((int(cols[0]), int(cols[-1]) + 1))
            columns.append(at)
            values.append(float(held[0]) if n else 0.0)
        dense = np.flatnonzero(~in_block)
        if dense.size + len(blocks) >= p:
            return None  # no narrower than x itself
        return _Coded(x, dense, np.column_stack(columns), np.asarray(values), spans)

    def centres(self, lab: NDArray[np.int64], sizes: NDArray[np.int64]) -> NDArray[np.float64]:
        """Each group's centroid over every column of x: the dense columns summed, a block's
        columns from the counts of its categories in the group."""
        groups, p = sizes.size, self.x.shape[1]
        out = np.zeros((groups, p))
        out[:, self.dense_cols] = _centres(self.dense, lab, sizes)
        for b, ((a, z), value) in enumerate(zip(self.spans, self.value.tolist(), strict=True)):
            # each group's count of each category, each record holding ``value`` there
            width = z - a
            counts = np.bincount(lab * width + (self.column[:, b] - a), minlength=groups * width)
            out[:, a:z] = counts.reshape(groups, width) * value / sizes[:, None]
        return out

    def to(
        self, centres: NDArray[np.float64]
    ) -> Callable[[NDArray[np.int64]], NDArray[np.float64]]:
        """Squared distance of every row to the centroid of the group given per row."""
        dense, column, value = self.dense, self.column, self.value
        c_dense = centres[:, self.dense_cols]
        # per group, what does not depend on the row: Σ_blocks |c_block|² + value²
        fixed = sum(
            (np.einsum("gd,gd->g", centres[:, a:b], centres[:, a:b]) for a, b in self.spans),
            start=np.full(centres.shape[0], float(value @ value)),
        )
        twice = 2.0 * value
        flat, p = centres.reshape(-1), centres.shape[1]

        def sq(groups: NDArray[np.int64]) -> NDArray[np.float64]:
            diff = dense - c_dense[groups]
            out: NDArray[np.float64] = np.einsum("nd,nd->n", diff, diff)
            at = flat.take(groups[:, None] * p + column)  # each row's category in its centroid
            out += fixed[groups]
            out -= at @ twice
            return out

        return sq

    def pairs(
        self,
        centres: NDArray[np.float64],
        i: NDArray[np.int64],
        g: NDArray[np.int64],
        h: NDArray[np.int64],
        jj: NDArray[np.int64],
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        dense, column, value = self.dense, self.column, self.value
        flat, p = centres.reshape(-1), centres.shape[1]
        c_dense = centres[:, self.dense_cols]
        delta = dense[jj]  # rows x cap x dense columns
        delta -= dense[i][:, None, :]
        dot = np.einsum("nmd,nd->nm", delta, c_dense[g] - c_dense[h])
        sq = np.einsum("nmd,nmd->nm", delta, delta)
        cj = column[jj]  # rows x cap x blocks: the partner's categories' columns
        ci = column[i][:, None, :]  # rows x 1 x blocks: the row's own
        gp, hp = (g * p)[:, None, None], (h * p)[:, None, None]
        # (c_g - c_h) at the partner's categories less at the row's, each block's value times
        at = flat.take(gp + cj) - flat.take(hp + cj) - (flat.take(gp + ci) - flat.take(hp + ci))
        dot += at @ value
        sq += (cj != ci) @ (2.0 * value * value)
        return dot, sq


def _neighbour_groups(centres: NDArray[np.float64]) -> NDArray[np.int64]:
    """Per group, its ``_NEIGHBOURS`` nearest other groups by centroid, nearest first, ties
    by group number (in float32: they only choose where to look; the gains are computed in
    float64)."""
    groups = centres.shape[0]
    m = min(_NEIGHBOURS, groups - 1)
    out = np.empty((groups, m), dtype=np.int64)
    c32 = np.ascontiguousarray(centres, dtype=np.float32)
    c2 = np.einsum("gd,gd->g", c32, c32)
    # -2 c (exact: a power of two) multiplied into one block reused for every chunk: a fresh
    # block of tens of MB is mapped anew, and page-faulted in, for each chunk
    twice = c32 * np.float32(-2.0)
    block = np.empty((min(_CHUNK, groups), groups), dtype=np.float32)
    for start in range(0, groups, _CHUNK):
        cs = twice[start : start + _CHUNK]
        rows = np.arange(cs.shape[0])
        # |c|² of the row's own centroid left out: the same for the whole row
        d = np.matmul(cs, c32.T, out=block[: cs.shape[0]])
        d += c2
        d[rows, start + rows] = np.inf
        # m passes of argmin (first among equal minima), each pick then ruled out: a tenth
        # of argpartition's time on a block this wide, and a defined order among ties
        for j in range(m):
            pick = d.argmin(axis=1)
            out[start : start + cs.shape[0], j] = pick
            d[rows, pick] = np.inf
    return out


def _members(lab: NDArray[np.int64], groups: int, cap: int) -> NDArray[np.int64]:
    """groups x cap matrix of each group's rows, -1 padded."""
    order = np.argsort(lab, kind="stable")
    sorted_lab = lab[order]
    starts = np.searchsorted(sorted_lab, np.arange(groups))
    pos = np.arange(lab.size) - starts[sorted_lab]
    out = np.full((groups, cap), -1, dtype=np.int64)
    out[sorted_lab, pos] = order
    return out
