"""MDAV over numeric, ordinal and nominal quasi-identifiers together: the group and centroid
rules of gateway.mixed_microaggregation, checked on random mixed data against plain-Python
restatements (group sizes, one published tuple per group, mean / lower median / first mode)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.microaggregation import mdav_groups
from gateway.mixed_microaggregation import QIColumn, QIKind, mixed_microaggregate

ORDINAL_CATS = ("low", "mid", "high", "top")
NOMINAL_CATS = ("red", "green", "blue")


@dataclass(frozen=True)
class Case:
    k: int
    columns: tuple[QIColumn, ...]
    values: tuple[tuple[object, ...], ...]  # one tuple per column


@st.composite
def cases(draw: st.DrawFn, *, numeric_only: bool = False) -> Case:
    k = draw(st.integers(2, 6))
    n = draw(st.integers(2 * k, 60))
    kinds = [QIKind.NUMERIC] * draw(st.integers(1 if numeric_only else 0, 3))
    if not numeric_only:
        kinds += [QIKind.ORDINAL] * draw(st.integers(0, 2))
        kinds += [QIKind.NOMINAL] * draw(st.integers(0, 2))
    if not kinds:
        kinds = [draw(st.sampled_from(list(QIKind)))]
    columns: list[QIColumn] = []
    values: list[tuple[object, ...]] = []
    for j, kind in enumerate(kinds):
        if kind is QIKind.NUMERIC:
            # small integer range: many ties, as in real quasi-identifiers
            col = QIColumn(f"num{j}", kind)
            vals: list[object] = [
                float(v) for v in draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
            ]
        else:
            cats = ORDINAL_CATS if kind is QIKind.ORDINAL else NOMINAL_CATS
            col = QIColumn(f"{kind.value}{j}", kind, cats)
            vals = list(draw(st.lists(st.sampled_from(cats), min_size=n, max_size=n)))
        columns.append(col)
        values.append(tuple(vals))
    return Case(k, tuple(columns), tuple(values))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_groups_and_centroids_follow_the_rules(case: Case) -> None:
    published, labels = mixed_microaggregate(case.columns, case.values, case.k)
    n = len(case.values[0])
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(labels.tolist()):
        groups.setdefault(g, []).append(i)

    for members in groups.values():
        assert case.k <= len(members) <= 2 * case.k - 1
        tuples = {tuple(published[j][i] for j in range(len(case.columns))) for i in members}
        assert len(tuples) == 1, "members of a group publish different tuples"

    for j, col in enumerate(case.columns):
        original, out = case.values[j], published[j]
        for members in groups.values():
            got = out[members[0]]
            if col.kind is QIKind.NUMERIC:
                mean = sum(float(original[i]) for i in members) / len(members)
                assert abs(float(got) - mean) <= 1e-9 * max(1.0, abs(mean))
            elif col.kind is QIKind.ORDINAL:
                ranks = sorted(col.categories.index(original[i]) for i in members)
                assert got == col.categories[ranks[(len(ranks) - 1) // 2]]
            else:
                tally = Counter(original[i] for i in members)
                top = max(tally.values())
                modes = [c for c in col.categories if tally.get(c, 0) == top]
                assert got == modes[0]
    assert sum(len(m) for m in groups.values()) == n


@settings(max_examples=80, deadline=None)
@given(cases(numeric_only=True))
def test_numeric_only_partition_is_plain_mdav(case: Case) -> None:
    _, labels = mixed_microaggregate(case.columns, case.values, case.k)
    x = np.column_stack([np.asarray(v, dtype=np.float64) for v in case.values])
    np.testing.assert_array_equal(labels, mdav_groups(x, case.k))
