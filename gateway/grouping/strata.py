"""Microaggregation within strata (sdcMicro ``microaggregation(strata_variables = …)``).

Records are partitioned by their stratum (the tuple of the strata columns); MDAV runs in each
stratum on its own, so no group crosses a stratum. A stratum with fewer than k records cannot
form a group: with ``small = merge`` all such strata are pooled into one (and the pool, if still
below k, joins the smallest stratum that has k records); with ``small = suppress`` their records
are left ungrouped (label −1) for the caller to publish suppressed. Either way they are
reported by name count, never by value. The stream keys its pools by :func:`stratum_texts`
instead (:mod:`gateway.grouping.scope`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from gateway.errors import MechanismError
from gateway.policy import SmallStrata

Int = NDArray[np.int64]


@dataclass(frozen=True)
class StrataResult:
    labels: Int  # group of each record, unique across strata; −1 = ungrouped (suppressed)
    stratum: Int  # the stratum each record was grouped in (after merging), −1 if suppressed
    strata: int
    small_strata: int  # strata with fewer than k records
    records_in_small_strata: int
    merged_into: dict[int, int] = field(default_factory=dict)  # small stratum -> its pool


def stratum_ids(columns: Sequence[Sequence[object]], n: int) -> Int:
    """Dense id of each record's tuple of strata values (missing is a value of its own)."""
    key = np.zeros(n, dtype=np.int64)
    for col in columns:
        _, codes = np.unique(np.array([str(v) for v in col], dtype=object), return_inverse=True)
        _, key = np.unique(key * (int(codes.max()) + 1) + codes, return_inverse=True)
        key = key.reshape(-1).astype(np.int64)
    return key


def stratified_groups(
    strata: Int,
    k: int,
    group: Callable[[Int], Int],
    *,
    small: SmallStrata = SmallStrata.MERGE,
) -> StrataResult:
    """Group the records of each stratum with ``group`` (row indices -> local labels 0..g-1)."""
    n = strata.size
    if n and n < k:
        raise MechanismError(f"k = {k} but there are {n} records: no group can be formed")
    ids, counts = np.unique(strata, return_counts=True)
    small_ids = ids[counts < k]
    pool_of = {int(s): int(s) for s in ids}
    if small is SmallStrata.MERGE and small_ids.size:
        pool = int(small_ids[0])
        for s in small_ids:
            pool_of[int(s)] = pool
        pooled = int(counts[counts < k].sum())
        if pooled < k:  # the pool joins the smallest stratum that has k records
            big = ids[counts >= k]
            target = int(big[np.argmin(counts[counts >= k])])
            for s in small_ids:
                pool_of[int(s)] = target
    effective = np.array([pool_of[int(s)] for s in strata], dtype=np.int64)
    labels = np.full(n, -1, dtype=np.int64)
    grouped_in = np.full(n, -1, dtype=np.int64)
    next_label = 0
    for s in np.unique(effective):
        rows = np.flatnonzero(effective == s)
        if rows.size < k:  # only with small = suppress
            continue
        local = group(rows)
        labels[rows] = local + next_label
        grouped_in[rows] = s
        next_label += int(local.max()) + 1
    merged = {int(s): pool_of[int(s)] for s in small_ids} if small is SmallStrata.MERGE else {}
    return StrataResult(
        labels=labels,
        stratum=grouped_in,
        strata=int(ids.size),
        small_strata=int(small_ids.size),
        records_in_small_strata=int(counts[counts < k].sum()),
        merged_into=merged,
    )


def stratum_texts(columns: Sequence[Sequence[object]], n: int) -> list[str]:
    """Each record's stratum as canonical text (the stream's scope key and what its digest is
    taken of): the JSON list of its strata values, a missing value a value of its own and
    numbers of equal value alike (1 and 1.0)."""
    if not columns:
        return [""] * n
    memo: dict[tuple[object, ...], str] = {}
    out: list[str] = []
    for row in zip(*columns, strict=True):
        text = memo.get(row)
        if text is None:
            text = memo[row] = json.dumps([_canonical(v) for v in row])
        out.append(text)
    return out


def _canonical(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
