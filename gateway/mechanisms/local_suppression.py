"""Local suppression to k-anonymity, missing values matching anything (sdcMicro ``kAnon``),
with sdcMicro's importance semantics.

A record violates k-anonymity when fewer than k records **match** its key (equal wherever both
have a value: :func:`gateway.measures.frequency_risk.sample_frequencies`). Suppressing cells
(setting them missing) can only raise the counts: the record then matches more records, and
every record it newly matches counts it too. Importance ranks the keys (1 = most important,
kept longest; sdcMicro's default ranks them by their number of categories, fewest first). The
rule is sdcMicro's: less important keys are suppressed first, and an important key is
suppressed only where no combination of less important ones brings the record to k.

Records with the same key tuple share every count, so the algorithm works on the distinct
tuples ("classes"):

1. take the violating class with the fewest matches (ties: the one seen first in the file);
2. among the subsets S of its present cells whose suppression gives it ≥ k matches, take the
   one that spares the most important keys: each key is a bit, the most important the highest,
   and the smallest number S wins. So S holds key i only if no S without i (and without every
   key above i that it spares) reaches k; among the subsets that spare the same important
   keys, the one with the fewest cells of the next key down, and so on;
3. move the whole class to its suppressed tuple and update the counts exactly (a class newly
   matching it gains its size), and repeat until no class is below k.

A class's counts against every subset come at once: each other class differs from it on a set
of columns (a bit mask), and the records matching it after suppressing S are those whose mask
lies in S, a subset sum over the 2^p masks. It ends: a moved class has ≥ k matches, and counts
never fall. ``strata`` runs it within each stratum (sdcMicro's ``strataVars``), the importance
taken over the whole file as sdcMicro does.

sdcMicro's own heuristic (``suppSubset`` in ``R/localSuppression.R``) suppresses one cell per
violating record and sweep, the least important in which the record differs from one of its
nearest records by Hamming distance, and recounts only after the sweep; it needs more cells
(``tests/gateway/test_local_suppression.py`` ports it and compares per key).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gateway.errors import InputDataError
from gateway.measures.frequency_risk import MISSING, sample_frequencies

__all__ = ["Suppression", "default_importance", "suppress_to_k"]

Int = NDArray[np.int64]
MAX_KEYS = 20  # 2^p subset counts per step


@dataclass(frozen=True)
class Suppression:
    codes: Int  # the key codes after suppression (MISSING where suppressed)
    suppressed: NDArray[np.bool_]  # n × p: cells this run suppressed (not those missing before)
    fk: NDArray[np.float64]  # matches per record afterwards (all ≥ k; within its stratum)

    @property
    def cells(self) -> int:
        return int(self.suppressed.sum())

    @property
    def records(self) -> int:
        return int(self.suppressed.any(axis=1).sum())

    def per_key(self, keys: Sequence[str]) -> dict[str, int]:
        return {name: int(c) for name, c in zip(keys, self.suppressed.sum(axis=0), strict=True)}


def default_importance(codes: Int) -> list[int]:
    """sdcMicro's default: a key with fewer categories is more important (1 = kept longest);
    equal counts keep the keys' order."""
    cats = [len(np.unique(c[c != MISSING])) for c in codes.T]
    order = sorted(range(len(cats)), key=lambda j: (cats[j], j))
    importance = [0] * len(cats)
    for rank, j in enumerate(order, start=1):
        importance[j] = rank
    return importance


def _subset_sums(h: Int, p: int) -> Int:
    """g[S] = Σ over the masks m ⊆ S of h[m] (the zeta transform over p bits)."""
    g = h.copy()
    for b in range(p):
        v = g.reshape(-1, 2, 1 << b)
        v[:, 1, :] += v[:, 0, :]
    return g


class _Classes:
    """The distinct tuples of one stratum: size, matches, and where a moved class went."""

    def __init__(self, codes: Int, bit: Int):
        tuples, first, inverse = np.unique(codes, axis=0, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # classes in the order the file shows them
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        self.of_record: Int = rank[inverse.reshape(-1)]
        self.tuples = tuples[order].astype(np.int64)
        self.size = np.bincount(self.of_record, minlength=order.size).astype(np.int64)
        self.moved_to = np.full(order.size, -1, dtype=np.int64)
        self.index = {t.tobytes(): i for i, t in enumerate(self.tuples)}
        self.bit = bit
        # matches per class: the sizes of the classes matching it (weights = sizes)
        self.fk = sample_frequencies(self.tuples, self.size.astype(np.float64))[1].astype(np.int64)

    def masks(self, t: Int) -> Int:
        """Per class, the bits of the columns where it and ``t`` both have a value and differ."""
        differ = (self.tuples != t) & (self.tuples != MISSING) & (t != MISSING)
        masks: Int = (differ * self.bit).sum(axis=1)
        return masks

    def move(self, i: int, s: int, mask: Int, fk: int) -> None:
        """Class ``i`` suppresses the columns of bit set ``s`` (``mask``: :meth:`masks` of it)."""
        alive = self.size > 0
        self.fk[alive & (mask != 0) & ((mask & ~s) == 0)] += self.size[i]
        t = np.where((self.bit & s) != 0, MISSING, self.tuples[i])
        j = self.index.get(t.tobytes())
        if j is None:
            j = len(self.tuples)
            self.tuples = np.vstack([self.tuples, t])
            self.size = np.append(self.size, 0)
            self.fk = np.append(self.fk, 0)
            self.moved_to = np.append(self.moved_to, -1)
            self.index[t.tobytes()] = j
        self.size[j] += self.size[i]
        self.fk[j] = fk
        self.size[i] = 0
        self.moved_to[i] = j
        del self.index[self.tuples[i].tobytes()]

    def final(self) -> Int:
        """Each record's class after every move."""
        # a class moves once, into one that then has k matches and so never moves
        end = np.where(self.moved_to >= 0, self.moved_to, np.arange(len(self.tuples)))
        moved: Int = end[self.of_record]
        return moved


def _suppress_stratum(codes: Int, k: int, bit: Int) -> tuple[Int, Int]:
    """The codes after suppression and each record's matches, for one stratum."""
    p = codes.shape[1]
    c = _Classes(codes, bit)
    every = np.arange(1 << p, dtype=np.int64)
    while True:
        below = np.flatnonzero((c.size > 0) & (c.fk < k))
        if below.size == 0:
            break
        i = int(below[np.argmin(c.fk[below])])  # fewest matches; argmin takes the first
        t = c.tuples[i]
        mask = c.masks(t)
        alive = c.size > 0
        by_mask = np.bincount(mask[alive], weights=c.size[alive], minlength=1 << p)
        counts = _subset_sums(by_mask.astype(np.int64), p)
        present = int(bit[t != MISSING].sum())
        s = int(np.argmax(((every & ~present) == 0) & (counts >= k)))  # the smallest S
        c.move(i, s, mask, int(counts[s]))
    end = c.final()
    return c.tuples[end], c.fk[end]


def suppress_to_k(
    codes: Int,
    k: int,
    importance: Sequence[int] | None = None,
    strata: Int | None = None,
) -> Suppression:
    """Suppress cells of ``codes`` (n × p) until every record matches at least k records (of
    its stratum, when ``strata`` gives each record's stratum id)."""
    codes = np.array(codes, dtype=np.int64, copy=True)
    n, p = codes.shape
    if k < 2:
        raise InputDataError(f"k must be ≥ 2, got {k}; a class of one record discloses it")
    if n < k:
        raise InputDataError(f"k = {k} but the file has {n} records: no k-anonymous release")
    if p > MAX_KEYS:
        raise InputDataError(f"--keys: {p} keys; local suppression takes at most {MAX_KEYS}")
    imp = list(importance) if importance is not None else default_importance(codes)
    if sorted(imp) != list(range(1, p + 1)):
        raise InputDataError(
            f"--importance must rank the {p} keys 1..{p} (1 = most important), got {imp}"
        )
    bit = np.array([1 << (p - r) for r in imp], dtype=np.int64)  # most important: highest
    before = codes == MISSING
    fk = np.zeros(n)
    groups = [np.arange(n)] if strata is None else _strata_rows(np.asarray(strata), k)
    for rows in groups:
        codes[rows], fk[rows] = _suppress_stratum(codes[rows], k, bit)
    return Suppression(codes=codes, suppressed=(codes == MISSING) & ~before, fk=fk)


def _strata_rows(strata: Int, k: int) -> list[Int]:
    """The records of each stratum; every stratum must hold k records."""
    ids, of_record, sizes = np.unique(strata, return_inverse=True, return_counts=True)
    small = sizes < k
    if small.any():
        raise InputDataError(
            f"--strata: {int(small.sum())} of {ids.size} strata hold fewer than k = {k} records "
            f"(the smallest {int(sizes.min())}); no k-anonymous release within them: use fewer "
            "strata columns, coarser strata or a smaller k"
        )
    of_record = of_record.reshape(-1)
    return [np.flatnonzero(of_record == s) for s in range(ids.size)]
