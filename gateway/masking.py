"""Deterministic and noise-based masking of single attributes (column functions, vectorised)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from gateway.policy import CodingSpec, HierarchySpec


def noise_sd(values: NDArray[np.float64], ratio: float) -> float:
    """Noise standard deviation for variance ratio·var(X) (uncorrelated additive noise)."""
    finite = values[np.isfinite(values)]
    if finite.size < 2:
        return 0.0
    return float(np.sqrt(ratio) * np.std(finite, ddof=1))


def add_noise(
    values: NDArray[np.float64], sd: float, normals: NDArray[np.float64]
) -> NDArray[np.float64]:
    """x + sd·z with standard normals z supplied by the caller (seeded or keyed)."""
    return values + sd * normals


def top_bottom_code(values: NDArray[np.float64], spec: CodingSpec) -> NDArray[np.float64]:
    """Values above ``top`` become ``top``; values below ``bottom`` become ``bottom``."""
    lo = -np.inf if spec.bottom is None else spec.bottom
    hi = np.inf if spec.top is None else spec.top
    return np.clip(values, lo, hi)


def generalize(values: Sequence[str | None], spec: HierarchySpec) -> list[str | None]:
    """Climb ``spec.level`` levels of the hierarchy; a value without a parent is an error."""
    out: list[str | None] = list(values)
    for level in spec.levels[: spec.level]:
        climbed: list[str | None] = []
        for v in out:
            if v is None:
                climbed.append(None)
                continue
            parent = level.get(v)
            if parent is None:
                raise KeyError("value has no parent in the generalization hierarchy")
            climbed.append(parent)
        out = climbed
    return out
