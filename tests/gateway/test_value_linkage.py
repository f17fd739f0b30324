"""Published values that link releases by themselves (issue 29, item 4): the value-linkage
measure, and noised amounts rounded to a reporting step without breaking stickiness."""

from __future__ import annotations

import math
from collections.abc import Hashable
from itertools import pairwise

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.attack import unique_combinations, value_keys, value_linkage

# -- the measure ---------------------------------------------------------------------------


def test_value_linkage_on_hand_made_histories() -> None:
    # a's value is unique in both releases (linked, right); b and c share 2 in release 0
    # (not unique); d's 4 is unique in release 0 but published twice in release 1; e is
    # absent from release 1 and its unique 5 meets f's 5 there (linked, wrong)
    r0 = {"a": (1,), "b": (2,), "c": (2,), "d": (4,), "e": (5,)}
    r1 = {"a": (1,), "b": (2,), "c": (3,), "d": (4,), "g": (4,), "f": (5,)}
    pair = value_linkage([r0, r1]).pairs[0]
    assert (pair.records, pair.later_records, pair.unique) == (5, 6, 3)
    assert (pair.linked, pair.correct) == (2, 1)
    assert pair.share == 2 / 5 and pair.share_of_later == 2 / 6 and pair.precision == 0.5
    # None is a value like any other; three releases give two pairs and their totals
    r2 = {"a": (None,), "c": (3,)}
    res = value_linkage([r0, r1, r2])
    assert [p.linked for p in res.pairs] == [2, 1] and [p.correct for p in res.pairs] == [1, 1]
    assert (res.records, res.linked, res.correct) == (11, 3, 2)
    assert res.share == 3 / 11 and res.precision == 2 / 3
    # nothing to link: no pair, or no unique combination
    assert value_linkage([r0]).pairs == () and value_linkage([]).share == 0.0
    assert math.isnan(value_linkage([{"a": 1, "b": 1}, {"a": 1, "b": 1}]).precision)


def test_value_keys_take_the_named_attributes_in_order() -> None:
    release = {"a": {"x": 1.0, "y": "p", "z": 9}, "b": {"x": None, "y": "q"}}
    assert value_keys(release, ["y", "x"]) == {"a": ("p", 1.0), "b": ("q", None)}
    assert value_keys(release, ["z"]) == {"a": (9,), "b": (None,)}


def _reference(releases: list[dict[str, Hashable]]) -> list[tuple[int, int, int]]:
    """(unique, linked, correct) per pair, the slow way: count every match by hand."""
    out = []
    for here, there in pairwise(releases):
        unique = linked = correct = 0
        for rid, key in here.items():
            if sum(1 for k in here.values() if k == key) != 1:
                continue
            unique += 1
            matches = [r for r, k in there.items() if k == key]
            if len(matches) == 1:
                linked += 1
                correct += matches[0] == rid
        out.append((unique, linked, correct))
    return out


histories = st.lists(
    st.dictionaries(
        st.sampled_from([f"r{i}" for i in range(12)]),
        st.tuples(st.integers(0, 5), st.one_of(st.none(), st.sampled_from("ab"))),
        max_size=12,
    ),
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(releases=histories, perm_seed=st.integers(0, 2**16))
def test_value_linkage_agrees_with_counting_by_hand(
    releases: list[dict[str, Hashable]], perm_seed: int
) -> None:
    res = value_linkage(releases)
    assert [(p.unique, p.linked, p.correct) for p in res.pairs] == _reference(releases)
    for p in res.pairs:
        assert 0 <= p.correct <= p.linked <= p.unique <= p.records
        assert p.linked <= p.later_records
    # a combination once in each release: the same links read backwards
    backwards = value_linkage(releases[::-1])
    assert [p.linked for p in backwards.pairs] == [p.linked for p in res.pairs][::-1]
    # the adversary does not see who is who: renaming respondents changes nothing
    names = [f"r{i}" for i in range(12)]
    renamed = dict(zip(names, np.random.default_rng(perm_seed).permutation(names), strict=True))
    again = value_linkage([{renamed[r]: k for r, k in rel.items()} for rel in releases])
    assert again == res
    # a coarser publication never makes more records unique in a release
    coarse = value_linkage([{r: (k[0] // 2, k[1]) for r, k in rel.items()} for rel in releases])
    assert all(c.unique <= p.unique for c, p in zip(coarse.pairs, res.pairs, strict=True))


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 4), st.sampled_from("ab")), max_size=30))
def test_unique_combinations_counts_the_records_alone(rows: list[tuple[int, str]]) -> None:
    columns = [[r[0] for r in rows], [r[1] for r in rows]]
    assert unique_combinations(columns) == sum(1 for r in rows if rows.count(r) == 1)
