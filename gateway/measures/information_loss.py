"""Information loss of masked numeric microdata: SSE/SST, IL1s, IL2 and IL3 (sources and
conventions in :mod:`gateway.measures.quality`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from gateway.errors import InputDataError
from gateway.measures.numeric_input import NAN, Float, Prepared, as_matrix, prepare, select

_SQRT2 = math.sqrt(2.0)
# Deciles: the quantiles compared by il3 (MDS05 compares quantiles; which ones is our choice).
_DECILES = np.arange(1, 10, dtype=np.float64) / 10.0


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
    return sse_sst_of(prepare(x, groups_or_masked))


def sse_sst_of(prep: Prepared) -> float:
    if not prep.ok:
        return NAN
    z = prep.z
    d = z - prep.zm
    zc = z - z.mean(axis=0)
    sst = float(np.einsum("ij,ij->", zc, zc))
    if not sst > 0:
        return NAN
    return 100.0 * float(np.einsum("ij,ij->", d, d)) / sst


def _sse_sst_groups(x: ArrayLike, labels: NDArray[np.int64]) -> float:
    xa = as_matrix(x, "original data")
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
    return sse_sst_of(select(xa, xm, complete))


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
    return il1s_of(prepare(x, xm))


def il1s_of(prep: Prepared) -> float:
    if not prep.ok:
        return NAN
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
        return NAN
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
    return il2_of(prepare(x, xm))


def il2_of(prep: Prepared) -> dict[str, float]:
    keys = ("means", "variances", "covariances", "correlations")
    if not prep.ok:
        return dict.fromkeys(keys, NAN)
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
        else NAN
    )
    return {
        "means": means,
        "variances": _mean_variation(o.var, m.var, o.var > 0),
        "covariances": _mean_variation(o.cov[iu], m.cov[iu], np.abs(o.cov[iu]) > tol),
        "correlations": _mean_variation(o.corr[iu1], m.corr[iu1], np.abs(o.corr[iu1]) > tol),
    }


def _pil(diff: Float, var: Float) -> Float:
    """2·Φ(|Δ|/√var) − 1 = erf(|Δ|/√(2·var)); with var = 0 it is 0 if Δ = 0 else 1."""
    from scipy.special import erf  # noqa: PLC0415 - ~0.3 s at import, for the file reports only

    diff = np.abs(diff)
    out = (diff > 0).astype(np.float64)
    pos = var > 0
    out[pos] = erf(diff[pos] / np.sqrt(2.0 * var[pos]))
    return out


def _mean_or_nan(a: Float) -> float:
    return float(a.mean()) if a.size else NAN


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
    return il3_of(prepare(x, xm))


def il3_of(prep: Prepared) -> dict[str, float]:
    keys = ("quantiles", "means", "variances", "covariances", "correlations")
    if not prep.ok:
        return dict.fromkeys((*keys, "overall"), NAN)
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
    out["overall"] = sum(parts) / len(parts) if parts else NAN
    return out
