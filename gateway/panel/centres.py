"""Cohorts' centres and the nearest one to a claim row: where fewer than k new entrants join,
and where a cohort below k (a policy whose k rose) merges."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gateway.panel.roster import Roster


@dataclass(frozen=True, slots=True)
class Centres:
    rows: list[list[object]]
    scale: NDArray[np.float64]  # the numbers' spread over the centres
    numbers: NDArray[np.float64]  # each centre's numbers, one row a centre
    categories: NDArray[np.object_]  # each centre's categories


def cohort_centres(
    roster: Roster, cohorts: list[int], members: dict[int, list[int]], numeric: Sequence[bool]
) -> Centres:
    """Each cohort's mean numbers and most frequent categories (for nearness only)."""
    rows: list[list[object]] = []
    for c in cohorts:
        cols = roster.carried.claim_columns(np.asarray(members[c], dtype=np.intp))
        centre: list[object] = []
        for j, is_num in enumerate(numeric):
            col = cols[j]
            if is_num:
                centre.append(float(np.mean(np.asarray(col, dtype=np.float64))))
            else:
                counts = Counter(col)
                centre.append(max(counts, key=lambda x: (counts[x], repr(x))))
        rows.append(centre)
    num_j = [j for j, n in enumerate(numeric) if n]
    cat_j = [j for j, n in enumerate(numeric) if not n]
    numbers = np.asarray([[row[j] for j in num_j] for row in rows], dtype=np.float64)
    numbers = numbers.reshape(len(rows), len(num_j))
    categories = np.empty((len(rows), len(cat_j)), dtype=object)
    for t, row in enumerate(rows):
        for u, j in enumerate(cat_j):
            categories[t, u] = row[j]
    scale = numbers.std(axis=0) if len(rows) > 1 else np.ones(len(num_j))
    return Centres(rows, np.where(scale > 0, scale, 1.0), numbers, categories)


def nearest(
    row: Sequence[object],
    centres: Centres,
    numeric: Sequence[bool],
    among: NDArray[np.bool_] | None = None,
) -> int:
    """The nearest centre (the first of equals), of those ``among`` when given: squared
    standardized distance on the numbers plus one a category that differs."""
    x = np.asarray([float(v) for v, n in zip(row, numeric, strict=True) if n])  # type: ignore[arg-type]
    kinds = [v for v, n in zip(row, numeric, strict=True) if not n]
    cats = np.empty(len(kinds), dtype=object)
    for u, v in enumerate(kinds):
        cats[u] = v
    d = np.square((x - centres.numbers) / centres.scale).sum(axis=1)
    d = d + (centres.categories != cats).sum(axis=1)
    if among is not None:
        d = np.where(among, d, np.inf)
    return int(np.argmin(d))
