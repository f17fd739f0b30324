"""Information loss and disclosure risk of masked numeric microdata (and two RR figures).

Every numeric measure takes the original ``x`` and the masked ``xm`` as float arrays n×p whose
rows are aligned (row i of ``xm`` is the masked version of row i of ``x``); a 1-D array is one
column. Conventions shared by all of them:

* **Missing values.** A row with a NaN in ``x`` or ``xm`` (e.g. a suppressed record) is left
  out; every statistic, including the means and standard deviations used to standardise, is
  computed on the complete rows only. :func:`evaluate_numeric` reports how many rows were left
  out. ±inf and magnitudes beyond 1e100 are errors (:class:`~gateway.errors.InputDataError`).
* **Constant columns.** An attribute whose original values are all equal (S_j = 0) carries no
  information and identifies nobody; standardised measures are undefined for it. Such columns
  are dropped from every numeric measure (reported as ``n_constant`` by
  :func:`evaluate_numeric`); "p" below is the number of remaining attributes.
* **Too little data.** With fewer than 2 complete rows, or no non-constant column, every
  numeric measure is NaN (undefined), never an exception.
* **Standardisation.** z_ij = (x_ij − x̄_j)/S_j and z'_ij = (x'_ij − x̄_j)/S_j, both with the
  mean and the sample standard deviation (ddof=1) of the *original* column. A masked value
  more than 1e100 standard deviations away is capped there (so that squares and fourth
  powers stay finite; every measure is saturated long before).
* Error messages name shapes and settings only, never a data value.

Sources (definitions are restated in each function's docstring):

* [DMT01] Domingo-Ferrer, Mateo-Sanz & Torra (2001), "Comparing SDC methods for microdata on
  the basis of information loss and disclosure risk", ETK-NTTS 2001 — the table of
  mean-square / mean-absolute / mean-variation discrepancies between X, V, R, ... and their
  masked counterparts, reproduced as "Information loss measures for continuous microdata"
  in Hundepool et al., *Handbook on Statistical Disclosure Control*, §3.5 (GitHub
  sdcTools/HandbookSDC, chapters/03/_03-microdata-05-Information-loss-in-microdata-protection.qmd).
* [DT01] Domingo-Ferrer & Torra (2001), "A quantitative comparison of disclosure control
  methods for microdata", in Doyle, Lane, Theeuwes & Zayatz (eds.), *Confidentiality,
  Disclosure and Data Access*, North-Holland, pp. 111-134 — distance-based record linkage
  (DLD), rank-based interval disclosure (ID), DR and the score.
* [YWC02] Yancey, Winkler & Creecy (2002), "Disclosure risk assessment in perturbative
  microdata protection", LNCS 2316 — IL1s; implemented in sdcMicro ``dUtility(method="IL1")``
  (GitHub sdcTools/sdcMicro, R/dUtility.R).
* [MDS05] Mateo-Sanz, Domingo-Ferrer & Sebé (2005), "Probabilistic information loss measures
  in confidentiality protection of continuous microdata", *Data Mining and Knowledge
  Discovery* 11(2):181-193 — bounded (probabilistic) information loss PIL.
* [DM02] Domingo-Ferrer & Mateo-Sanz (2002), "Practical data-oriented microaggregation for
  statistical disclosure control", IEEE TKDE 14(1):189-201 — SSE/SST.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.spatial import cKDTree
from scipy.special import erf
from scipy.stats import rankdata

from gateway.errors import InputDataError

__all__ = [
    "QualityReport",
    "disclosure_risk",
    "dld",
    "evaluate_numeric",
    "il1s",
    "il2",
    "il3",
    "interval_disclosure",
    "interval_disclosure_averaged",
    "reconstruction_error",
    "rr_retention",
    "score",
    "sse_sst_pct",
]

Float = NDArray[np.float64]

_NAN = float("nan")
_SQRT2 = math.sqrt(2.0)
# Largest magnitude accepted, raw and in original standard deviations: squares and fourth
# powers of such values stay far from float overflow.
_MAX_ABS = 1e100
# Deciles: the quantiles compared by il3 (MDS05 compares quantiles; which ones is our choice).
_DECILES = np.arange(1, 10, dtype=np.float64) / 10.0


# ---------------------------------------------------------------------------------------------
# Input handling
# ---------------------------------------------------------------------------------------------


def _as_matrix(a: ArrayLike, name: str) -> Float:
    try:
        arr = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        # The numpy message quotes the offending value; ours must not.
        raise InputDataError(
            f"{name} must be numeric (a float array n×p); drop or encode non-numeric columns"
        ) from None
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise InputDataError(f"{name} must be 1-D or 2-D (records × attributes), got {arr.ndim}-D")
    if arr.shape[1] == 0:
        raise InputDataError(f"{name} has no attribute columns")
    if np.isinf(arr).any():
        raise InputDataError(f"{name} contains ±inf; use NaN for a missing or suppressed value")
    if (np.abs(arr) > _MAX_ABS).any():
        raise InputDataError(f"{name} has values beyond ±1e100; rescale the attribute")
    return arr


def _check_same_shape(x: Float, xm: Float) -> None:
    if x.shape != xm.shape:
        raise InputDataError(
            f"original is {x.shape[0]}×{x.shape[1]} but masked is {xm.shape[0]}×{xm.shape[1]}; "
            "they must have the same attributes and one masked row per original row, aligned"
        )


@dataclass(frozen=True)
class _Prepared:
    """Complete rows and non-constant columns, with the original standardisation."""

    x: Float  # original, complete rows × informative columns
    xm: Float  # masked, same rows and columns
    mean: Float  # original column means
    sd: Float  # original column sds (ddof=1), all > 0
    z: Float  # (x − mean) / sd
    zm: Float  # (xm − mean) / sd
    n_excluded: int
    n_constant: int

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def p(self) -> int:
        return int(self.x.shape[1])

    @property
    def ok(self) -> bool:
        return self.n >= 2 and self.p >= 1


def _select(x: Float, xm: Float, complete: NDArray[np.bool_]) -> _Prepared:
    xc, xmc = x[complete], xm[complete]
    n_excluded = int(x.shape[0] - xc.shape[0])
    if xc.shape[0] < 2:
        empty = np.empty(0, dtype=np.float64)
        none = xc[:, :0]
        return _Prepared(none, none, empty, empty, none, none, n_excluded, 0)
    sd_all = xc.std(axis=0, ddof=1)
    if np.isinf(sd_all).any():
        raise InputDataError("original values too large to standardise; rescale the attribute")
    # Constant column: all values equal (exact test), or a spread so small it underflows.
    informative = (xc.max(axis=0) > xc.min(axis=0)) & (sd_all > 0)
    xc, xmc = xc[:, informative], xmc[:, informative]
    mean = xc.mean(axis=0)
    sd = sd_all[informative]
    z = (xc - mean) / sd
    with np.errstate(over="ignore"):
        zm = np.clip((xmc - mean) / sd, -_MAX_ABS, _MAX_ABS)
    return _Prepared(xc, xmc, mean, sd, z, zm, n_excluded, int((~informative).sum()))


def _prepare(x: ArrayLike, xm: ArrayLike) -> _Prepared:
    xa = _as_matrix(x, "original data")
    xma = _as_matrix(xm, "masked data")
    _check_same_shape(xa, xma)
    missing = np.isnan(xa).any(axis=1) | np.isnan(xma).any(axis=1)
    complete = np.asarray(~missing, dtype=np.bool_)
    return _select(xa, xma, complete)


# ---------------------------------------------------------------------------------------------
# Information loss
# ---------------------------------------------------------------------------------------------


def sse_sst_pct(x: ArrayLike, groups_or_masked: ArrayLike) -> float:
    """100·SSE/SST, the information loss of microaggregation [DM02].

    On data standardised by the original column mean and sd (ddof=1)::

        SSE = Σ_i ‖z_i − z'_i‖²      SST = Σ_i ‖z_i − z̄‖²

    where z'_i is the masked record and z̄ the mean of the (complete) original records. For a
    microaggregated file z'_i is the centroid of the group of record i, so SSE is the
    within-group sum of squares and the ratio is the figure reported for MDAV on the CASC
    data sets (e.g. Domingo-Ferrer & Torra 2005). For any other masking (noise, ...) SSE is
    simply the total squared distortion and the ratio may exceed 100.

    ``groups_or_masked`` is either the masked values (same shape as ``x``), or — when ``x`` is
    2-D and it is a 1-D *integer* array of length n — group labels: each record is then
    replaced by the mean of its group, and records with a negative label are left out like
    suppressed rows. Constant columns are dropped; NaN if fewer than 2 complete rows.
    """
    g = np.asarray(groups_or_masked)
    xa = np.asarray(x)
    if g.ndim == 1 and xa.ndim == 2 and (np.issubdtype(g.dtype, np.integer) or g.dtype == bool):
        return _sse_sst_groups(x, g.astype(np.int64))
    return _sse_sst(_prepare(x, groups_or_masked))


def _sse_sst(prep: _Prepared) -> float:
    if not prep.ok:
        return _NAN
    z = prep.z
    d = z - prep.zm
    zc = z - z.mean(axis=0)
    sst = float(np.einsum("ij,ij->", zc, zc))
    if not sst > 0:
        return _NAN
    return 100.0 * float(np.einsum("ij,ij->", d, d)) / sst


def _sse_sst_groups(x: ArrayLike, labels: NDArray[np.int64]) -> float:
    xa = _as_matrix(x, "original data")
    if labels.shape[0] != xa.shape[0]:
        raise InputDataError(
            f"original has {xa.shape[0]} records but {labels.shape[0]} group labels were given; "
            "give one label per record"
        )
    complete = np.asarray(~np.isnan(xa).any(axis=1) & (labels >= 0), dtype=np.bool_)
    # Group means of the kept rows, expressed as a masked file.
    xm = np.full_like(xa, np.nan)
    kept = xa[complete]
    _, inv = np.unique(labels[complete], return_inverse=True)
    counts = np.bincount(inv).astype(np.float64)
    means = np.empty((counts.shape[0], xa.shape[1]))
    for j in range(xa.shape[1]):
        means[:, j] = np.bincount(inv, weights=kept[:, j]) / counts
    xm[complete] = means[inv]
    return _sse_sst(_select(xa, xm, complete))


def il1s(x: ArrayLike, xm: ArrayLike) -> float:
    """IL1s [YWC02], the mean standardised absolute distortion, **per cell (n·p)**::

        IL1s = 1/(n·p) · Σ_j Σ_i |x_ij − x'_ij| / (√2 · S_j)

    with S_j the sample sd (ddof=1) of original attribute j: the formula of Hundepool et al.,
    Handbook on SDC §3.5 (Yancey, Winkler & Creecy 2002), averaged **per cell**.
    sdcMicro: its early ``dUtility(method="IL1")`` computed ``abs((x - xm)/sd(x) * sqrt(2))``
    averaged over the n·p cells (2× this figure); since its 2018 revision sdcMicro divides by
    √2 as here (5.8.1 documents ``IL1s`` as "scaled by the standard deviation of original
    variables times the square root of 2") and reports the **sum over the cells**, n·p times
    this figure; this per-cell average is the figure sdcMicro keeps as ``IL1old``.
    Identity masking gives 0. Constant columns are dropped.
    """
    return _il1s(_prepare(x, xm))


def _il1s(prep: _Prepared) -> float:
    if not prep.ok:
        return _NAN
    return float(np.abs(prep.z - prep.zm).mean()) / _SQRT2


@dataclass(frozen=True)
class _Moments:
    mean: Float
    var: Float  # ddof=1
    cov: Float  # ddof=1, p×p
    corr: Float  # p×p; a constant masked column correlates 0 with everything


def _moments(a: Float) -> _Moments:
    n = a.shape[0]
    mean = a.mean(axis=0)
    c = a - mean
    cov = (c.T @ c) / (n - 1)
    var = np.diag(cov).copy()
    sd = np.sqrt(var)
    denom = np.outer(sd, sd)
    corr = np.zeros_like(cov)
    np.divide(cov, denom, out=corr, where=denom > 0)
    np.clip(corr, -1.0, 1.0, out=corr)
    return _Moments(mean, var, cov, corr)


def _mean_variation(orig: Float, new: Float, usable: NDArray[np.bool_]) -> float:
    if not usable.any():
        return _NAN
    return float(np.mean(np.abs(new[usable] - orig[usable]) / np.abs(orig[usable])))


def il2(x: ArrayLike, xm: ArrayLike) -> dict[str, float]:
    """Mean variation (mean absolute relative change) of means, variances, covariances and
    correlations — the "mean variation" column of the information-loss table of [DMT01]
    (Handbook on SDC §3.5), as fractions (multiply by 100 for the paper's percentages)::

        means        = 1/p · Σ_j |x̄_j − x̄'_j| / |x̄_j|                        (X̄ − X̄')
        variances    = 1/p · Σ_j |s²_j − s'²_j| / s²_j                          (S − S')
        covariances  = Σ_{j≤k} |v_jk − v'_jk| / |v_jk|  ÷  p(p+1)/2             (V − V')
        correlations = Σ_{j<k} |r_jk − r'_jk| / |r_jk|  ÷  p(p−1)/2             (R − R')

    with sample moments (ddof=1) of the original (x̄, s², v, r) and masked (primes) data on
    the complete rows. A term whose original denominator is zero (|x̄_j| ≤ 1e-12·S_j,
    |v_jk| ≤ 1e-12·S_j·S_k, |r_jk| ≤ 1e-12) is left out of its average — the measure is
    unbounded near such values, which is the known weakness of mean variation (Yancey,
    Winkler & Creecy 2002; Trottini 2003); use :func:`il3` for a bounded alternative. If a
    masked column is constant its correlations are taken as 0. Keys whose average has no
    term (e.g. ``correlations`` with one attribute) are NaN.
    """
    return _il2(_prepare(x, xm))


def _il2(prep: _Prepared) -> dict[str, float]:
    keys = ("means", "variances", "covariances", "correlations")
    if not prep.ok:
        return dict.fromkeys(keys, _NAN)
    # Relative changes of (co)variances and correlations do not depend on the unit, so they
    # are computed on the standardised data (where v_jk = r_jk and s²_j = 1).
    o, m = _moments(prep.z), _moments(prep.zm)
    iu = np.triu_indices(prep.p)
    iu1 = np.triu_indices(prep.p, 1)
    tol = 1e-12
    # |x̄_j − x̄'_j| / |x̄_j| with x̄'_j − x̄_j = S_j·(z̄'_j − z̄_j): |x̄_j| in units of S_j
    rel_mean = np.abs(prep.mean) / prep.sd
    means_ok = rel_mean > tol
    means = (
        float(np.mean(np.abs(m.mean - o.mean)[means_ok] / rel_mean[means_ok]))
        if means_ok.any()
        else _NAN
    )
    return {
        "means": means,
        "variances": _mean_variation(o.var, m.var, o.var > 0),
        "covariances": _mean_variation(o.cov[iu], m.cov[iu], np.abs(o.cov[iu]) > tol),
        "correlations": _mean_variation(o.corr[iu1], m.corr[iu1], np.abs(o.corr[iu1]) > tol),
    }


def _pil(diff: Float, var: Float) -> Float:
    """2·Φ(|Δ|/√var) − 1 = erf(|Δ|/√(2·var)); with var = 0 it is 0 if Δ = 0 else 1."""
    diff = np.abs(diff)
    out = (diff > 0).astype(np.float64)
    pos = var > 0
    out[pos] = erf(diff[pos] / np.sqrt(2.0 * var[pos]))
    return out


def _mean_or_nan(a: Float) -> float:
    return float(a.mean()) if a.size else _NAN


def il3(x: ArrayLike, xm: ArrayLike) -> dict[str, float]:
    """Probabilistic information loss (PIL) of [MDS05], as fractions in [0, 1).

    For a statistic θ estimated by θ̂ on the original and θ̂' on the masked data, the
    standardised sample discrepancy is z = (θ̂' − θ̂)/√Var(θ̂), taken as N(0, 1), and::

        PIL(θ) = 2·Φ(|z|) − 1        (the paper reports 100·PIL, in percent)

    i.e. the probability that a N(0,1) variable is closer to 0 than the observed discrepancy:
    0 when the masked statistic equals the original one, → 1 as it moves many standard
    errors away. Var(θ̂) is the large-sample sampling variance of the estimator, plugged in
    from the original complete rows (n of them; m_k are central moments with divisor n)::

        means        Var(x̄_j)   = s²_j / n
        variances    Var(s²_j)  = (m4_j − s⁴_j·(n−3)/(n−1)) / n
        covariances  Var(s_jk)  = (m22_jk − s²_jk·(n−2)/(n−1) + s²_j·s²_k/(n−1)) / n,  j ≤ k
        correlations Var(r_jk)  = (1 − r²_jk)² / n,                                     j < k
        quantiles    Var(Q̂_α)   = α(1−α)/n · (dQ/dα)²,  α = 0.1, …, 0.9 (deciles)

    where m22_jk = mean((x_j − x̄_j)²(x_k − x̄_k)²) and dQ/dα is the difference quotient
    (Q̂(α+h) − Q̂(α−h))/(2h) with h = ½·n^(−1/5) (Siddiqui's sparsity estimate; the interval
    is truncated at 0 and 1). Each key is the mean PIL over the attributes (or attribute
    pairs, or attribute×decile); ``overall`` is the mean of the available keys. Variance
    zero (e.g. |r| = 1): PIL is 0 if the statistic is unchanged and 1 otherwise.

    Formulae for the sampling variances are the standard large-sample results; [MDS05]
    defines PIL this way, but the choice of deciles, of the sparsity estimator and of the
    original-data plug-in for Var(θ̂) are ours.
    """
    return _il3(_prepare(x, xm))


def _il3(prep: _Prepared) -> dict[str, float]:
    keys = ("quantiles", "means", "variances", "covariances", "correlations")
    if not prep.ok:
        return dict.fromkeys((*keys, "overall"), _NAN)
    n = prep.n
    # PIL does not depend on the unit of an attribute: work on standardised data, where
    # fourth moments cannot overflow.
    x, xm = prep.z, prep.zm
    o, m = _moments(x), _moments(xm)
    c = x - o.mean
    c2 = c * c
    m22 = (c2.T @ c2) / n  # diagonal = 4th central moments
    s2 = o.var
    iu = np.triu_indices(prep.p)
    iu1 = np.triu_indices(prep.p, 1)
    var_cov = (m22 - o.cov**2 * (n - 2) / (n - 1) + np.outer(s2, s2) / (n - 1)) / n
    var_mean = s2 / n
    var_var = np.diag(var_cov)
    r = o.corr[iu1]
    var_corr = (1.0 - r * r) ** 2 / n

    h = 0.5 * n ** (-0.2)
    lo = np.clip(_DECILES - h, 0.0, 1.0)
    hi = np.clip(_DECILES + h, 0.0, 1.0)
    probs = np.concatenate([_DECILES, lo, hi])
    qo = np.quantile(x, probs, axis=0)
    qm = np.quantile(xm, _DECILES, axis=0)
    k = _DECILES.shape[0]
    sparsity = (qo[2 * k :] - qo[k : 2 * k]) / (hi - lo)[:, None]
    var_q = (_DECILES * (1.0 - _DECILES))[:, None] / n * sparsity**2

    out = {
        "quantiles": _mean_or_nan(_pil((qm - qo[:k]).ravel(), var_q.ravel())),
        "means": _mean_or_nan(_pil(m.mean - o.mean, var_mean)),
        "variances": _mean_or_nan(_pil(m.var - o.var, var_var)),
        "covariances": _mean_or_nan(_pil(m.cov[iu] - o.cov[iu], var_cov[iu])),
        "correlations": _mean_or_nan(_pil(m.corr[iu1] - r, var_corr)),
    }
    parts = [v for v in out.values() if not math.isnan(v)]
    out["overall"] = sum(parts) / len(parts) if parts else _NAN
    return out


# ---------------------------------------------------------------------------------------------
# Disclosure risk
# ---------------------------------------------------------------------------------------------


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
    return _dld(_prepare(x, xm), weight_second)


def _dld(prep: _Prepared, weight_second: float) -> float:
    if not prep.ok:
        return _NAN
    z, zm = prep.z, prep.zm
    n = prep.n
    diff = zm - z
    d_own = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    tol = 1e-9 * d_own + 1e-12  # distances computed along two paths may differ by ulps
    tree = cKDTree(z)
    nearest, _ = tree.query(zm, k=2)
    closer = (nearest < (d_own - tol)[:, None]).sum(axis=1)  # a, capped at 2
    candidates = np.flatnonzero(closer < 2)
    if candidates.size == 0:
        return 0.0
    within = np.asarray(
        tree.query_ball_point(
            zm[candidates], d_own[candidates] + tol[candidates], return_length=True
        ),
        dtype=np.float64,
    )
    a = closer[candidates]
    ties = np.maximum(within - a, 1.0)  # t ≥ 1: the own original is always within reach
    first = (a == 0).astype(np.float64)
    second = ((a == 0) & (ties >= 2)) | (a == 1)
    share = (first + weight_second * second) / ties
    return float(share.sum()) / n


def _p_check(p_pct: float) -> None:
    if not (0.0 < p_pct <= 100.0 and math.isfinite(p_pct)):
        raise ValueError(f"p_pct must be in (0, 100], got {p_pct}")


@dataclass(frozen=True)
class _Ranks:
    """Per masked column: sorted values and the mid-rank of every record's value."""

    sorted_m: Float  # n×p, each column sorted
    mid: Float  # n×p mid-ranks (0-based; tied values share the mean of their positions)


def _ranks(xm: Float) -> _Ranks:
    # "average" ranks are 1-based mid-ranks of tied blocks
    mid = np.asarray(rankdata(xm, method="average", axis=0), dtype=np.float64) - 1.0
    return _Ranks(np.sort(xm, axis=0), mid)


def _inside(x: Float, ranks: _Ranks, p_pct: float) -> NDArray[np.bool_]:
    n = x.shape[0]
    w = p_pct * n / 200.0
    lo = np.clip(np.ceil(ranks.mid - w - 1e-9), 0, n - 1).astype(np.intp)
    hi = np.clip(np.floor(ranks.mid + w + 1e-9), 0, n - 1).astype(np.intp)
    lower = np.take_along_axis(ranks.sorted_m, lo, axis=0)
    upper = np.take_along_axis(ranks.sorted_m, hi, axis=0)
    inside: NDArray[np.bool_] = (lower <= x) & (x <= upper)
    return inside


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
    column around each masked value, a record counting as at risk when at most one attribute
    falls outside; R/dRisk.R).
    """
    _p_check(p_pct)
    prep = _prepare(x, xm)
    if not prep.ok:
        return _NAN
    return _id_share(_inside(prep.x, _ranks(prep.xm), p_pct), per_record)


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
        _p_check(p)
    prep = _prepare(x, xm)
    if not prep.ok:
        return _NAN
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


# ---------------------------------------------------------------------------------------------
# Randomized response
# ---------------------------------------------------------------------------------------------


def rr_retention(true_codes: ArrayLike, published_codes: ArrayLike) -> float:
    """Observed retention of randomized response: the share of published codes equal to the
    true code, over the positions where both codes are ≥ 0 (a negative code marks a missing
    value, which RR passes through, or a suppressed one; neither says anything about the
    mechanism). NaN if no position qualifies."""
    t = np.asarray(true_codes).ravel()
    p = np.asarray(published_codes).ravel()
    if t.shape != p.shape:
        raise InputDataError(
            f"{t.shape[0]} true codes but {p.shape[0]} published codes; they must be aligned"
        )
    if not (np.issubdtype(t.dtype, np.number) and np.issubdtype(p.dtype, np.number)):
        raise InputDataError("codes must be integer category codes (negative = missing)")
    keep = (t >= 0) & (p >= 0)
    if not keep.any():
        return _NAN
    return float(np.mean(t[keep] == p[keep]))


def reconstruction_error(true_distribution: ArrayLike, estimated: ArrayLike) -> float:
    """Total variation distance TV(π, π̂) = ½·Σ_i |π_i − π̂_i| between the true distribution
    of a categorical attribute and its reconstruction from randomized responses.

    Both vectors are divided by their sums first (so counts are accepted). TV is in [0, 1] for
    two probability vectors; an unprojected inversion estimate may hold negative entries, in
    which case the value can exceed 1. The true distribution must be non-negative; both
    must have a positive sum and the same length.
    """
    try:
        t = np.asarray(true_distribution, dtype=np.float64).ravel()
        e = np.asarray(estimated, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise InputDataError("distributions must be numeric vectors") from None
    if t.shape != e.shape or t.size == 0:
        raise InputDataError(
            f"true distribution has {t.size} categories and the estimate {e.size}; "
            "they must be equal and non-zero"
        )
    if not (np.isfinite(t).all() and np.isfinite(e).all()):
        raise InputDataError("distributions must be finite")
    if (t < 0).any():
        raise InputDataError("the true distribution has a negative entry")
    st, se = float(t.sum()), float(e.sum())
    if st <= 0 or se <= 0:
        raise InputDataError("each distribution must have a positive total")
    return 0.5 * float(np.abs(t / st - e / se).sum())


# ---------------------------------------------------------------------------------------------
# All at once
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QualityReport:
    """Every numeric measure of one masked window (see the module docstring for conventions).

    ``score`` combines the bounded ``il3["overall"]`` (PIL, 0..1) with ``dr`` (0..1).
    """

    n_records: int  # complete rows evaluated
    n_excluded: int  # rows left out because a value was NaN in the original or the masked file
    n_attributes: int  # attributes evaluated (non-constant)
    n_constant: int  # constant attributes left out
    p_pct: float
    sse_sst_pct: float
    il1s: float
    il2: Mapping[str, float]
    il3: Mapping[str, float]
    dld: float
    interval_disclosure: float
    dr: float
    score: float

    def to_dict(self) -> dict[str, Any]:
        """Plain (JSON-serialisable) dict; ``il2`` and ``il3`` as nested dicts."""
        return {
            "n_records": self.n_records,
            "n_excluded": self.n_excluded,
            "n_attributes": self.n_attributes,
            "n_constant": self.n_constant,
            "p_pct": self.p_pct,
            "sse_sst_pct": self.sse_sst_pct,
            "il1s": self.il1s,
            "il2": dict(self.il2),
            "il3": dict(self.il3),
            "dld": self.dld,
            "interval_disclosure": self.interval_disclosure,
            "dr": self.dr,
            "score": self.score,
        }


def evaluate_numeric(x: ArrayLike, xm: ArrayLike, *, p_pct: float = 10.0) -> QualityReport:
    """All numeric measures in one pass over the data (validation and standardisation once).

    DR = ½·DLD + ½·ID (both defaults) and score = ½·PIL + ½·DR, PIL = ``il3["overall"]``.
    """
    _p_check(p_pct)
    prep = _prepare(x, xm)
    il3_ = _il3(prep)
    if prep.ok:
        dld_ = _dld(prep, 1.0)
        id_ = _id_share(_inside(prep.x, _ranks(prep.xm), p_pct), per_record=False)
    else:
        dld_ = id_ = _NAN
    dr = disclosure_risk(dld_, id_)
    return QualityReport(
        n_records=prep.n,
        n_excluded=prep.n_excluded,
        n_attributes=prep.p,
        n_constant=prep.n_constant,
        p_pct=float(p_pct),
        sse_sst_pct=_sse_sst(prep),
        il1s=_il1s(prep),
        il2=MappingProxyType(_il2(prep)),
        il3=MappingProxyType(il3_),
        dld=dld_,
        interval_disclosure=id_,
        dr=dr,
        score=score(il3_["overall"], dr),
    )
