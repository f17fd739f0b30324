"""Analyst-side reconstruction: estimate the true distribution π behind randomized responses.

The published frequencies satisfy q = P·π (P the mechanism's perturbation matrix, read from
the metadata topic). Two estimators (DESIGN.md §4):

(a) Inversion: π̂ = P⁻¹ q̂, then Euclidean projection onto the probability simplex (Duchi,
    Shalev-Shwartz, Singer, Chandra 2008). Standard errors by the delta method for the
    unprojected estimate: Cov(π̂) = P⁻¹ (diag(q̂) - q̂q̂ᵀ)/n P⁻ᵀ. Needs P invertible; for a
    singular P (e.g. uniform retention 1/m) the inversion fields are NaN and
    ``inversion_ok`` is False.

(b) EM, i.e. iterative Bayesian reconstruction (Agrawal & Srikant 2000; Agrawal & Aggarwal
    2001): π ← π ⊙ Pᵀ(q̂ ⊘ Pπ), started from the uniform distribution. Every iterate stays in
    the simplex and it converges to the maximum-likelihood estimate of the multinomial
    likelihood Σ_j c_j log (Pπ)_j. It works for singular P too (it then stays wherever the
    data cannot move it). Standard errors from the observed Fisher information of that
    likelihood in the m-1 free coordinates (π_m = 1 - Σ others), mapped back to all m
    categories. This choice is deterministic (no bootstrap generator to inject); at an
    interior MLE it coincides with the delta method of (a). Caveat: when the MLE is on the
    boundary (some π̂_i = 0) the asymptotics are not normal and the SE is only indicative.
    Directions the data cannot identify (singular information) get SE = inf.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray

from gateway.errors import InputDataError, MechanismError
from gateway.mechanisms.randomized_response import RRMechanism

__all__ = [
    "DistributionEstimate",
    "Renormalised",
    "count_codes",
    "project_to_simplex",
    "reconstruct",
    "renormalise",
]

Method = Literal["both", "inversion", "em"]

_INFO_COND = 1e12  # observed information with a larger condition number is treated as singular


@dataclass(frozen=True, eq=False)
class DistributionEstimate:
    """Estimates of the true distribution over ``categories`` from ``n`` published values.

    Arrays are indexed like ``categories``. Fields of an estimator that was not run (see
    ``method``) or that cannot be computed are NaN.
    """

    categories: tuple[str, ...]
    n: int
    observed: NDArray[np.float64]  # published frequencies q̂
    inversion: NDArray[np.float64]  # P⁻¹q̂ projected onto the simplex
    inversion_se: NDArray[np.float64]  # delta-method SE of the unprojected P⁻¹q̂
    em: NDArray[np.float64]  # EM / iterative Bayesian estimate (in the simplex)
    em_se: NDArray[np.float64]  # SE from the observed Fisher information
    em_iterations: int
    inversion_raw: NDArray[np.float64]  # P⁻¹q̂ before projection (may leave the simplex)
    inversion_ok: bool  # False when P is singular (or inversion was not asked for)
    em_converged: bool  # False when EM hit max_iter (or was not asked for)
    notes: tuple[str, ...] = ()  # why a field is NaN, or what to be careful with
    em_cov: NDArray[np.float64] | None = None  # m×m covariance behind em_se (None: EM not run)

    def to_dict(self) -> dict[str, object]:
        """Plain-Python form (lists of floats). NaN and inf stay floats so reports can format
        them ("nan", "inf"); orjson writes them as null, stdlib json as NaN/Infinity."""
        return {
            "categories": list(self.categories),
            "n": self.n,
            "observed": _json_list(self.observed),
            "inversion": _json_list(self.inversion),
            "inversion_se": _json_list(self.inversion_se),
            "inversion_raw": _json_list(self.inversion_raw),
            "inversion_ok": self.inversion_ok,
            "em": _json_list(self.em),
            "em_se": _json_list(self.em_se),
            "em_iterations": self.em_iterations,
            "em_converged": self.em_converged,
            "notes": list(self.notes),
        }

    def to_frame(self) -> pd.DataFrame:
        """One row per category: observed, inversion, inversion_se, em, em_se."""
        return pd.DataFrame(
            {
                "observed": self.observed,
                "inversion": self.inversion,
                "inversion_se": self.inversion_se,
                "em": self.em,
                "em_se": self.em_se,
            },
            index=pd.Index(list(self.categories), name="category"),
        )


def count_codes(mech: RRMechanism, codes: ArrayLike) -> NDArray[np.int64]:
    """Counts per category of published codes; negative codes (missing) are left out."""
    c = np.asarray(codes)
    if c.size and c.dtype.kind not in "iu":
        raise InputDataError(
            f"published codes must be integers (category indices), got dtype {c.dtype}; "
            "pass counts as a mapping or with counts=True"
        )
    c = c.astype(np.int64, copy=False).reshape(-1)
    c = c[c >= 0]
    if c.size and int(c.max()) >= mech.m:
        raise InputDataError(
            f"{int(np.count_nonzero(c >= mech.m))} published code(s) are ≥ the number of "
            f"categories ({mech.m}); codes must index the mechanism's categories"
        )
    return np.bincount(c, minlength=mech.m).astype(np.int64)


def project_to_simplex(v: ArrayLike) -> NDArray[np.float64]:
    """Euclidean projection onto {x ≥ 0, Σx = 1} (Duchi et al. 2008, O(m log m))."""
    x = np.asarray(v, dtype=np.float64).reshape(-1)
    if x.size == 0 or not bool(np.all(np.isfinite(x))):
        return np.full(x.shape, np.nan, dtype=np.float64)
    s = np.sort(x)[::-1]
    css = np.cumsum(s) - 1.0
    k = np.arange(1, x.size + 1)
    rho = int(np.flatnonzero(s - css / k > 0.0)[-1])
    theta = css[rho] / (rho + 1)
    out: NDArray[np.float64] = np.maximum(x - theta, 0.0)
    out /= out.sum()  # removes rounding drift; the sum is 1 up to ~1e-16 already
    return out


def reconstruct(
    mech: RRMechanism,
    published: ArrayLike | Mapping[str, float],
    *,
    counts: bool = False,
    method: Method = "both",
    tol: float = 1e-10,
    max_iter: int = 10000,
) -> DistributionEstimate:
    """Estimate the true distribution from published values.

    ``published`` is either the published codes (integer indices into ``mech.categories``;
    negative = missing, left out), or counts: a mapping category → count (values not named
    count 0), or a length-m array with ``counts=True``. ``method`` picks ``"inversion"``,
    ``"em"`` or ``"both"``; EM stops when no π_i moves by more than ``tol`` in an iteration,
    or after ``max_iter`` iterations.
    """
    if method not in ("both", "inversion", "em"):
        raise MechanismError(f"method must be 'both', 'inversion' or 'em', got {method!r}")
    if not (math.isfinite(tol) and tol > 0.0):
        raise MechanismError(f"tol must be > 0 and finite, got {tol}")
    if max_iter < 1:
        raise MechanismError(f"max_iter must be ≥ 1, got {max_iter}")
    c = _counts(mech, published, counts)
    n_total = float(c.sum())
    if n_total <= 0.0:
        raise InputDataError("no published values to reconstruct from (all counts are 0)")
    p = mech.matrix
    impossible = (c > 0) & (p.max(axis=1) <= 0.0)
    if np.any(impossible):
        raise InputDataError(
            "the published data contain a value this mechanism never publishes; the counts "
            "do not come from this mechanism (check the metadata version)"
        )
    m = mech.m
    qhat = c / n_total
    nan = np.full(m, np.nan)
    notes: list[str] = []

    inv, inv_raw, inv_se, inv_ok = nan, nan, nan, False
    if method in ("both", "inversion"):
        inv, inv_raw, inv_se, inv_ok = _inversion_estimate(mech, qhat, n_total, notes)
    em, em_cov, iterations, converged = nan, None, 0, False
    if method in ("both", "em"):
        em, em_cov, iterations, converged = _em_estimate(
            p, c, qhat, tol=tol, max_iter=max_iter, notes=notes
        )
    em_se = nan if em_cov is None else np.sqrt(np.maximum(np.diag(em_cov), 0.0))

    for arr in (qhat, inv, inv_raw, inv_se, em, em_se, *([] if em_cov is None else [em_cov])):
        arr.setflags(write=False)
    return DistributionEstimate(
        categories=mech.categories,
        n=round(n_total),
        observed=qhat,
        inversion=inv,
        inversion_se=inv_se,
        em=em,
        em_se=em_se,
        em_iterations=iterations,
        inversion_raw=inv_raw,
        inversion_ok=inv_ok,
        em_converged=converged,
        notes=tuple(notes),
        em_cov=em_cov,
    )


@dataclass(frozen=True, eq=False)
class Renormalised:
    """EM shares over the categories but one (the missing category: an analyst compares
    shares among the answers given), π_i / (1 − π_left_out), and their delta-method SEs."""

    categories: tuple[str, ...]
    shares: NDArray[np.float64]
    se: NDArray[np.float64]


def renormalise(est: DistributionEstimate, left_out: str) -> Renormalised:
    """``est``'s EM estimate without ``left_out``, rescaled to sum to 1. The SE maps the EM
    covariance Σ through the Jacobian of π ↦ π_S / (1 − π_o): ∂r_i/∂π_j = δ_ij / (1 − π_o),
    ∂r_i/∂π_o = π_i / (1 − π_o)²."""
    if left_out not in est.categories or est.em_cov is None:
        keep = tuple(est.categories)
        return Renormalised(keep, np.asarray(est.em), np.asarray(est.em_se))
    o = est.categories.index(left_out)
    idx = [i for i in range(len(est.categories)) if i != o]
    rest = float(est.em[idx].sum())  # 1 − π_o, without the cancellation when π_o ≈ 1
    shares = est.em[idx] / rest if rest > 0.0 else np.full(len(idx), np.nan)
    jac = np.zeros((len(idx), len(est.categories)))
    jac[np.arange(len(idx)), idx] = 1.0 / rest
    jac[:, o] = est.em[idx] / rest**2
    with np.errstate(invalid="ignore"):
        cov = jac @ est.em_cov @ jac.T
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    return Renormalised(tuple(est.categories[i] for i in idx), shares, se)


# -- internals ----------------------------------------------------------------------------------


def _inversion_estimate(
    mech: RRMechanism, qhat: NDArray[np.float64], n_total: float, notes: list[str]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], bool]:
    """P⁻¹q̂ projected onto the simplex, unprojected, its SE, and whether P was invertible
    (NaN otherwise); what the caller should know goes to ``notes``."""
    nan = np.full(mech.m, np.nan)
    inv, inv_raw, inv_se, inv_ok = nan, nan, nan, False
    if mech.is_invertible:
        inv_raw, inv_se = _inversion(mech.matrix, qhat, n_total)
        inv = project_to_simplex(inv_raw)
        inv_ok = True
        if bool(np.any(inv_raw < 0.0)):
            notes.append(
                "P⁻¹q̂ left the simplex and was projected onto it; the inversion SE is the "
                "delta-method SE of the unprojected estimate"
            )
    else:
        notes.append(
            f"P is singular (condition number {mech.condition_number:.3g}); inversion is "
            "undefined, so its fields are NaN: use the EM estimate"
        )
    return inv, inv_raw, inv_se, inv_ok


def _em_estimate(
    p: NDArray[np.float64],
    c: NDArray[np.float64],
    qhat: NDArray[np.float64],
    *,
    tol: float,
    max_iter: int,
    notes: list[str],
) -> tuple[NDArray[np.float64], NDArray[np.float64], int, bool]:
    """The EM estimate, its covariance, the iterations taken and whether it converged; what the
    caller should know goes to ``notes``."""
    em, iterations, converged = _em(p, qhat, tol, max_iter)
    em_cov = _em_cov(p, c, em)
    if not converged:
        notes.append(
            f"EM stopped after max_iter={max_iter} iterations without moving less than "
            f"tol={tol:g}; raise max_iter or tol"
        )
    if not bool(np.all(np.isfinite(em_cov))):
        notes.append(
            "the observed information is singular: the data cannot identify π "
            "(P not invertible), so em_se is inf"
        )
    elif bool(np.any(em <= 1e-8)):
        notes.append(
            "the EM estimate is on the simplex boundary (some category ≈ 0); its SE is "
            "only indicative there"
        )
    return em, em_cov, iterations, converged


def _json_list(x: NDArray[np.float64]) -> list[float]:
    return [float(v) for v in x.tolist()]


def _counts(
    mech: RRMechanism, published: ArrayLike | Mapping[str, float], counts: bool
) -> NDArray[np.float64]:
    if isinstance(published, Mapping):
        unknown = [k for k in published if k not in mech.categories]
        if unknown:
            raise InputDataError(
                f"counts name {len(unknown)} value(s) that are not the mechanism's categories"
            )
        c = np.array([float(published.get(k, 0.0)) for k in mech.categories], dtype=np.float64)
    elif counts:
        c = np.asarray(published, dtype=np.float64).reshape(-1)
        if c.shape != (mech.m,):
            raise InputDataError(
                f"counts=True needs one count per category ({mech.m}), got {c.size}"
            )
    else:
        c = count_codes(mech, published).astype(np.float64)
    if not bool(np.all(np.isfinite(c) & (c >= 0.0))):
        raise InputDataError("counts must be ≥ 0 and finite")
    return c


def _inversion(
    p: NDArray[np.float64], qhat: NDArray[np.float64], n: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    p_inv = np.linalg.inv(p)
    raw = p_inv @ qhat
    sigma_q = (np.diag(qhat) - np.outer(qhat, qhat)) / n
    cov = p_inv @ sigma_q @ p_inv.T
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    return raw, se


def _em(
    p: NDArray[np.float64], qhat: NDArray[np.float64], tol: float, max_iter: int
) -> tuple[NDArray[np.float64], int, bool]:
    m = p.shape[0]
    pi = np.full(m, 1.0 / m)
    ratio = np.zeros(m)
    pt = np.ascontiguousarray(p.T)
    for it in range(1, max_iter + 1):
        q = p @ pi
        ratio.fill(0.0)
        np.divide(qhat, q, out=ratio, where=q > 0.0)
        new = pi * (pt @ ratio)
        new /= new.sum()
        if float(np.max(np.abs(new - pi))) < tol:
            return new, it, True
        pi = new
    return pi, max_iter, False


def _em_cov(
    p: NDArray[np.float64], c: NDArray[np.float64], pi: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Covariance from the observed information of Σ_j c_j log (Pπ)_j in coordinates
    π_1..π_{m-1}, mapped to all m categories (inf where the data cannot identify π)."""
    m = p.shape[0]
    q = p @ pi
    used = (c > 0.0) & (q > 0.0)
    d = p[used, :-1] - p[used, -1:]  # ∂(Pπ)_j / ∂π_k with π_m = 1 - Σ_{k<m} π_k
    w = c[used] / q[used] ** 2
    info = d.T @ (w[:, None] * d)
    with np.errstate(divide="ignore", invalid="ignore"):
        cond = float(np.linalg.cond(info)) if info.size else math.inf
    if not (math.isfinite(cond) and cond < _INFO_COND):
        return np.full((m, m), math.inf)
    cov_free = np.linalg.inv(info)
    jac = np.vstack([np.eye(m - 1), -np.ones((1, m - 1))])
    cov: NDArray[np.float64] = jac @ cov_free @ jac.T
    return cov
