"""Local suppression to k-anonymity, missing values matching anything (sdcMicro ``kAnon``).

A record violates k-anonymity when fewer than k records **match** its key (equal wherever both
have a value: :func:`gateway.measures.frequency_risk.sample_frequencies`). Suppressing one of
its cells (setting it missing) can only raise the counts: the record then matches more
records, and every record it newly matches counts it too. The algorithm suppresses one cell at
a time:

1. take the violating record with the fewest matches (ties: the earlier record);
2. among its present cells, suppress the one whose suppression gives it the most matches,
   preferring a cell whose suppression alone reaches k, and among equals the *least
   important* key (``importance``: 1 = most important, kept longest; sdcMicro's default
   ranks keys by their number of categories, the most detailed suppressed first);
3. update the counts exactly (the records newly matched gain one, the record gets its new
   count) and repeat until no record is below k.

It ends: each step removes one value, and a record with every cell missing matches all n ≥ k
records. sdcMicro's heuristic (``suppSubset`` in ``R/localSuppression.R``) instead suppresses,
for each violating record in a sweep, the least important cell in which it differs from one of
its nearest records by Hamming distance, and recounts only after the sweep; on testdata it
needs more cells (see ``tests/gateway/test_local_suppression.py``).
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


@dataclass(frozen=True)
class Suppression:
    codes: Int  # the key codes after suppression (MISSING where suppressed)
    suppressed: NDArray[np.bool_]  # n × p: cells this run suppressed (not those missing before)
    fk: NDArray[np.float64]  # matches per record afterwards (all ≥ k)

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


def suppress_to_k(codes: Int, k: int, importance: Sequence[int] | None = None) -> Suppression:
    """Suppress cells of ``codes`` (n × p) until every record matches at least k records."""
    codes = np.array(codes, dtype=np.int64, copy=True)
    n, p = codes.shape
    if k < 2:
        raise InputDataError(f"k must be ≥ 2, got {k}; a class of one record discloses it")
    if n < k:
        raise InputDataError(f"k = {k} but the file has {n} records: no k-anonymous release")
    imp = list(importance) if importance is not None else default_importance(codes)
    if sorted(imp) != list(range(1, p + 1)):
        raise InputDataError(
            f"--importance must rank the {p} keys 1..{p} (1 = most important), got {imp}"
        )
    # least important first: the preference among cells that give the same count
    prefer = np.array(imp, dtype=np.float64)
    before = codes == MISSING
    fk, _ = sample_frequencies(codes)
    while True:
        unsafe = np.flatnonzero(fk < k)
        if unsafe.size == 0:
            break
        r = int(unsafe[np.argmin(fk[unsafe])])  # fewest matches; argmin takes the first
        row = codes[r]
        eq = (codes == row) | (codes == MISSING) | (row == MISSING)
        mismatches = (~eq).sum(axis=1)
        matched = mismatches == 0
        present = np.flatnonzero(row != MISSING)
        # matches after suppressing column j: the matched rows plus those differing only in j
        gain = np.array([int(((mismatches == 1) & ~eq[:, j]).sum()) for j in present])
        new_fk = matched.sum() + gain
        reaches = new_fk >= k
        # rank: reaching k first, then more matches, then the less important key
        score = reaches * 1e12 + new_fk * 1e3 + prefer[present]
        j = int(present[np.argmax(score)])
        newly = (mismatches == 1) & ~eq[:, j]
        codes[r, j] = MISSING
        fk[newly] += 1
        fk[r] = float(matched.sum() + newly.sum())
    return Suppression(codes=codes, suppressed=(codes == MISSING) & ~before, fk=fk)
