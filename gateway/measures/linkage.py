"""Disclosure risk over the whole published quasi-identifier key: distance-based linkage.

**Distance-based record linkage** over all quasi-identifiers (Domingo-Ferrer & Torra
2001, "A quantitative comparison of disclosure control methods for microdata", in
*Confidentiality, Disclosure and Data Access*, North-Holland, pp. 111-134; Handbook §3.3,
"Distance-based record linkage"), with the heterogeneous distance of
:mod:`gateway.grouping.mixed_microaggregation` (Domingo-Ferrer & Torra, DMKD 11(2), 2005) as the
record-level distance. The intruder holds the original quasi-identifiers and links each
published record to its nearest original record; the share linked to its own original is
the risk. A second intruder matches the categorical quasi-identifiers exactly and then
takes the nearest original by the numeric ones (standardised).

Scaling of the linkage distance. Both files are embedded with the *original's* parameters:
the numeric and ordinal means and population standard deviations, and the nominal category
frequencies of the original (one-hot vectors scaled by 1/√(1 - Σ f_c²)), all computed on the
original records that take part in the linkage. This is :func:`embed`'s scaling fitted on the
original and applied unchanged to the published file, so that a published record is measured
with the same yardstick as the originals (embedding the published file with its own scaling,
or the concatenation of both, would move the originals' coordinates with the protection
applied). Pairwise distances among the originals are those of ``embed(columns, original)``
up to rounding. A column that is constant in the original separates no original records and
is left out of the distance, as ``embed`` does.

Rows are aligned: row i of ``published`` is the protected version of row i of ``original``
(positions, not index labels). A row with a missing linkage value in either file is left out
of both sides (counted in ``excluded``): neither linked nor a link target. At most
``max_records`` published rows, a sample drawn with ``numpy.random.default_rng(seed)``, are
linked, each against all kept originals. Ties (equal distances, e.g. duplicate original
records) are resolved as an intruder picking uniformly among the tied candidates: a record
counts 1/t when its own original is among the t nearest at equal distance, 0 otherwise (the
expected count). Distances are computed once per distinct published row against the distinct
original rows (weighted by their counts), in blocks of published rows by matrix products
(|b|² - 2 a·b, the |a|² term being constant along a row), so memory is O(block × originals).
Two distances closer than a relative 1e-9 of the squared norms involved count as equal; the
rounding error of the product form is many orders of magnitude smaller.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from gateway.errors import InputDataError, MechanismError
from gateway.grouping.mixed_microaggregation import QIColumn, QIKind
from gateway.measures.key_risk import (
    check_frame,
    check_names,
    check_positive_int,
    combine_codes,
    require_columns,
)

__all__ = ["LinkageResult", "MixedScaling", "mixed_linkage"]

_BLOCK = 256  # distinct published rows per block: 256 x originals float64, ~45 MB on Adult
_TIE_RTOL = 1e-9  # relative tolerance of "equal distance" (see the module docstring)

Int = NDArray[np.int64]
Float = NDArray[np.float64]


# ---------------------------------------------------------------------------------------------
# Mixed-distance embedding with the original's scaling
# ---------------------------------------------------------------------------------------------


def _numeric_values(frame: pd.DataFrame, col: QIColumn, what: str) -> Float:
    try:
        out = pd.to_numeric(frame[col.name], errors="raise").to_numpy(
            dtype=np.float64, na_value=np.nan
        )
    except (TypeError, ValueError):
        raise InputDataError(
            f"{what}: numeric quasi-identifier {col.name!r} holds a non-numeric value; "
            "publish numbers (or leave the cell empty)"
        ) from None
    if np.isinf(out).any():
        raise InputDataError(
            f"{what}: numeric quasi-identifier {col.name!r} holds an infinite value; "
            "publish finite numbers"
        )
    return out


def _category_codes(frame: pd.DataFrame, col: QIColumn, what: str) -> Int:
    """Position of each value in ``col.categories``; -1 where the value is missing."""
    series = frame[col.name]
    missing = series.isna().to_numpy()
    index = {c: i for i, c in enumerate(col.categories)}
    raw = series.to_numpy(dtype=object)
    out = np.full(raw.size, -1, dtype=np.int64)
    try:
        out[~missing] = [index[v] for v in raw[~missing]]
    except (KeyError, TypeError):
        raise InputDataError(
            f"{what}: {col.kind.value} quasi-identifier {col.name!r} holds a value outside its "
            "categories; list every published category in the attribute's categories"
        ) from None
    return out


@dataclass(frozen=True)
class _Prepared:
    """The linkage columns of ``n`` rows of one file: numeric values (NaN = missing) and
    category codes (-1 = missing), one array per column in ``columns`` order."""

    n: int
    values: tuple[Float | Int, ...]

    def complete(self, columns: Sequence[QIColumn]) -> NDArray[np.bool_]:
        ok = np.ones(self.n, dtype=bool)
        for col, v in zip(columns, self.values, strict=True):
            ok &= ~np.isnan(v) if col.kind is QIKind.NUMERIC else v >= 0
        return ok

    def take(self, rows: NDArray[np.intp]) -> _Prepared:
        return _Prepared(rows.size, tuple(v[rows] for v in self.values))

    def subset(self, positions: Sequence[int]) -> _Prepared:
        return _Prepared(self.n, tuple(self.values[i] for i in positions))


def _prepare(frame: pd.DataFrame, columns: Sequence[QIColumn], what: str) -> _Prepared:
    vals: list[Float | Int] = []
    for col in columns:
        if col.kind is QIKind.NUMERIC:
            vals.append(_numeric_values(frame, col, what))
        else:
            vals.append(_category_codes(frame, col, what))
    return _Prepared(len(frame), tuple(vals))


@dataclass(frozen=True)
class MixedScaling:
    """:func:`gateway.grouping.mixed_microaggregation.embed`'s scaling, fitted on one file (the
    original) and applied unchanged to any file with the same columns.

    Per column: numeric and ordinal (rank) values become (x - ``center``) / ``spread``; a
    nominal value becomes the one-hot vector of its category divided by ``spread`` (the square
    root of the attribute's total variance 1 - Σ f_c², or √2 unstandardised: plain 0/1
    distance). ``spread`` 0 marks a column constant in the fitted file: it is left out, as it
    separates nobody there."""

    columns: tuple[QIColumn, ...]
    center: tuple[float, ...]
    spread: tuple[float, ...]

    @classmethod
    def fit(
        cls, columns: Sequence[QIColumn], original: pd.DataFrame, *, standardize: bool = True
    ) -> MixedScaling:
        """The scaling of ``original`` (every row complete, values within the categories)."""
        cols = tuple(columns)
        return cls._fit(cols, _complete_rows(original, cols, "original file"), standardize)

    @classmethod
    def _fit(cls, cols: tuple[QIColumn, ...], prep: _Prepared, standardize: bool) -> MixedScaling:
        center: list[float] = []
        spread: list[float] = []
        for col, v in zip(cols, prep.values, strict=True):
            if col.kind is QIKind.NOMINAL:
                center.append(0.0)
                if not standardize:
                    spread.append(math.sqrt(2.0))
                    continue
                f = np.bincount(v, minlength=len(col.categories)) / max(prep.n, 1)
                total_var = 1.0 - float(f @ f)
                spread.append(math.sqrt(total_var) if total_var > 1e-12 else 0.0)
            elif not standardize:
                center.append(0.0)
                spread.append(1.0)
            else:
                x = v.astype(np.float64)
                center.append(float(x.mean()) if prep.n else 0.0)
                spread.append(float(x.std()) if prep.n else 0.0)
        return cls(cols, tuple(center), tuple(spread))

    def transform(self, frame: pd.DataFrame) -> Float:
        """Rows of ``frame`` (every row complete, values within the categories) as embedded
        vectors: squared Euclidean distances between them are the heterogeneous distance."""
        return self._transform(_complete_rows(frame, self.columns, "file to embed"))

    def _transform(self, prep: _Prepared) -> Float:
        parts: list[Float] = []
        for col, v, c, s in zip(self.columns, prep.values, self.center, self.spread, strict=True):
            if s == 0.0:
                continue
            if col.kind is QIKind.NOMINAL:
                onehot = np.zeros((prep.n, len(col.categories)))
                onehot[np.arange(prep.n), v] = 1.0 / s
                parts.append(onehot)
            else:
                parts.append(((v.astype(np.float64) - c) / s)[:, None])
        return np.hstack(parts) if parts else np.zeros((prep.n, 0))


def _complete_rows(frame: pd.DataFrame, cols: tuple[QIColumn, ...], what: str) -> _Prepared:
    data = check_frame(frame, what)
    require_columns(data, [c.name for c in cols], what)
    prep = _prepare(data, cols, what)
    if not prep.complete(cols).all():
        raise InputDataError(f"{what}: a quasi-identifier is missing; drop incomplete rows first")
    return prep


# ---------------------------------------------------------------------------------------------
# Record linkage
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkageResult:
    """Record linkage over all quasi-identifiers (see the module docstring). Shares are NaN
    (``None`` in :meth:`to_dict`) when no record could be evaluated."""

    share_linked: float  # nearest original (mixed distance) is the record's own; ties 1/t
    evaluated: int  # published records linked (a seeded sample of at most max_records)
    standard_error: float  # binomial standard error of share_linked
    exact_key_linkage: float  # exact match on categorical QIs, then nearest on numeric ones
    exact_key_standard_error: float
    excluded: int  # rows left out: a linkage column missing in the original or published file

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "share_linked": num(self.share_linked),
            "evaluated": self.evaluated,
            "standard_error": num(self.standard_error),
            "exact_key_linkage": num(self.exact_key_linkage),
            "exact_key_standard_error": num(self.exact_key_standard_error),
            "excluded": self.excluded,
        }


def _distinct_rows(x: Float) -> tuple[Float, Int, Int]:
    """Distinct rows of ``x``, the index of each row's distinct row, and their counts."""
    rows, inverse, counts = np.unique(x, axis=0, return_inverse=True, return_counts=True)
    return rows, inverse.reshape(-1).astype(np.int64), counts.astype(np.int64)


def _nearest_credit(a: Float, b: Float, own: NDArray[np.intp]) -> Float:
    """For each row of ``a``, 1/t if row ``own[i]`` of ``b`` is among its t nearest rows of
    ``b`` at equal (squared Euclidean) distance, else 0. ``own[i] < 0``: not in ``b``.

    Equal rows have equal nearest sets, so distances are computed once per distinct row of
    ``a`` against the distinct rows of ``b`` (weighted by their counts): microaggregated
    files publish each tuple k times or more, and original files repeat many tuples."""
    out = np.zeros(a.shape[0])
    has = own >= 0
    if b.shape[0] == 0 or not has.any():
        return out
    if a.shape[1] == 0:  # no coordinate: every row of b is at distance 0
        out[has] = 1.0 / b.shape[0]
        return out
    ua, inv_a, _ = _distinct_rows(a)
    ub, inv_b, count_b = _distinct_rows(b)
    weight = count_b.astype(np.float64)
    # |a|² + |b|² - 2a·b without the |a|² term, constant along a row: the same ranking
    b_sq = np.einsum("ij,ij->i", ub, ub)
    a_sq = np.einsum("ij,ij->i", ua, ua)
    limit = np.empty(ua.shape[0])
    tied = np.empty(ua.shape[0])
    for start in range(0, ua.shape[0], _BLOCK):
        stop = min(start + _BLOCK, ua.shape[0])
        d = (-2.0 * ua[start:stop]) @ ub.T
        d += b_sq[None, :]
        lim = d.min(axis=1) + _TIE_RTOL * (a_sq[start:stop] + float(b_sq.max()))
        rows, cols = np.nonzero(d <= lim[:, None])
        tied[start:stop] = np.bincount(rows, weights=weight[cols], minlength=stop - start)
        limit[start:stop] = lim
    ui, uo = inv_a[has], inv_b[own[has]]
    own_d = b_sq[uo] - 2.0 * np.einsum("ij,ij->i", ua[ui], ub[uo])
    out[has] = np.where(own_d <= limit[ui], 1.0 / tied[ui], 0.0)
    return out


def _exact_key_credit(
    cat_pub: Int, cat_orig: Int, num_pub: Float, num_orig: Float, evaluated: NDArray[np.intp]
) -> Float:
    """Credit of each evaluated published row when the intruder restricts the originals to
    those with the same categorical key, then links by the numeric distance."""
    keys, groups = combine_codes(
        [np.concatenate([cat_orig[:, j], cat_pub[:, j]]) for j in range(cat_orig.shape[1])],
        cat_orig.shape[0] + cat_pub.shape[0],
    )
    n = cat_orig.shape[0]
    key_orig, key_pub = keys[:n], keys[n:][evaluated]
    order = np.argsort(key_orig, kind="stable")
    bounds = np.searchsorted(key_orig[order], np.arange(groups + 1))
    position = np.empty(n, dtype=np.intp)  # index of each original within its key's block
    out = np.zeros(evaluated.size)
    pub_order = np.argsort(key_pub, kind="stable")
    pub_bounds = np.searchsorted(key_pub[pub_order], np.arange(groups + 1))
    for g in np.flatnonzero(np.diff(pub_bounds)):
        members = order[bounds[g] : bounds[g + 1]]
        if members.size == 0:
            continue  # no original with this categorical key: not linked
        sel = pub_order[pub_bounds[g] : pub_bounds[g + 1]]
        position[members] = np.arange(members.size)
        own_orig = evaluated[sel]  # aligned rows: the own original has the same index
        in_block = key_orig[own_orig] == g
        own = np.where(in_block, position[own_orig], -1)
        out[sel] = _nearest_credit(num_pub[evaluated[sel]], num_orig[members], own)
    return out


def _share(credit: Float) -> tuple[float, float]:
    m = credit.size
    if m == 0:
        return math.nan, math.nan
    p = float(credit.mean())
    return p, math.sqrt(max(p * (1.0 - p), 0.0) / m)


def mixed_linkage(
    original: pd.DataFrame,
    published: pd.DataFrame,
    columns: Sequence[QIColumn],
    *,
    standardize: bool = True,
    max_records: int = 20000,
    seed: int = 0,
) -> LinkageResult:
    """Distance-based record linkage of ``published`` to ``original`` over ``columns`` with the
    heterogeneous distance, both files scaled with the original's parameters. Row i of
    ``published`` protects row i of ``original``. Rows with a missing linkage value in either
    file are left out; at most ``max_records`` published rows (a sample drawn with
    ``numpy.random.default_rng(seed)``) are linked against all kept originals."""
    cols = tuple(columns)
    if not cols:
        raise InputDataError("linkage columns: no column given; name at least one column")
    if not all(isinstance(c, QIColumn) for c in cols):
        raise InputDataError("linkage columns: describe each column as a QIColumn")
    check_names([c.name for c in cols], "linkage columns", allow_empty=False)
    limit = check_positive_int(max_records, "max_records", 1)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise MechanismError("seed must be an integer")
    orig = check_frame(original, "original file")
    pub = check_frame(published, "published file")
    if len(orig) != len(pub):
        raise InputDataError(
            "published file: its rows must be aligned with the original's (one published row "
            "per original row, in the same order); give both files the same records"
        )
    names = [c.name for c in cols]
    require_columns(orig, names, "original file")
    require_columns(pub, names, "published file")

    prep_o = _prepare(orig, cols, "original file")
    prep_p = _prepare(pub, cols, "published file")
    keep = np.flatnonzero(prep_o.complete(cols) & prep_p.complete(cols))
    excluded = len(orig) - keep.size
    prep_o, prep_p = prep_o.take(keep), prep_p.take(keep)

    n = keep.size
    if n > limit:
        evaluated = np.sort(np.random.default_rng(seed).choice(n, size=limit, replace=False))
    else:
        evaluated = np.arange(n, dtype=np.intp)

    scaling = MixedScaling._fit(cols, prep_o, standardize)
    emb_o = scaling._transform(prep_o)
    emb_p = scaling._transform(prep_p.take(evaluated))
    share, se = _share(_nearest_credit(emb_p, emb_o, evaluated))

    numeric = [i for i, c in enumerate(cols) if c.kind is QIKind.NUMERIC]
    categorical = [i for i, c in enumerate(cols) if c.kind is not QIKind.NUMERIC]
    # numeric part only (no numeric column: zero-width rows, every key match ties)
    num_scaling = MixedScaling(
        tuple(cols[i] for i in numeric),
        tuple(scaling.center[i] for i in numeric),
        tuple(scaling.spread[i] for i in numeric),
    )
    num_o = num_scaling._transform(prep_o.subset(numeric))
    num_p = num_scaling._transform(prep_p.subset(numeric))
    # a zero column, so that "no categorical quasi-identifier" is one key shared by all
    zero = np.zeros(n, dtype=np.int64)
    cat_o = np.column_stack([zero, *(prep_o.values[i] for i in categorical)]).astype(np.int64)
    cat_p = np.column_stack([zero, *(prep_p.values[i] for i in categorical)]).astype(np.int64)
    exact, exact_se = _share(_exact_key_credit(cat_p, cat_o, num_p, num_o, evaluated))
    return LinkageResult(
        share_linked=share,
        evaluated=int(evaluated.size),
        standard_error=se,
        exact_key_linkage=exact,
        exact_key_standard_error=exact_se,
        excluded=int(excluded),
    )
