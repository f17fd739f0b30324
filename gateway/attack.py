"""Adversaries on a publication history: how much does keeping every release help?

* Averaging: for each respondent, the plurality of its published values over the first T
  releases, compared with the truth. With sticky randomized response every release repeats
  the same draw, so accuracy stays at the single-release level whatever T; with fresh draws
  per release it climbs towards 1.
* Intersection: the adversary knows its target's true quasi-identifiers and, in each release,
  the set of respondents sharing the target's published quasi-identifier tuple; linking the
  releases on that tuple it intersects those sets. A candidate set below k re-identifies.

Both work on mappings respondent → published value per release; the caller supplies the
ground truth linkage (the simulator knows it; a real adversary needs at most the same).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

Release = Mapping[str, Hashable | None]


@dataclass(frozen=True, slots=True)
class AveragingPoint:
    releases: int
    respondents: int
    accuracy: float
    ci_low: float  # 95% Wilson interval
    ci_high: float


def _wilson(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (centre - half, centre + half)


def _plurality(values: Sequence[Hashable]) -> Hashable:
    """Most frequent value; ties go to the value seen first (the adversary has no better rule)."""
    counts = Counter(values)
    best = max(counts.values())
    return next(v for v in values if counts[v] == best)


def averaging_attack(
    releases: Sequence[Release], truth: Mapping[str, Hashable], ts: Sequence[int]
) -> list[AveragingPoint]:
    """Accuracy of the plurality guess over the first T releases, for each T in ``ts``."""
    points = []
    for t in ts:
        if not 1 <= t <= len(releases):
            raise ValueError(f"T must be between 1 and {len(releases)} releases, got {t}")
        seen: dict[str, list[Hashable]] = defaultdict(list)
        for release in releases[:t]:
            for respondent, value in release.items():
                if value is not None and respondent in truth:
                    seen[respondent].append(value)
        correct = sum(_plurality(vals) == truth[r] for r, vals in seen.items())
        n = len(seen)
        lo, hi = _wilson(correct, n)
        points.append(AveragingPoint(t, n, correct / n if n else math.nan, lo, hi))
    return points


@dataclass(frozen=True, slots=True)
class IntersectionResult:
    respondents: int
    below_k: int
    smallest: list[int]  # the smallest candidate-set sizes, ascending (at most 10)


def intersection_attack(releases: Sequence[Release], k: int) -> IntersectionResult:
    """Candidate sets from linking releases on published quasi-identifier tuples.

    ``releases[t]`` maps respondent → published QI tuple (None when suppressed). For each
    respondent and each distinct tuple it was published with, the candidates are the
    respondents that share that tuple in *every* release in which the target carries it.
    """
    members: list[dict[Hashable, set[str]]] = []
    for release in releases:
        by_tuple: dict[Hashable, set[str]] = defaultdict(set)
        for respondent, qi in release.items():
            if qi is not None:
                by_tuple[qi].add(respondent)
        members.append(by_tuple)
    sizes: list[int] = []
    for respondent in {r for release in releases for r in release}:
        candidates_per_tuple: dict[Hashable, set[str]] = {}
        for release, by_tuple in zip(releases, members, strict=True):
            qi = release.get(respondent)
            if qi is None:
                continue
            group = by_tuple[qi]
            prev = candidates_per_tuple.get(qi)
            candidates_per_tuple[qi] = set(group) if prev is None else prev & group
        if candidates_per_tuple:
            sizes.append(min(len(c) for c in candidates_per_tuple.values()))
    sizes.sort()
    return IntersectionResult(
        respondents=len(sizes), below_k=sum(s < k for s in sizes), smallest=sizes[:10]
    )
