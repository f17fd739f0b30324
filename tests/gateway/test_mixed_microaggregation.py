"""MDAV over numeric, ordinal and nominal quasi-identifiers together: the group and centroid
rules of gateway.grouping.mixed_microaggregation, checked on random mixed data against plain-Python
restatements (group sizes, one published tuple per group, mean / lower median / first mode)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.grouping import microaggregation as ma
from gateway.grouping import mixed_microaggregation as mmx
from gateway.grouping.microaggregation import mdav_groups
from gateway.grouping.mixed_microaggregation import (
    EditRule,
    QIColumn,
    QIKind,
    claim_columns,
    embed,
    mixed_microaggregate,
)
from gateway.policy import AttrType, policy_from_yaml

ROOT = Path(__file__).resolve().parents[2]

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
    # the nominal columns publish a member's combination: the one agreeing with most member
    # cells, then the most frequent, then the one whose categories come first in the lists
    nominal = [j for j, c in enumerate(case.columns) if c.kind is QIKind.NOMINAL]
    for members in groups.values():
        if not nominal:
            break
        combos = Counter(
            tuple(case.columns[j].categories.index(case.values[j][i]) for j in nominal)
            for i in members
        )

        def agree(combo: tuple[int, ...], members: list[int] = members) -> int:
            return sum(
                case.columns[j].categories.index(case.values[j][i]) == c
                for j, c in zip(nominal, combo, strict=True)
                for i in members
            )

        best = min(combos, key=lambda c: (-agree(c), -combos[c], c))
        want = tuple(case.columns[j].categories[c] for j, c in zip(nominal, best, strict=True))
        assert tuple(published[j][members[0]] for j in nominal) == want
    assert sum(len(m) for m in groups.values()) == n


@settings(max_examples=80, deadline=None)
@given(cases(numeric_only=True))
def test_numeric_only_partition_is_plain_mdav(case: Case) -> None:
    _, labels = mixed_microaggregate(case.columns, case.values, case.k)
    x = np.column_stack([np.asarray(v, dtype=np.float64) for v in case.values])
    np.testing.assert_array_equal(labels, mdav_groups(x, case.k))


# ---------------------------------------------------------------------------------------------
# The look-up path (one-hot blocks, shared codes) gives today's dense partition bit for bit
# ---------------------------------------------------------------------------------------------

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _reference_embed(
    columns: tuple[QIColumn, ...], values: tuple[tuple[object, ...], ...]
) -> np.ndarray:
    """The embedding as it was computed before the look-up path (np.unique, dense one-hot)."""
    n = len(values[0])
    parts = []
    for col, vals in zip(columns, values, strict=True):
        if col.kind is QIKind.NUMERIC:
            a = np.array(vals, dtype=np.float64)
        elif col.kind is QIKind.ORDINAL:
            a = np.array([col.categories.index(v) for v in vals], dtype=np.float64)
        if col.kind is not QIKind.NOMINAL:
            sd = float(a.std())
            parts.append(((a - a.mean()) / sd if sd > 0 else np.zeros_like(a))[:, None])
            continue
        codes = np.array([col.categories.index(v) for v in vals])
        present, inverse = np.unique(codes, return_inverse=True)
        onehot = np.zeros((n, present.size))
        onehot[np.arange(n), inverse] = 1.0
        f = onehot.mean(axis=0)
        total_var = 1.0 - float(f @ f)
        scale = 1.0 / np.sqrt(total_var) if total_var > 1e-12 else 0.0
        parts.append(onehot * scale)
    return np.hstack(parts)


def _dense_labels(x: np.ndarray, k: int) -> np.ndarray:
    """The dense pruned MDAV (no look-up blocks): the computation before the look-up path."""
    return ma._mdav_labels(np.array(x), k, np.ones(x.shape[1]), direct_max=0)


@st.composite
def mixed_cases(draw: st.DrawFn) -> Case:
    """Mostly nominal data with ties and duplicates: tiny and single-category domains, a
    dominant category, few distinct numeric values, n up to a few hundred."""
    k = draw(st.integers(2, 7))
    n = draw(st.integers(2 * k, 300))
    rows = draw(st.integers(1, n))  # distinct rows; the others are duplicates of them
    kinds = [QIKind.NOMINAL] * draw(st.integers(1, 4))
    kinds += [QIKind.NUMERIC] * draw(st.integers(0, 2))
    kinds += [QIKind.ORDINAL] * draw(st.integers(0, 1))
    kinds = draw(st.permutations(kinds))
    pick = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    source = pick.integers(0, rows, n)
    columns: list[QIColumn] = []
    values: list[tuple[object, ...]] = []
    for j, kind in enumerate(kinds):
        if kind is QIKind.NUMERIC:
            spread = draw(st.sampled_from([1, 2, 5, 50]))
            base = pick.integers(0, spread, rows) * draw(st.sampled_from([1.0, 0.1, 1e3]))
            columns.append(QIColumn(f"num{j}", kind))
            values.append(tuple(float(v) for v in base[source]))
            continue
        size = draw(st.integers(1, 12))
        cats = tuple(f"c{i}" for i in range(size))
        used = draw(st.integers(1, size))  # categories that occur (single-category columns)
        weights = pick.random(used) ** draw(st.sampled_from([1, 4]))  # dominant categories
        base = pick.choice(used, size=rows, p=weights / weights.sum())
        columns.append(QIColumn(f"{kind.value}{j}", kind, cats))
        values.append(tuple(cats[c] for c in base[source]))
    return Case(k, tuple(columns), tuple(values))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_cases())
def test_look_up_path_gives_the_dense_partition(case: Case) -> None:
    x = _reference_embed(case.columns, case.values)
    np.testing.assert_array_equal(embed(case.columns, case.values), x)  # bit for bit
    _, labels = mixed_microaggregate(case.columns, case.values, case.k)
    np.testing.assert_array_equal(labels, _dense_labels(x, case.k))
    # the pruned search itself, on every remaining-set size (direct_max=0), with the blocks
    _, blocks, _ = mmx._embed(case.columns, case.values, True)
    looked = ma._mdav_labels(np.array(x), case.k, np.ones(x.shape[1]), 0, blocks)
    np.testing.assert_array_equal(looked, labels)
    # and the direct exact method (sdcMicro's arithmetic on every record, no pruning bound)
    direct = ma._mdav_labels(np.array(x), case.k, np.ones(x.shape[1]), x.shape[0])
    np.testing.assert_array_equal(direct, labels)
    # blocks whose codes do not describe the data are refused (dense product), same labels
    wrong = [(cols, (codes + np.arange(codes.size)) % 2) for cols, codes in blocks]
    lied = ma._mdav_labels(np.array(x), case.k, np.ones(x.shape[1]), 0, wrong)
    np.testing.assert_array_equal(lied, labels)


@pytest.mark.skipif(not (DATA / "adult.csv").is_file(), reason="shared Adult data absent")
def test_look_up_path_on_adult_with_the_policy_quasi_identifiers() -> None:
    policy = policy_from_yaml((ROOT / "deploy" / "policies" / "adult.yaml").read_text())
    columns = tuple(claim_columns(policy))
    assert len(columns) == 9
    frame = pd.read_csv(DATA / "adult.csv", dtype=str, keep_default_na=False).head(3000)
    values = []
    for name in policy.k_claim:
        attr = policy.attributes[name]
        raw = [None if v in ("?", "") else v for v in frame[name]]
        if attr.type is AttrType.NUMERIC:
            raw = [None if v is None else float(v) for v in raw]
        values.append(tuple(mmx.claim_inputs(attr, raw)))
    keep = [i for i in range(len(frame)) if all(col[i] is not None for col in values)]
    vals = tuple(tuple(col[i] for i in keep) for col in values)
    x = _reference_embed(columns, vals)
    np.testing.assert_array_equal(embed(columns, vals), x)
    _, blocks, _ = mmx._embed(columns, vals, True)
    for k in (2, 3, 5, 7):
        _, labels = mixed_microaggregate(columns, vals, k)
        np.testing.assert_array_equal(labels, _dense_labels(x, k))
    looked = ma._mdav_labels(np.array(x), 5, np.ones(x.shape[1]), 0, blocks)
    np.testing.assert_array_equal(looked, _dense_labels(x, 5))
    direct = ma._mdav_labels(np.array(x), 5, np.ones(x.shape[1]), x.shape[0])
    np.testing.assert_array_equal(looked, direct)


@settings(max_examples=120, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from(["F", "M"]), st.sampled_from(["husband", "wife", "other"])),
        min_size=6,
        max_size=60,
    ),
    k=st.integers(2, 5),
)
def test_edit_rules_are_never_broken_and_groups_publish_a_members_combination(
    rows: list[tuple[str, str]], k: int
) -> None:
    if len(rows) < k:
        return
    columns = [
        QIColumn("sex", QIKind.NOMINAL, ("F", "M")),
        QIColumn("rel", QIKind.NOMINAL, ("husband", "wife", "other")),
    ]
    rules = [
        EditRule.of({"rel": ["husband"], "sex": ["F"]}),
        EditRule.of({"rel": ["wife"], "sex": ["M"]}),
    ]
    values = [[r[0] for r in rows], [r[1] for r in rows]]
    published, labels = mixed_microaggregate(columns, values, k, rules=rules)
    for g in set(labels.tolist()):
        members = [i for i, lab in enumerate(labels.tolist()) if lab == g]
        combo = {"sex": published[0][members[0]], "rel": published[1][members[0]]}
        if None in combo.values():  # every member's combination broke a rule: suppressed
            assert all(
                any(rule.breaks(dict(zip(("sex", "rel"), rows[i], strict=True))) for rule in rules)
                for i in members
            )
            continue
        assert not any(rule.breaks(combo) for rule in rules)
        assert tuple(combo.values()) in {rows[i] for i in members}  # a member's combination
