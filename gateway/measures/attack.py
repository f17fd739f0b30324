"""Adversaries on a publication history: how much does keeping every release help?

* Averaging: for each respondent, the plurality of its published values over the first T
  releases, compared with the truth. With sticky randomized response every release repeats
  the same draw, so accuracy stays at the single-release level whatever T; with fresh draws
  per release it climbs towards 1.
* Intersection (the linked candidate set): the adversary follows its target across releases
  (by pseudonym, or by its sticky randomized and noised values) and intersects, over every
  release the target published a quasi-identifier tuple in, the sets of respondents sharing
  that release's tuple — whatever the tuple, so a respondent that moved to another group is
  intersected across both. A candidate set below k re-identifies within the panel.
* Value linkage: no pseudonym, no tuple; the adversary links a record of one release to a
  record of the next by the published sensitive values alone, which sticky noise and
  randomized response repeat in every release (:func:`value_linkage`).

All work on mappings respondent → published value per release; the caller supplies the
ground truth linkage (the simulator knows it; a real adversary needs at most the same).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

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
    sizes: Mapping[str, int] = field(default_factory=dict)  # respondent -> linked set size

    @property
    def share_below_k(self) -> float:
        return self.below_k / self.respondents if self.respondents else 0.0

    def distribution(self, k: int) -> dict[str, float]:
        """The summary reports carry: respondents, smallest set, how many and which share lie
        below k, and the median."""
        ordered = sorted(self.sizes.values())
        return {
            "respondents": float(self.respondents),
            "smallest": float(ordered[0]) if ordered else math.nan,
            "median": float(ordered[len(ordered) // 2]) if ordered else math.nan,
            "below_k": float(self.below_k),
            "share_below_k": self.share_below_k,
            "singled_out": float(sum(1 for v in ordered if v == 1)),
            "k": float(k),
        }


def linked_sets(releases: Sequence[Release]) -> dict[str, int]:
    """Each respondent's linked candidate set size: the respondents that share its published
    quasi-identifier tuple in every release in which it published one (None: suppressed)."""
    classes: list[dict[Hashable, frozenset[str]]] = []
    for release in releases:
        by_tuple: dict[Hashable, set[str]] = defaultdict(set)
        for respondent, qi in release.items():
            if qi is not None:
                by_tuple[qi].add(respondent)
        classes.append({t: frozenset(m) for t, m in by_tuple.items()})
    candidates: dict[str, frozenset[str]] = {}
    for release, sharing in zip(releases, classes, strict=True):
        for respondent, qi in release.items():
            if qi is None:
                continue
            here = sharing[qi]
            prev = candidates.get(respondent)
            candidates[respondent] = here if prev is None else prev & here
    return {respondent: len(c) for respondent, c in candidates.items()}


def intersection_attack(releases: Sequence[Release], k: int) -> IntersectionResult:
    """Linked candidate sets over a publication history (``releases[t]`` maps respondent →
    published QI tuple, None when suppressed); see :func:`linked_sets`."""
    sizes = linked_sets(releases)
    ordered = sorted(sizes.values())
    return IntersectionResult(
        respondents=len(ordered),
        below_k=sum(s < k for s in ordered),
        smallest=ordered[:10],
        sizes=sizes,
    )


@dataclass(frozen=True, slots=True)
class PairLinkage:
    """Value linkage between release ``release`` (t, 0-based) and the next one (t + 1)."""

    release: int
    records: int  # records of release t
    later_records: int  # records of release t + 1
    unique: int  # records of release t whose combination is unique in release t
    linked: int  # of those, the ones whose combination matches exactly one record of t + 1
    correct: int  # of those, the ones matched to the same respondent

    @property
    def share(self) -> float:
        """Linked records over release t's records."""
        return self.linked / self.records if self.records else 0.0

    @property
    def share_of_later(self) -> float:
        """Linked records over release t + 1's records (the same links, seen from t + 1:
        the share of a release linkable to the previous one)."""
        return self.linked / self.later_records if self.later_records else 0.0

    @property
    def precision(self) -> float:
        """Correct links over links (NaN when nothing links)."""
        return self.correct / self.linked if self.linked else math.nan


@dataclass(frozen=True, slots=True)
class ValueLinkage:
    """Value linkage over a publication history: one :class:`PairLinkage` per consecutive
    pair of releases, and their totals."""

    pairs: tuple[PairLinkage, ...]

    @property
    def records(self) -> int:
        return sum(p.records for p in self.pairs)

    @property
    def linked(self) -> int:
        return sum(p.linked for p in self.pairs)

    @property
    def correct(self) -> int:
        return sum(p.correct for p in self.pairs)

    @property
    def share(self) -> float:
        """Linked records over the records of every release that has a successor."""
        return self.linked / self.records if self.records else 0.0

    @property
    def precision(self) -> float:
        return self.correct / self.linked if self.linked else math.nan


def value_keys(
    release: Mapping[str, Mapping[str, object]], attributes: Sequence[str]
) -> dict[str, tuple[object, ...]]:
    """Each respondent's combination of published values of ``attributes`` (a missing or
    suppressed value is None, a value like any other) — what :func:`value_linkage` links by."""
    return {rid: tuple(row.get(a) for a in attributes) for rid, row in release.items()}


def unique_combinations(columns: Sequence[Sequence[Hashable]]) -> int:
    """Records (positions of the aligned ``columns``) whose combination of values occurs
    once: within one release, the records whose published values could link them to the
    next (the live proxy of :func:`value_linkage`)."""
    counts = Counter(zip(*columns, strict=True))
    return sum(1 for c in counts.values() if c == 1)


def value_linkage(releases: Sequence[Mapping[str, Hashable]]) -> ValueLinkage:
    """How many records link from one release to the next by their published values alone.

    ``releases[t]`` maps each respondent published in release t to the combination of values
    it published there (see :func:`value_keys`; equal combinations are equal keys, None
    included). The adversary sees the combinations but not the respondents. A record of
    release t is *linked* to release t + 1 when its combination occurs exactly once in release
    t and exactly once in release t + 1: the adversary then pairs the two records with
    certainty of uniqueness (whether the pair is the same respondent it cannot tell). The
    link is *correct* when the record of t + 1 belongs to the same respondent; precision is
    correct / linked — the measure knows it, the adversary does not.

    The pair count is symmetric (a combination occurring once in each release), so "records
    of t linkable to t + 1" and "records of t + 1 linkable to t" are the same links over
    different totals (:attr:`PairLinkage.share` and :attr:`PairLinkage.share_of_later`).
    This is the exact-match adversary: it ignores combinations shared by a few records on
    both sides (an adversary pairing c with c guesses right 1 in c) and every other published
    attribute, such as the quasi-identifier tuple (the intersection attack's input).
    """
    pairs = []
    counts = [Counter(release.values()) for release in releases]
    for t in range(len(releases) - 1):
        here, there = counts[t], counts[t + 1]
        later_by_key = {key: rid for rid, key in releases[t + 1].items() if there[key] == 1}
        unique = linked = correct = 0
        for rid, key in releases[t].items():
            if here[key] != 1:
                continue
            unique += 1
            match = later_by_key.get(key)
            if match is not None:
                linked += 1
                correct += match == rid
        pairs.append(
            PairLinkage(
                release=t,
                records=len(releases[t]),
                later_records=len(releases[t + 1]),
                unique=unique,
                linked=linked,
                correct=correct,
            )
        )
    return ValueLinkage(tuple(pairs))


@dataclass(frozen=True, slots=True)
class ChainLinkage:
    """The sticky-value intruder's result: chains of records it could follow (a combination of
    published sensitive values unique in every release it occurs in), how many it narrowed
    below k, and how many to one."""

    chains: int
    below_k: int
    isolated: int
    smallest: list[int]


def sticky_chain_linkage(
    releases: Sequence[Sequence[Mapping[str, Hashable]]],
    sticky: Sequence[str],
    qi: Sequence[str],
    k: int,
) -> ChainLinkage:
    """The intruder of issue 43, who needs no pseudonym and no ground truth: it follows a
    respondent across releases by its sticky published values (randomized and noised values,
    the same in every release while the truth is), and knows who took part in which wave, so
    a chain that is absent from a release tells it that the respondent skipped it.

    ``releases[t]`` holds the published rows of release t. A *chain* is a combination of
    ``sticky`` values that occurs once in every release it occurs in. Its candidate set is the
    intersection, over the releases it occurs in, of the chains sharing its quasi-identifier
    tuple there (the whole ``qi`` tuple, a null a value; a suppressed record, every quasi-
    identifier null, is in no class): a chain whose class
    mates skip a release, or that moves to another class, loses candidates. Rows of
    combinations that repeat within a release are not followed (the intruder cannot tell
    them apart), nor counted."""
    followed: dict[tuple[Hashable, ...], list[tuple[int, tuple[Hashable, ...]]]] = defaultdict(list)
    repeated: set[tuple[Hashable, ...]] = set()
    # per release, per class: how many records carry each combination (records that share a
    # combination are one indistinguishable group of candidates, counted by their number)
    classes: list[dict[tuple[Hashable, ...], Counter[tuple[Hashable, ...]]]] = []
    for t, rows in enumerate(releases):
        counts = Counter(tuple(row.get(a) for a in sticky) for row in rows)
        repeated.update(key for key, n in counts.items() if n > 1)
        by_class: dict[tuple[Hashable, ...], Counter[tuple[Hashable, ...]]] = defaultdict(Counter)
        for row in rows:
            key = tuple(row.get(a) for a in sticky)
            tup = tuple(row.get(c) for c in qi)
            if all(v is None for v in tup):  # suppressed; one null is a published value
                continue
            by_class[tup][key] += 1
            followed[key].append((t, tup))
        classes.append(by_class)
    sizes = []
    for key, seen in followed.items():
        if key in repeated:
            continue
        candidates: Counter[tuple[Hashable, ...]] | None = None
        for t, tup in seen:
            here = classes[t][tup]
            candidates = Counter(here) if candidates is None else candidates & here
        sizes.append(sum((candidates or Counter()).values()))
    ordered = sorted(sizes)
    return ChainLinkage(
        chains=len(ordered),
        below_k=sum(s < k for s in ordered),
        isolated=sum(s == 1 for s in ordered),
        smallest=ordered[:10],
    )
