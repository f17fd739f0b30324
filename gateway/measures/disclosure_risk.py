"""Disclosure risk of masked numeric microdata: distance-based record linkage (DLD), interval
disclosure, DR and the score (sources and conventions in :mod:`gateway.measures.quality`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray

from gateway.measures.key_risk import combine_codes
from gateway.measures.numeric_input import NAN, Float, Prepared, prepare


def dld(x: ArrayLike, xm: ArrayLike, *, weight_second: float = 1.0) -> float:
    """Distance-based record linkage disclosure (DLD) of [DT01], as a share in [0, 1].

    Both files are standardised with the original column means and sds, and each masked
    record is linked by Euclidean distance to the original records. Per [DT01] a masked
    record is *linked* when its own original is the nearest original record, and *linked to
    the 2nd nearest* when its own original is the second nearest; DLD is the share of masked
    records that are linked or linked to the 2nd nearest (``weight_second=1``, the default).
    ``weight_second=0`` gives the strict nearest-neighbour linkage rate; any weight in [0, 1]
    counts a 2nd-nearest link with that weight.

    Ties (equal distances, e.g. duplicate original records) are resolved as an intruder
    picking uniformly at random among the tied candidates, and the expected count is used:
    with ``a`` originals strictly closer than the record's own original and ``t`` originals
    (its own included) at exactly its distance, the record counts
    ``(1[a = 0] + weight_second · 1[a = 1 or (a = 0 and t ≥ 2)]) / t`` — its chance of being
    drawn first, plus its weighted chance of being drawn second. Identity masking thus gives 1
    for distinct rows and 2/3 for a row present three times.

    [DT01] averages DLD over intruder scenarios knowing 1…p attributes; this function is the
    scenario in which all (non-constant) attributes are known — pass a column subset for
    others. Uses scipy's cKDTree (O(n log n)).
    """
    if not 0.0 <= weight_second <= 1.0:
        raise ValueError(f"weight_second must be in [0, 1], got {weight_second}")
    return dld_of(prepare(x, xm), weight_second)


def dld_of(prep: Prepared, weight_second: float) -> float:
    if not prep.ok:
        return NAN
    z, zm = prep.z, prep.zm
    n = prep.n
    diff = zm - z
    d_own = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    tol = 1e-9 * d_own + 1e-12  # distances computed along two paths may differ by ulps
    # imported here: scipy.spatial costs the file commands' start ~0.3 s, and few need it
    from scipy.spatial import cKDTree  # noqa: PLC0415

    # the tree holds each distinct original once, with its multiplicity, and each distinct
    # masked point is asked once: releases of discrete quasi-identifiers repeat points by the
    # hundred (200,000 panel records: 7,676 distinct originals, 11,746 distinct masked), and a
    # ball counted every copy. A copy is at the same distance as its point, so the counts and
    # the two nearest distances are the same.
    _, first_z, copies = _distinct_rows(z)
    at_q, first_q, _ = _distinct_rows(zm)
    tree = cKDTree(z[first_z])
    near, at = tree.query(zm[first_q], k=2)
    # the second nearest original is the nearest point again when that point has copies
    near[:, 1] = np.where(copies[at[:, 0]] > 1, near[:, 0], near[:, 1])
    nearest = near[at_q]
    closer = (nearest < (d_own - tol)[:, None]).sum(axis=1)  # a, capped at 2
    candidates = np.flatnonzero(closer < 2)
    if candidates.size == 0:
        return 0.0
    balls = tree.query_ball_point(zm[candidates], d_own[candidates] + tol[candidates])
    sizes = np.fromiter(map(len, balls), dtype=np.intp, count=len(balls))
    inside = np.fromiter(itertools.chain.from_iterable(balls), dtype=np.intp, count=sizes.sum())
    owner = np.repeat(np.arange(sizes.size), sizes)
    within = np.bincount(owner, weights=copies[inside], minlength=sizes.size)
    a = closer[candidates]
    ties = np.maximum(within - a, 1.0)  # t ≥ 1: the own original is always within reach
    first = (a == 0).astype(np.float64)
    second = ((a == 0) & (ties >= 2)) | (a == 1)
    share = (first + weight_second * second) / ties
    return float(share.sum()) / n


def _distinct_rows(a: Float) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.intp]]:
    """Each row's index among the distinct rows of ``a``, the first row of each distinct one,
    and how many rows each has (hashed column by column: np.unique by rows sorts, 30x slower)."""
    n = a.shape[0]
    ids, _ = combine_codes(
        [pd.factorize(a[:, j])[0].astype(np.int64) for j in range(a.shape[1])], n
    )
    _, first = np.unique(ids, return_index=True)
    return ids, first, np.bincount(ids)


def check_p_pct(p_pct: float) -> None:
    if not (0.0 < p_pct <= 100.0 and math.isfinite(p_pct)):
        raise ValueError(f"p_pct must be in (0, 100], got {p_pct}")


@dataclass(frozen=True)
class _Ranks:
    """Per masked column: sorted values and the mid-rank of every record's value."""

    sorted_m: Float  # n×p, each column sorted
    mid: Float  # n×p mid-ranks (0-based; tied values share the mean of their positions)


def _ranks(xm: Float) -> _Ranks:
    """scipy.stats.rankdata(method="average") less 1, column by column, from the one sort
    (scipy.stats alone took ~0.6 s of every file command's start)."""
    n = xm.shape[0]
    order = np.argsort(xm, axis=0, kind="stable")
    sorted_m = np.take_along_axis(xm, order, axis=0)
    mid = np.empty(xm.shape, dtype=np.float64)
    for c in range(xm.shape[1]):
        y = sorted_m[:, c]
        starts = np.flatnonzero(np.r_[True, y[1:] != y[:-1]])
        counts = np.diff(starts, append=n)
        # a tied block's positions s..s+c-1 share their mean, s + (c-1)/2 (exact in floats)
        mid[order[:, c], c] = np.repeat(starts + (counts - 1) / 2, counts)
        if n and np.isnan(y[-1]):  # NaN sorts last; rankdata propagates it to the column
            mid[:, c] = np.nan
    return _Ranks(sorted_m, mid)


def _inside(x: Float, ranks: _Ranks, p_pct: float) -> NDArray[np.bool_]:
    n = x.shape[0]
    w = p_pct * n / 200.0
    lo = np.clip(np.ceil(ranks.mid - w - 1e-9), 0, n - 1).astype(np.intp)
    hi = np.clip(np.floor(ranks.mid + w + 1e-9), 0, n - 1).astype(np.intp)
    lower = np.take_along_axis(ranks.sorted_m, lo, axis=0)
    upper = np.take_along_axis(ranks.sorted_m, hi, axis=0)
    inside: NDArray[np.bool_] = (lower <= x) & (x <= upper)
    return inside


def interval_share(prep: Prepared, p_pct: float, *, per_record: bool = False) -> float:
    """Interval disclosure of prepared data (``prep.ok``) at one p, as
    :func:`interval_disclosure` gives it."""
    return _id_share(_inside(prep.x, _ranks(prep.xm), p_pct), per_record)


def _id_share(inside: NDArray[np.bool_], per_record: bool) -> float:
    if per_record:
        return float(inside.all(axis=1).mean())
    return float(inside.mean())


def interval_disclosure(
    x: ArrayLike, xm: ArrayLike, p_pct: float = 10.0, *, per_record: bool = False
) -> float:
    """Rank-based interval disclosure (ID) of [DT01] at one p, as a share in [0, 1].

    For each attribute the masked values are ranked; around each masked value an interval is
    built from the masked values whose rank differs from its rank by at most p·n/200, i.e. a
    window of p% of n ranks centred on it (truncated, not shifted, at either end; it always
    contains the masked value itself, however small p·n). A tied masked value (e.g. a
    microaggregation centroid shared by k records) takes the mean of its tied positions as
    its rank. The original value is *disclosed* if it lies in the interval
    [lowest, highest value of the window].

    Default (``per_record=False``), as in [DT01]: the proportion of original values falling in
    the intervals around their masked values, over all records and (non-constant) attributes.
    ``per_record=True``: the share of records whose original values fall in the intervals for
    *every* attribute (stricter; never larger than the default).

    [DT01] reports ID averaged over p = 1, 2, …, 10 %: see :func:`interval_disclosure_averaged`.
    sdcMicro's ``dRisk`` is a different measure (SDID: an interval of k·sd of the masked
    column around each masked value, k = 0.05 by default; a record counts as at risk only when
    none of its original values falls outside its interval, ``rowSums(x < mi | x > ma) == 0``
    in R/dRisk.R since sdcMicro 5.6.0, which fixed the earlier "at most one outside").
    """
    check_p_pct(p_pct)
    prep = prepare(x, xm)
    if not prep.ok:
        return NAN
    return interval_share(prep, p_pct, per_record=per_record)


def interval_disclosure_averaged(
    x: ArrayLike,
    xm: ArrayLike,
    p_pcts: Iterable[float] = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
    *,
    per_record: bool = False,
) -> float:
    """Mean of :func:`interval_disclosure` over several p (default 1…10 %, as in [DT01])."""
    ps = [float(p) for p in p_pcts]
    if not ps:
        raise ValueError("p_pcts must name at least one percentage")
    for p in ps:
        check_p_pct(p)
    prep = prepare(x, xm)
    if not prep.ok:
        return NAN
    ranks = _ranks(prep.xm)
    return sum(_id_share(_inside(prep.x, ranks, p), per_record) for p in ps) / len(ps)


def _weights_check(**weights: float) -> None:
    for name, w in weights.items():
        if not (w >= 0.0 and math.isfinite(w)):
            raise ValueError(f"{name} must be a finite weight ≥ 0, got {w}")


def disclosure_risk(dld: float, id: float, tau1: float = 0.5, tau2: float = 0.5) -> float:
    """DR = τ1·DLD + τ2·ID [DT01] (shares in, share out when τ1 + τ2 = 1).

    [DT01] also mixes in probabilistic record linkage (PLD); later work by the same authors
    (and this module) uses DLD and ID only.
    """
    _weights_check(tau1=tau1, tau2=tau2)
    return tau1 * dld + tau2 * id


def score(il: float, dr: float, g1: float = 0.5, g2: float = 0.5) -> float:
    """Score = γ1·IL + γ2·DR [DT01]; lower is better. IL and DR should be on one scale
    (:func:`evaluate_numeric` uses the bounded PIL ``il3["overall"]`` with DR, both in 0..1)."""
    _weights_check(g1=g1, g2=g2)
    return g1 * il + g2 * dr
