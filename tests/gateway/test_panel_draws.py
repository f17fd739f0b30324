"""A panel's sticky draws as columns (gateway/panel/draws.py): a table answers and stores as
the respondents' maps of value digests did (the last publication stored for a pair is the one
found, a float stays the float it was, -0.0 included), keeps that through its bytes, and a
window over several scopes finds and stores each respondent's draws in its own scope's table."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.panel.draws import DrawTable, TableView, drop_draws

KEYS = [bytes([i]) * 32 for i in range(6)]
DIGESTS = [
    (bytes([100 + i]) * 15 + bytes([i]), (bytes([100 + i]) * 15 + bytes([i])).hex())
    for i in range(5)
]
PUBLICATIONS = st.one_of(
    st.none(),
    st.sampled_from([0.0, -0.0, 1.0, 1, "a", "b"]),
    st.floats(allow_nan=False, width=64),
    st.lists(st.sampled_from(["<=50K", ">50K", "v1", "v2"]), min_size=2, max_size=2),
)
KEY = st.one_of(st.none(), st.sampled_from(KEYS))
PUT = st.tuples(
    st.sampled_from(["rr", "noise"]),
    st.sampled_from(["a", "b"]),
    st.lists(st.tuples(KEY, st.sampled_from(DIGESTS), PUBLICATIONS), max_size=12),
)


def _same(a: Any, b: Any) -> bool:
    """Equal as published: the same type and text (-0.0 is not 0.0, 1 is not 1.0)."""
    return type(a) is type(b) and repr(a) == repr(b)


def _found(table: DrawTable, kind: str, name: str, queries: list[Any]) -> list[Any]:
    keys = [k for k, _ in queries]
    return table.found(kind, name, table.ids(keys), [d for _, d in queries])


@given(st.lists(PUT, max_size=8), st.lists(st.tuples(KEY, st.sampled_from(DIGESTS)), max_size=20))
@settings(max_examples=300, deadline=None)
def test_a_table_finds_what_a_map_of_the_last_publications_would(
    puts: list[tuple[str, str, list[tuple[bytes | None, tuple[bytes, str], Any]]]],
    queries: list[tuple[bytes | None, tuple[bytes, str]]],
) -> None:
    table = DrawTable()
    model: dict[tuple[str, str, bytes, bytes], Any] = {}
    for kind, name, rows in puts:
        table.put(
            kind, name, [k for k, _, _ in rows], [d for _, d, _ in rows], [v for *_, v in rows]
        )
        for key, digest, value in rows:
            if key is not None:  # a record without a respondent keeps nothing
                model[(kind, name, key, digest[0])] = value
    again = DrawTable.from_doc(msgspec.msgpack.decode(msgspec.msgpack.encode(table.to_doc())))
    assert again == table
    for kind in ("rr", "noise"):
        for name in ("a", "b"):
            want = [model.get((kind, name, k, d[0])) if k is not None else None for k, d in queries]
            for got in (_found(table, kind, name, queries), _found(again, kind, name, queries)):
                assert len(got) == len(want)
                assert all(_same(g, w) for g, w in zip(got, want, strict=True)), (got, want)
    entries = {(k, n, key, d): v for k, n, key, d, v in table.entries()}
    assert entries.keys() == model.keys()
    assert all(_same(entries[p], model[p]) for p in model)


def test_a_policy_upgrade_drops_an_attributes_draws_from_the_table_and_its_bytes() -> None:
    table = DrawTable()
    table.put("rr", "a", KEYS[:3], DIGESTS[:3], [["x", "v"]] * 3)
    table.put("noise", "b", KEYS[:2], DIGESTS[:2], [1.0, 2.0])
    doc = {"draws": table.to_doc()}
    assert drop_draws(doc, ["a"]) == {"a": 3}
    assert DrawTable.from_doc(doc["draws"]).columns.keys() == {("noise", "b")}
    assert table.drop(["b", "c"]) == {"b": 2}
    assert table.columns.keys() == {("rr", "a")}


def test_keys_and_digests_of_another_length_are_refused() -> None:
    table = DrawTable()
    table.put("rr", "a", KEYS[:1], DIGESTS[:1], [1.0])
    with pytest.raises(ValueError, match="keys are 32 bytes, got 3"):
        table.put("rr", "a", [b"abc"], DIGESTS[:1], [1.0])
    with pytest.raises(ValueError, match="digest must be 16 bytes"):
        table.put("rr", "a", KEYS[:1], [(b"short", "73686f7274")], [1.0])


def test_a_window_over_two_scopes_keeps_each_respondents_draws_in_its_scopes_table() -> None:
    tables = {0: DrawTable(), 1: DrawTable()}
    scope_of: dict[bytes, int | None] = {k: i % 2 for i, k in enumerate(KEYS)}
    view = TableView(states={}, sticky=True, tables=tables, scope_of=scope_of)
    keys: list[bytes | None] = [*KEYS, None]
    digests = [DIGESTS[i % 5] for i in range(len(keys))]
    view.keep_drawn(
        "rr", "a", keys=keys, digests=digests, fresh=[0, 1, 2, 6], drawn=["x", "y", "z", "w"],
        version="v1",
    )  # fmt: skip
    assert [k for _, _, k, _, _ in tables[0].entries()] == [KEYS[0], KEYS[2]]
    assert [k for _, _, k, _, _ in tables[1].entries()] == [KEYS[1]]
    found = view.lookup(keys).found("rr", "a", digests)
    assert found == [["x", "v1"], ["y", "v1"], ["z", "v1"], None, None, None, None]
    # a respondent met after the look-up was made (a fresh draw of another attribute)
    lookup = view.lookup(keys)
    view.keep_drawn("noise", "b", keys=keys, digests=digests, fresh=[4], drawn=[3.5])
    assert lookup.found("noise", "b", digests) == [None, None, None, None, 3.5, None, None]


def test_numbers_beyond_an_int64_pair_are_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pair holds a respondent's and a digest's number in one int64: past 2^31 - 1 of either
    (here a limit of 3, for the test) the table refuses, naming what to do."""
    from gateway.panel import draws  # noqa: PLC0415

    monkeypatch.setattr(draws, "_MAX_NUMBER", 3)
    table = DrawTable()
    table.put("rr", "a", KEYS[:3], DIGESTS[:3], [1.0] * 3)
    with pytest.raises(ValueError, match="at most 3 respondents: partition the state"):
        table.put("rr", "a", KEYS[3:5], DIGESTS[:2], [1.0] * 2)
    with pytest.raises(ValueError, match="at most 3 values"):
        table.put("rr", "a", KEYS[:1], DIGESTS[3:4], [1.0])
    assert len(table.keys) == 3 and len(list(table.entries())) == 3
