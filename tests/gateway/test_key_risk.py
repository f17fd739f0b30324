"""Risk over the whole published key: frequency counts, distinct l-diversity and record linkage
with the heterogeneous distance, each checked against a plain-Python brute force (exact
rational arithmetic for the linkage distances, so that ties are ties)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Hashable, Sequence
from fractions import Fraction
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import InputDataError, MechanismError
from gateway.grouping.mixed_microaggregation import QIColumn, QIKind, embed, mixed_microaggregate
from gateway.measures import key_risk as key_risk_module
from gateway.measures.key_risk import class_sizes, combine_codes, key_risk
from gateway.measures.linkage import MixedScaling, mixed_linkage

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
NUM = ("age", "education_num", "hours_per_week")
CAT = ("sex", "race", "marital_status", "relationship", "workclass", "native_country")

MISSING = object()  # brute force: every missing value is the one value "suppressed"


def _norm(v: object) -> Hashable:
    missing = v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))
    return MISSING if missing else v  # type: ignore[return-value]


def _tuples(frame: pd.DataFrame, cols: Sequence[str]) -> list[tuple[Hashable, ...]]:
    return [tuple(_norm(frame[c].iloc[i]) for c in cols) for i in range(len(frame))]


# ---------------------------------------------------------------------------------------------
# Frequency counts
# ---------------------------------------------------------------------------------------------

cell = st.one_of(st.sampled_from(["a", "b", "c"]), st.none(), st.just(float("nan")))


@st.composite
def frames(draw: st.DrawFn, min_rows: int = 0) -> pd.DataFrame:
    q = draw(st.integers(1, 3))
    n = draw(st.integers(min_rows, 40))
    data = {f"q{j}": draw(st.lists(cell, min_size=n, max_size=n)) for j in range(q)}
    data["s"] = draw(st.lists(st.sampled_from(["x", "y", None]), min_size=n, max_size=n))
    return pd.DataFrame(data, dtype=object)


@settings(max_examples=150, deadline=None)
@given(frames())
def test_class_sizes_match_a_brute_force_count(frame: pd.DataFrame) -> None:
    qi = [c for c in frame.columns if c.startswith("q")]
    keys = _tuples(frame, qi)
    counts = Counter(keys)
    sizes = class_sizes(frame, qi)
    assert sizes.tolist() == [counts[key] for key in keys]

    risk = key_risk(frame, qi, 3)
    assert risk.records == len(frame)
    assert risk.classes == len(counts)
    first = {key: i for i, key in reversed(list(enumerate(keys)))}  # one record per class
    assert sum(int(sizes[i]) for i in first.values()) == risk.records  # Σ over classes of size
    assert risk.sample_uniques == sum(1 for s in counts.values() if s == 1)
    below = sum(s for s in counts.values() if s < 3)
    assert risk.records_below_k == below
    assert risk.share_below_k == (below / len(frame) if len(frame) else 0.0)
    assert risk.smallest_class == (min(counts.values()) if counts else 0)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 40).flatmap(
        lambda n: st.lists(
            st.integers(1, 2**40).flatmap(
                lambda radix: st.lists(
                    st.integers(0, radix - 1) | st.sampled_from([0, radix - 1]),
                    min_size=n,
                    max_size=n,
                )
            ),
            max_size=8,
        ).map(lambda cols: (n, cols))
    )
)
def test_combined_codes_number_the_distinct_tuples_in_their_order(
    case: tuple[int, list[list[int]]],
) -> None:
    """Each row's id is the rank of its tuple of codes among the distinct tuples (in tuple
    order), whatever the codes' range: columns up to 2^40 codes force the keys to be
    re-densified midway, which must not change an id."""
    n, cols = case
    ids, groups = combine_codes([np.asarray(c, dtype=np.int64) for c in cols], n)
    tuples = [tuple(c[i] for c in cols) for i in range(n)]
    rank = {t: r for r, t in enumerate(sorted(set(tuples)))}
    assert groups == len(rank)
    assert ids.tolist() == [rank[t] for t in tuples]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from(["u", "v", None]), st.integers(0, 3)),
        min_size=1,
        max_size=12,
        unique_by=lambda t: (t[0], t[1]),
    ),
    st.integers(2, 6),
    st.randoms(use_true_random=False),
)
def test_repeated_tuples_are_k_anonymous_and_one_new_row_is_unique(
    rows: list[tuple[int, str | None, int]], k: int, rnd: object
) -> None:
    # each distinct (a, b) tuple repeated k + extra times, in shuffled order
    records = [(a, b) for a, b, extra in rows for _ in range(k + extra)]
    rnd.shuffle(records)  # type: ignore[attr-defined]
    frame = pd.DataFrame(records, columns=["a", "b"], dtype=object)
    risk = key_risk(frame, ["a", "b"], k)
    assert risk.smallest_class >= k
    assert risk.share_below_k == 0.0
    assert risk.records_below_k == 0
    assert risk.sample_uniques == 0
    assert risk.classes == len(rows)

    grown = pd.concat(
        [frame, pd.DataFrame([(99, "u")], columns=["a", "b"], dtype=object)], ignore_index=True
    )
    risk = key_risk(grown, ["a", "b"], k)
    assert risk.sample_uniques == 1
    assert risk.smallest_class == 1
    assert risk.records_below_k == 1


def test_missing_values_are_one_suppressed_value() -> None:
    frame = pd.DataFrame(
        {"a": [None, float("nan"), pd.NA, "x", "x"], "b": [1.0, 1.0, 1.0, np.nan, None]},
        dtype=object,
    )
    assert class_sizes(frame, ["a", "b"]).tolist() == [3, 3, 3, 2, 2]


# ---------------------------------------------------------------------------------------------
# l-diversity
# ---------------------------------------------------------------------------------------------


def _brute_l_diversity(frame: pd.DataFrame, qi: Sequence[str], s: str) -> dict[str, float]:
    classes: dict[tuple[Hashable, ...], list[int]] = {}
    for i, key in enumerate(_tuples(frame, qi)):
        classes.setdefault(key, []).append(i)
    ells = {}
    for key, members in classes.items():
        distinct: list[Hashable] = []
        for i in members:
            v = _norm(frame[s].iloc[i])
            if v not in distinct:
                distinct.append(v)
        ells[key] = len(distinct)
    n = len(frame)
    homogeneous_records = 0
    for key, members in classes.items():
        if ells[key] == 1:
            homogeneous_records += len(members)
    return {
        "min_l": min(ells.values()),
        "share_classes_below_2": sum(1 for e in ells.values() if e < 2) / len(ells),
        "records_in_homogeneous_classes": homogeneous_records / n,
    }


def test_l_diversity_of_a_hand_built_table() -> None:
    frame = pd.DataFrame(
        {
            "zip": ["130", "130", "130", "130", "148", "148", "148", "148", "130", "148"],
            "age": ["<30", "<30", "<30", "<30", ">=40", ">=40", ">=40", ">=40", "3*", "3*"],
            "disease": ["heart", "heart", "viral", "cancer", "cancer", "cancer", "cancer",
                        "cancer", "viral", None],
            "income": ["lo", "lo", "lo", "lo", "hi", "lo", None, None, "hi", "hi"],
        }
    )  # fmt: skip
    risk = key_risk(frame, ["zip", "age"], 2, ["disease", "income"])
    for s in ("disease", "income"):
        assert risk.l_diversity[s].to_dict() == pytest.approx(
            _brute_l_diversity(frame, ["zip", "age"], s)
        )
    # the hand-built table has homogeneous classes for both attributes: the test can fail
    assert risk.l_diversity["disease"].min_l == 1
    assert risk.l_diversity["income"].records_in_homogeneous_classes > 0


@settings(max_examples=100, deadline=None)
@given(frames(min_rows=1), st.booleans())
def test_l_diversity_matches_a_brute_force_count(frame: pd.DataFrame, sorted_pairs: bool) -> None:
    """Both ways of counting distinct (class, value) pairs: flags, or a sort (``sorted_pairs``,
    what a table of more classes times values than records takes)."""
    qi = [c for c in frame.columns if c.startswith("q")]
    dense = -(10**12) if sorted_pairs else key_risk_module._DENSE_PAIRS
    with patch.object(key_risk_module, "_DENSE_PAIRS", dense):
        risk = key_risk(frame, qi, 2, ["s"])
    assert risk.l_diversity["s"].to_dict() == pytest.approx(_brute_l_diversity(frame, qi, "s"))


def test_report_is_json_serialisable_and_round_trips() -> None:
    frame = pd.DataFrame({"a": ["x", "x", "y"], "s": ["1", "2", "1"]})
    risk = key_risk(frame, ["a"], 2, ["s"])
    back = json.loads(json.dumps(risk.to_dict()))
    assert back["records_below_k"] == risk.records_below_k == 1
    assert back["l_diversity"]["s"]["min_l"] == risk.l_diversity["s"].min_l == 1
    empty = key_risk(frame.iloc[:0], ["a"], 2, ["s"])
    assert (empty.records, empty.smallest_class, empty.share_below_k) == (0, 0, 0.0)
    json.dumps(empty.to_dict())


def test_bad_input_names_the_column_and_never_a_value() -> None:
    frame = pd.DataFrame({"a": ["SECRET-VALUE-1"], "s": ["SECRET-VALUE-2"]})
    with pytest.raises(InputDataError, match="'missing_col'") as err:
        key_risk(frame, ["a", "missing_col"], 2)
    assert "SECRET" not in str(err.value)
    with pytest.raises(InputDataError, match="'a'"):
        key_risk(frame, ["a"], 2, ["a"])
    with pytest.raises(InputDataError, match="listed twice"):
        class_sizes(frame, ["a", "a"])
    with pytest.raises(InputDataError, match="no column"):
        class_sizes(frame, [])
    with pytest.raises(MechanismError, match="k must be"):
        key_risk(frame, ["a"], 0)


# ---------------------------------------------------------------------------------------------
# Record linkage: brute force in exact rational arithmetic
# ---------------------------------------------------------------------------------------------


def _frac(v: object) -> Fraction:
    """Exact value of a cell (numpy scalars to Python numbers first: no fixed-width maths)."""
    return Fraction(v.item() if isinstance(v, np.generic) else v)  # type: ignore[arg-type]


def _pop_var(xs: Sequence[Fraction]) -> Fraction:
    m = sum(xs, Fraction(0)) / len(xs)
    return sum(((x - m) ** 2 for x in xs), Fraction(0)) / len(xs)


def _brute_credits(
    original: pd.DataFrame, published: pd.DataFrame, columns: Sequence[QIColumn]
) -> tuple[list[Fraction], list[Fraction]]:
    """Per record: credit of the mixed-distance intruder and of the exact-key intruder."""
    n = len(original)
    weight: dict[str, Fraction] = {}  # squared distance of a difference of 1 (or of 0/1)
    for c in columns:
        if c.kind is QIKind.NOMINAL:
            freq = Counter(original[c.name])
            tv = 1 - sum(Fraction(f, n) ** 2 for f in freq.values())
            weight[c.name] = Fraction(2) / tv if tv else Fraction(0)  # 2·(1/√tv)²
        elif c.kind is QIKind.ORDINAL:
            var = _pop_var([Fraction(c.categories.index(v)) for v in original[c.name]])
            weight[c.name] = 1 / var if var else Fraction(0)
        else:
            var = _pop_var([_frac(v) for v in original[c.name]])
            weight[c.name] = 1 / var if var else Fraction(0)

    def term(c: QIColumn, a: object, b: object) -> Fraction:
        if c.kind is QIKind.NOMINAL:
            return weight[c.name] if a != b else Fraction(0)
        if c.kind is QIKind.ORDINAL:
            diff = Fraction(c.categories.index(a) - c.categories.index(b))  # type: ignore[arg-type]
        else:
            diff = _frac(a) - _frac(b)
        return diff * diff * weight[c.name]

    def credit(i: int, candidates: list[int], cols: Sequence[QIColumn]) -> Fraction:
        if not candidates:
            return Fraction(0)
        dist = {
            j: sum(
                (term(c, published[c.name].iloc[i], original[c.name].iloc[j]) for c in cols),
                Fraction(0),
            )
            for j in candidates
        }
        best = min(dist.values())
        nearest = [j for j in candidates if dist[j] == best]
        return Fraction(1, len(nearest)) if i in nearest else Fraction(0)

    numeric = [c for c in columns if c.kind is QIKind.NUMERIC]
    categorical = [c for c in columns if c.kind is not QIKind.NUMERIC]
    mixed, exact = [], []
    for i in range(n):
        mixed.append(credit(i, list(range(n)), columns))
        same_key = [
            j
            for j in range(n)
            if all(published[c.name].iloc[i] == original[c.name].iloc[j] for c in categorical)
        ]
        exact.append(credit(i, same_key, numeric))
    return mixed, exact


def _mean(xs: Sequence[Fraction]) -> float:
    return float(sum(xs, Fraction(0)) / len(xs))


def test_exact_key_linkage_of_a_tiny_table() -> None:
    columns = [
        QIColumn("age", QIKind.NUMERIC),
        QIColumn("sex", QIKind.NOMINAL, ("F", "M")),
        QIColumn("edu", QIKind.ORDINAL, ("primary", "secondary", "tertiary")),
    ]
    original = pd.DataFrame(
        {
            "age": [30, 32, 30, 50, 51, 30],
            "sex": ["F", "F", "F", "M", "M", "M"],
            "edu": ["primary", "primary", "primary", "tertiary", "tertiary", "secondary"],
        }
    )
    # records 0-2 published as one group (0 and 2 tie on age), 3 and 4 swap ages, 5 gets a
    # category that no original has with its other values (no exact match: not linked)
    published = pd.DataFrame(
        {
            "age": [30, 32, 30, 51, 50, 30],
            "sex": ["F", "F", "F", "M", "M", "M"],
            "edu": ["primary", "primary", "primary", "tertiary", "tertiary", "primary"],
        }
    )
    mixed, exact = _brute_credits(original, published, columns)
    assert exact == [Fraction(1, 2), 1, Fraction(1, 2), 0, 0, 0]  # the hand check
    result = mixed_linkage(original, published, columns)
    assert result.exact_key_linkage == pytest.approx(_mean(exact))
    assert result.share_linked == pytest.approx(_mean(mixed))
    assert (result.evaluated, result.excluded) == (6, 0)


@st.composite
def linkage_cases(draw: st.DrawFn) -> tuple[pd.DataFrame, pd.DataFrame, list[QIColumn]]:
    n = draw(st.integers(1, 20))
    columns = [QIColumn(f"x{j}", QIKind.NUMERIC) for j in range(draw(st.integers(0, 2)))]
    if draw(st.booleans()):
        columns.append(QIColumn("o", QIKind.ORDINAL, ("l", "m", "h")))
    for j in range(draw(st.integers(0 if columns else 1, 2))):
        columns.append(QIColumn(f"c{j}", QIKind.NOMINAL, ("p", "q", "r")))

    def column(c: QIColumn) -> st.SearchStrategy[list[object]]:
        values: st.SearchStrategy[object] = (
            st.integers(0, 4) if c.kind is QIKind.NUMERIC else st.sampled_from(c.categories)
        )
        return st.lists(values, min_size=n, max_size=n)

    original = pd.DataFrame({c.name: draw(column(c)) for c in columns})
    # published: each row kept or replaced by another draw (the protection)
    changed = pd.DataFrame({c.name: draw(column(c)) for c in columns})
    keep = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    published = original.where(pd.Series(keep), changed)
    return original, published, columns


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(linkage_cases())
def test_linkage_matches_an_exact_brute_force(
    case: tuple[pd.DataFrame, pd.DataFrame, list[QIColumn]],
) -> None:
    original, published, columns = case
    mixed, exact = _brute_credits(original, published, columns)
    result = mixed_linkage(original, published, columns)
    assert result.share_linked == pytest.approx(_mean(mixed), abs=1e-12)
    assert result.exact_key_linkage == pytest.approx(_mean(exact), abs=1e-12)
    p = _mean(mixed)
    assert result.standard_error == pytest.approx(math.sqrt(p * (1 - p) / len(original)))


def _random_mixed(n: int, seed: int) -> tuple[pd.DataFrame, list[QIColumn]]:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "x": rng.normal(size=n),
            "y": rng.integers(0, 100, size=n),
            "o": rng.choice(["l", "m", "h"], size=n),
            "c": rng.choice(["p", "q", "r", "s"], size=n),
        }
    )
    columns = [
        QIColumn("x", QIKind.NUMERIC),
        QIColumn("y", QIKind.NUMERIC),
        QIColumn("o", QIKind.ORDINAL, ("l", "m", "h")),
        QIColumn("c", QIKind.NOMINAL, ("p", "q", "r", "s")),
    ]
    return frame, columns


def test_identity_links_every_record_and_a_permutation_about_one_in_n() -> None:
    n = 3000
    original, columns = _random_mixed(n, 7)
    same = mixed_linkage(original, original, columns)
    assert same.share_linked == 1.0  # continuous x: no two records tie
    assert same.exact_key_linkage == 1.0

    perm = np.random.default_rng(8).permutation(n)
    shuffled = original.iloc[perm].reset_index(drop=True)
    result = mixed_linkage(original, shuffled, columns)
    fixed = int((perm == np.arange(n)).sum())
    assert result.share_linked == pytest.approx(fixed / n)  # linked exactly when π(i) = i
    se = math.sqrt((1 / n) * (1 - 1 / n) / n)
    assert abs(result.share_linked - 1 / n) <= 4 * se
    assert result.exact_key_linkage <= result.share_linked + 4 * se


def test_duplicate_originals_count_as_fractional_ties() -> None:
    original, columns = _random_mixed(200, 3)
    doubled = pd.concat([original, original.iloc[:50]], ignore_index=True)
    result = mixed_linkage(doubled, doubled, columns)
    # 100 records have one twin (credit 1/2 each), 150 are unique (credit 1)
    assert result.share_linked == pytest.approx((150 + 100 / 2) / 250)


def test_missing_rows_are_excluded_and_sampling_is_seeded() -> None:
    original, columns = _random_mixed(500, 11)
    published = original.copy()
    published.loc[[3, 17], "c"] = None
    published.loc[40, "x"] = np.nan
    result = mixed_linkage(original, published, columns)
    assert (result.excluded, result.evaluated) == (3, 497)
    assert result.share_linked == 1.0

    state = np.random.get_state()  # noqa: NPY002 (checked untouched)
    a = mixed_linkage(original, published, columns, max_records=100, seed=5)
    b = mixed_linkage(original, published, columns, max_records=100, seed=5)
    assert a == b
    assert a.evaluated == 100
    assert np.random.get_state()[1].tolist() == state[1].tolist()  # noqa: NPY002
    assert json.loads(json.dumps(a.to_dict()))["evaluated"] == 100


def test_original_scaling_reproduces_embed_and_applies_to_the_published_file() -> None:
    original, columns = _random_mixed(300, 4)
    scaling = MixedScaling.fit(columns, original)
    ours = scaling.transform(original)
    theirs = embed(columns, [original[c.name].tolist() for c in columns])

    def pairwise(e: np.ndarray) -> np.ndarray:  # type: ignore[type-arg]
        return ((e[:, None, :] - e[None, :, :]) ** 2).sum(axis=-1)

    np.testing.assert_allclose(pairwise(ours), pairwise(theirs), atol=1e-10)
    # the published file is measured with the original's yardstick, not its own
    shifted = original.assign(x=original["x"] + 1.0)
    moved = scaling.transform(shifted) - ours
    x_sd = float(original["x"].std(ddof=0))
    np.testing.assert_allclose(moved[:, 0], 1.0 / x_sd)
    np.testing.assert_allclose(moved[:, 1:], 0.0)


def test_linkage_input_errors_name_the_column_never_the_value() -> None:
    original, columns = _random_mixed(20, 1)
    published = original.copy()
    published["c"] = published["c"].astype(object)
    published.loc[2, "c"] = "SECRET-CATEGORY"
    with pytest.raises(InputDataError, match="'c'") as err:
        mixed_linkage(original, published, columns)
    assert "SECRET" not in str(err.value)
    published = original.assign(x=original["x"].astype(object))
    published.loc[0, "x"] = "SECRET-NUMBER"
    with pytest.raises(InputDataError, match="'x'") as err:
        mixed_linkage(original, published, columns)
    assert "SECRET" not in str(err.value)
    with pytest.raises(InputDataError, match="aligned"):
        mixed_linkage(original, original.iloc[:10], columns)
    with pytest.raises(InputDataError, match="'y'"):
        mixed_linkage(original, original.drop(columns="y"), columns)
    with pytest.raises(MechanismError, match="max_records"):
        mixed_linkage(original, original, columns, max_records=0)


# ---------------------------------------------------------------------------------------------
# Real data
# ---------------------------------------------------------------------------------------------


def test_adult_microaggregated_on_all_quasi_identifiers() -> None:
    adult = pd.read_csv(DATA / "adult.csv").head(3000)
    columns = [QIColumn(c, QIKind.NUMERIC) for c in NUM] + [
        QIColumn(c, QIKind.NOMINAL, tuple(sorted(adult[c].unique()))) for c in CAT
    ]
    before = key_risk(adult, NUM + CAT, 5, ["income"])
    assert before.smallest_class == 1  # the raw key is far from 5-anonymous

    values, _ = mixed_microaggregate(columns, [adult[c.name].tolist() for c in columns], 5)
    published = adult.copy()
    for c, v in zip(columns, values, strict=True):
        published[c.name] = v
    after = key_risk(published, NUM + CAT, 5, ["income"])
    assert after.smallest_class >= 5
    assert after.share_below_k == 0.0
    assert after.sample_uniques == 0

    same = mixed_linkage(adult, adult, columns)
    protected = mixed_linkage(adult, published, columns)
    assert protected.share_linked < same.share_linked - 4 * (
        protected.standard_error + same.standard_error
    )
    assert protected.exact_key_linkage < same.exact_key_linkage
