"""Standard errors of the estimates the utility report compares before and after protection:
weighted means and totals of a sample with sampling weights, and weighted least squares.

The weights are sampling weights (inverse inclusion probabilities), not precision weights, so
the variances are the with-replacement linearisation ones a survey analyst would use (Särndal,
Swensson & Wretman 1992, §5.7; Lohr, *Sampling*, §9.1): invariant to rescaling the weights, and
for regression the sandwich (HC1) covariance of the weighted fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["WeightedFit", "weighted_mean_se", "weighted_total_se", "wls"]


def weighted_mean_se(y: NDArray[np.float64], w: NDArray[np.float64]) -> float:
    """SE of the Hájek mean Σwy / Σw: √(n/(n−1) · Σ w_i² (y_i − ȳ)²) / Σw."""
    n = y.size
    if n < 2:
        return math.nan
    tw = float(w.sum())
    mean = float((w * y).sum()) / tw
    u = w * (y - mean)
    return math.sqrt(n / (n - 1) * float(u @ u)) / tw


def weighted_total_se(y: NDArray[np.float64], w: NDArray[np.float64]) -> float:
    """SE of the Horvitz-Thompson total Σwy: √(n/(n−1) · Σ (w_i y_i − Ŷ/n)²)."""
    n = y.size
    if n < 2:
        return math.nan
    z = w * y
    d = z - z.mean()
    return math.sqrt(n / (n - 1) * float(d @ d))


@dataclass(frozen=True, eq=False)
class WeightedFit:
    """Coefficients (intercept first) and their SEs."""

    beta: NDArray[np.float64]
    se: NDArray[np.float64]


def wls(
    x: NDArray[np.float64], y: NDArray[np.float64], w: NDArray[np.float64] | None
) -> WeightedFit:
    """Least squares of ``y`` on an intercept and the columns of ``x``, weighted by ``w``
    (None: unweighted), with the HC1 sandwich covariance
    n/(n−p) · (XᵀWX)⁻¹ (Σ w_i² e_i² x_i x_iᵀ) (XᵀWX)⁻¹."""
    n = y.size
    design = np.column_stack([np.ones(n), x])
    p = design.shape[1]
    wt = np.ones(n) if w is None else w
    xtwx = design.T @ (wt[:, None] * design)
    beta = np.asarray(np.linalg.solve(xtwx, design.T @ (wt * y)), dtype=np.float64)
    resid = y - design @ beta
    score = design * (wt * resid)[:, None]
    bread = np.linalg.inv(xtwx)
    cov = bread @ (score.T @ score) @ bread * (n / (n - p) if n > p else math.nan)
    se: NDArray[np.float64] = np.sqrt(np.maximum(np.diag(cov), 0.0))
    return WeightedFit(beta, se)
