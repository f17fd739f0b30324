"""The numeric measures' input handling: aligned float matrices, complete rows, non-constant
columns, standardised with the original's means and deviations (conventions in
:mod:`gateway.measures.quality`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from gateway.errors import InputDataError

Float = NDArray[np.float64]

NAN = float("nan")
# Largest magnitude accepted, raw and in original standard deviations: squares and fourth
# powers of such values stay far from float overflow.
MAX_ABS = 1e100


def as_matrix(a: ArrayLike, name: str) -> Float:
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
    if (np.abs(arr) > MAX_ABS).any():
        raise InputDataError(f"{name} has values beyond ±1e100; rescale the attribute")
    return arr


def _check_same_shape(x: Float, xm: Float) -> None:
    if x.shape != xm.shape:
        raise InputDataError(
            f"original is {x.shape[0]}×{x.shape[1]} but masked is {xm.shape[0]}×{xm.shape[1]}; "
            "they must have the same attributes and one masked row per original row, aligned"
        )


@dataclass(frozen=True)
class Prepared:
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


def select(x: Float, xm: Float, complete: NDArray[np.bool_]) -> Prepared:
    xc, xmc = x[complete], xm[complete]
    n_excluded = int(x.shape[0] - xc.shape[0])
    if xc.shape[0] < 2:
        empty = np.empty(0, dtype=np.float64)
        none = xc[:, :0]
        return Prepared(none, none, empty, empty, none, none, n_excluded, 0)
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
        zm = np.clip((xmc - mean) / sd, -MAX_ABS, MAX_ABS)
    return Prepared(xc, xmc, mean, sd, z, zm, n_excluded, int((~informative).sum()))


def prepare(x: ArrayLike, xm: ArrayLike) -> Prepared:
    xa = as_matrix(x, "original data")
    xma = as_matrix(xm, "masked data")
    _check_same_shape(xa, xma)
    missing = np.isnan(xa).any(axis=1) | np.isnan(xma).any(axis=1)
    complete = np.asarray(~missing, dtype=np.bool_)
    return select(xa, xma, complete)
