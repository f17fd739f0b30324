"""gateway.engine.records: a window's values as columns, the one shape the engine reads them in."""

from __future__ import annotations

import tracemalloc
from typing import Any
from unittest.mock import patch

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.engine import records
from gateway.engine.records import (
    ValidRecord,
    attribute_values,
    encode_rows,
    values_at,
    window_columns,
)

NAMES = ("age", "sex", "wave", "zip")
value_maps = st.lists(
    st.dictionaries(
        st.sampled_from(NAMES),
        st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3)),
    ),
    max_size=12,
)


def _records(maps: list[dict[str, Any]]) -> list[ValidRecord]:
    return [ValidRecord(f"r{i}", m, None, 0.0) for i, m in enumerate(maps)]


@given(value_maps)
def test_columns_agree_with_every_record_value_and_none_where_missing(
    maps: list[dict[str, Any]],
) -> None:
    columns = window_columns(_records(maps))
    present = {n for m in maps for n in m}
    assert set(columns) == present
    for name in NAMES:
        assert attribute_values(columns, len(maps), [name])[0] == [m.get(name) for m in maps]


@given(value_maps, st.data())
def test_values_at_positions_are_the_same_from_records_and_from_columns(
    maps: list[dict[str, Any]], data: st.DataObject
) -> None:
    records = _records(maps)
    positions = sorted(data.draw(st.sets(st.integers(0, max(len(maps) - 1, 0)))))
    positions = [p for p in positions if p < len(maps)]
    for name in (*NAMES, None):
        expected = [None if name is None else maps[i].get(name) for i in positions]
        assert values_at(records, None, name)(positions) == expected
        assert values_at(records, window_columns(records), name)(positions) == expected
        picked = attribute_values(window_columns(records), len(maps), [str(name)], positions)
        assert picked[0] == [maps[i].get(str(name)) for i in positions]


def test_uniform_records_keep_their_attribute_order() -> None:
    records = _records([{"zip": 1, "age": 30}, {"zip": 2, "age": 40}])
    assert list(window_columns(records).items()) == [("zip", [1, 2]), ("age", [30, 40])]


def test_a_record_missing_a_name_of_the_same_width_reads_as_none() -> None:
    # same number of values, different names: the plain-indexing path must not take it
    records = _records([{"age": 30, "sex": "F"}, {"age": 40, "zip": 9}])
    columns = window_columns(records)
    assert columns == {"age": [30, 40], "sex": ["F", None], "zip": [None, 9]}


_JSON_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e16, -2.5e300, 1e-7, 123456.0, "1e5", "x 2e+3"]),  # exponents, as text
    st.text(),
)


@given(
    # names given twice (a mapping keeps one) and names JSON writes with escapes included
    names=st.lists(
        st.one_of(st.text(min_size=1, max_size=12), st.sampled_from(["a", 'q"', "\\n"])),
        min_size=1,
        max_size=8,
    ),
    data=st.data(),
)
def test_published_records_are_orjson_s_bytes(names: list[str], data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 20))
    columns = [data.draw(st.lists(_JSON_VALUE, min_size=n, max_size=n)) for _ in names]
    rows = [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
    assert encode_rows(names, columns) == [orjson.dumps(r) for r in rows]


def test_published_records_are_written_in_bulk() -> None:
    """The usual window (no float with a positive exponent) never builds a mapping a row."""
    names = ["record_id", "age", "sex", "weight", "é"]
    columns = [["1-a", "1-b"], [37.5, 41.0], ["Female", None], [290805.0, 1.0], [True, 3]]
    want = [orjson.dumps(dict(zip(names, row, strict=True))) for row in zip(*columns, strict=True)]
    with patch.object(records, "output_rows", side_effect=AssertionError("a mapping a row")):
        assert encode_rows(names, columns) == want


def test_published_records_hold_no_more_memory_than_their_bytes() -> None:
    """Published records are held until the broker acknowledges them: each must cost its
    length, not the encoder's buffer (orjson.dumps's result holds about 8 KiB)."""
    names = [f"attribute_{i}" for i in range(20)]
    columns = [[f"value {i} of {j}" for i in range(2000)] for j in range(20)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        encoded = encode_rows(names, columns)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    payload = sum(map(len, encoded))
    assert held < 1.25 * payload + 64 * len(encoded) + 65536, (held, payload)
