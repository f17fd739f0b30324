"""A file's figures from those of its blocks (``privgw protect`` beyond the memory budget):
counts summed, smallest values the smallest, shares weighted by the block's records, standard
errors combined, and SSE/SST from the blocks' sums of squares (never an average of ratios)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

#: float figures that are totals over records (summed, not weighted)
SUMMED = frozenset(
    {
        "key_records",
        "key_suppressed",
        "key_unknown_class",
        "key_uniques",
        "key_expected_reidentifications",
        "sensitive_records",
        "sensitive_uniques",
        "expected_reidentifications",
    }
)
_FIRST = frozenset({"k", "weight", "keys", "k_claim", "max_msu", "unprotected_quasi_identifiers"})


def merge_figures(blocks: Sequence[tuple[int, Any]]) -> Any:
    """One figure (or nested dict of figures) of the file from ``(records, figure)`` of each
    block, by the figure's name (see the module docstring)."""
    return _merge("", [(n, v) for n, v in blocks if v is not None])


def _merge(name: str, items: list[tuple[int, Any]]) -> Any:
    if not items:
        return None
    first = items[0][1]
    if isinstance(first, Mapping):
        keys = list(dict.fromkeys(k for _, v in items for k in v))
        return {k: _merge(k, [(n, v[k]) for n, v in items if k in v]) for k in keys}
    if name in _FIRST or isinstance(first, str | list | bool):
        return first
    values = [(n, float(v)) for n, v in items if not _is_nan(v)]
    if not values:
        return first
    if name.startswith(("min", "smallest", "key_smallest", "ldiv_min")):
        return _typed(first, min(v for _, v in values))
    if name.startswith("max"):
        return _typed(first, max(v for _, v in values))
    if "standard_error" in name:  # independent blocks: the variances of the shares add
        total = sum(n for n, _ in values) or 1
        return math.sqrt(sum((n * v) ** 2 for n, v in values)) / total
    if isinstance(first, int) or name in SUMMED:
        return _typed(first, sum(v for _, v in values))
    total = sum(n for n, _ in values)
    return sum(n * v for n, v in values) / total if total else first


def _is_nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _typed(like: Any, v: float) -> Any:
    return int(v) if isinstance(like, int) else v


@dataclass
class SquareSums:
    """SSE/SST of a file's numeric columns from its blocks: per column the complete rows'
    count, sum, sum of squares, and squared distortion, so the file's mean and standard
    deviation standardize every block alike (:func:`gateway.measures.quality.sse_sst_pct`)."""

    n: float = 0.0
    sums: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    squares: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    errors: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))

    def add(self, x: NDArray[np.float64], masked: NDArray[np.float64]) -> None:
        """A block's original and masked rows (a row with a missing value is left out)."""
        ok = ~(np.isnan(x).any(axis=1) | np.isnan(masked).any(axis=1))
        x, d = x[ok], x[ok] - masked[ok]
        if not self.sums.size:
            width = x.shape[1]
            self.sums, self.squares, self.errors = np.zeros(width), np.zeros(width), np.zeros(width)
        self.n += x.shape[0]
        self.sums += x.sum(axis=0)
        self.squares += (x * x).sum(axis=0)
        self.errors += (d * d).sum(axis=0)

    def sse_sst_pct(self) -> float:
        """100·SSE/SST over every block (NaN below 2 rows or without a varying column)."""
        if self.n < 2:
            return float("nan")
        sst = self.squares - self.sums**2 / self.n  # Σ (x − x̄)², the file's mean
        varying = sst > 1e-12 * np.maximum(self.squares, 1.0)
        if not varying.any():
            return float("nan")
        var = sst[varying] / (self.n - 1)
        return 100.0 * float((self.errors[varying] / var).sum()) / float((sst[varying] / var).sum())
