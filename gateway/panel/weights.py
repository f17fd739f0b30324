"""Analysis weights for a panel release: raking (iterative proportional fitting) of one weight
per published tuple, so that every category's weighted share equals its share among the
release's current and imputed values (a category no class publishes cannot be: its share goes
to the attribute's published categories in proportion, and the weights keep the total).

A published record's weight is a function of its published tuple alone, so it is shared by the
whole class (>= k records) and never singles a record out. Targets are rounded to multiples of
``round_to`` (k records' worth) before raking: a difference of two releases' targets then moves
in steps of k respondents, never by one. The calibration factors are bounded
(``[lower, upper]``, trimmed raking), which bounds the design effect the weights add.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, slots=True)
class RakingSpec:
    """How weights are raked: factor bounds, target rounding, convergence."""

    lower: float = 0.3
    upper: float = 3.0
    round_to: float = 5.0  # targets in multiples of this many (weighted) records
    tolerance: float = 1e-7  # a sweep that moves no factor by more has converged
    max_iterations: int = 200

    def __post_init__(self) -> None:
        if not 0 < self.lower <= 1 <= self.upper:
            raise ValueError(
                f"raking bounds must satisfy 0 < lower <= 1 <= upper, got [{self.lower}, "
                f"{self.upper}]"
            )
        if self.round_to < 0:
            raise ValueError(f"round_to must be >= 0, got {self.round_to}")


@dataclass(frozen=True, slots=True)
class Raked:
    """Per class: its records' weight (base weight x calibration factor)."""

    weights: NDArray[np.float64]
    factors: NDArray[np.float64]
    converged: bool
    max_gap: float  # largest |weighted share - target share| over every category, after raking


def rounded_targets(counts: NDArray[np.float64], round_to: float) -> NDArray[np.float64]:
    """A margin's targets rounded to multiples of ``round_to``, rescaled to the same total."""
    total = float(counts.sum())
    if round_to <= 0 or total <= 0:
        return counts.astype(np.float64)
    rounded = np.round(counts / round_to) * round_to
    if rounded.sum() <= 0:
        return counts.astype(np.float64)
    out: NDArray[np.float64] = rounded * (total / rounded.sum())
    return out


def sampling_weights(values: Sequence[object]) -> list[float]:
    """Each record's sampling weight as given: a positive number, else 1."""
    numbers = np.asarray(values)
    if numbers.dtype.kind in "iuf":  # numbers only: converted as float() would, at once
        weights: list[float] = np.where(numbers > 0, numbers, 1.0).astype(np.float64).tolist()
        return weights
    number = (int, float)  # (``int | float`` in the loop would build a union per record)
    return [float(v) if isinstance(v, number) and v > 0 else 1.0 for v in values]


def rake(
    sizes: NDArray[np.float64],
    base: NDArray[np.float64],
    margins: Sequence[NDArray[np.int64]],
    targets: Sequence[NDArray[np.float64]],
    spec: RakingSpec = RakingSpec(),
) -> Raked:
    """Calibrate one factor per class.

    ``sizes[c]``: records in class ``c``; ``base[c]``: their base weight (the class's mean
    sampling weight, or 1); ``margins[a][c]``: the category code class ``c`` publishes for
    attribute ``a``; ``targets[a][v]``: the weighted count of category ``v`` among the
    release's current and imputed values. Every margin's targets are rescaled to the base
    total, rounded (``spec.round_to``), and the factors are trimmed to ``[lower, upper]``."""
    n_classes = len(sizes)
    mass = sizes * base
    total = float(mass.sum())
    factors = np.ones(n_classes)
    if n_classes == 0 or total <= 0:
        return Raked(mass * 0, factors, True, 0.0)
    goals, met = [], []  # the targets, and those of the categories some class publishes
    for codes, target in zip(margins, targets, strict=True):
        if len(codes) != n_classes:
            raise ValueError("every margin needs one category code per class")
        t = np.asarray(target, dtype=np.float64)
        t = t * (total / t.sum()) if t.sum() > 0 else np.zeros_like(t)
        mean_weight = total / float(sizes.sum())
        goals.append(rounded_targets(t, spec.round_to * mean_weight))
        # a category no class publishes cannot be met: its share goes to the others in
        # proportion, so that every margin keeps the base total (else the last margin raked
        # set the total to what its reachable categories hold, and the margins disagreed)
        reachable = np.bincount(codes, minlength=len(t))[: len(t)] > 0
        r = np.where(reachable, t, 0.0)
        r = r * (total / r.sum()) if r.sum() > 0 else r
        met.append(rounded_targets(r, spec.round_to * mean_weight))
    converged = False
    for _ in range(spec.max_iterations):
        before = factors
        for codes, goal in zip(margins, met, strict=True):
            have = np.bincount(codes, weights=mass * factors, minlength=len(goal))
            ratio = np.ones_like(goal)
            nonzero = have > 0
            ratio[nonzero] = goal[nonzero] / have[nonzero]
            factors = np.clip(factors * ratio[codes], spec.lower, spec.upper)
        # a fixed point: the margins met, or as near as the bounds allow
        if float(np.abs(factors - before).max(initial=0.0)) <= spec.tolerance:
            converged = True
            break
    weights = base * factors
    return Raked(weights, factors, converged, _max_gap(sizes * weights, margins, goals))


def _max_gap(
    mass: NDArray[np.float64],
    margins: Sequence[NDArray[np.int64]],
    goals: Sequence[NDArray[np.float64]],
) -> float:
    total = float(mass.sum())
    gap = 0.0
    for codes, goal in zip(margins, goals, strict=True):
        have = np.bincount(codes, weights=mass, minlength=len(goal))
        if total > 0 and goal.sum() > 0:
            gap = max(gap, float(np.abs(have / total - goal / goal.sum()).max(initial=0.0)))
    return gap


def kish_deff(weights: NDArray[np.float64]) -> float:
    """Kish's design effect of unequal weights, n·Σw² / (Σw)² (1: equal weights)."""
    w = np.asarray(weights, dtype=np.float64)
    total = float(w.sum())
    if len(w) == 0 or total <= 0:
        return 1.0
    return float(len(w) * float(np.square(w).sum()) / total**2)
