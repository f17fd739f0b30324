"""gateway.engine.records: a window's values as columns, the one shape the engine reads them in."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gateway.engine.records import ValidRecord, attribute_values, values_at, window_columns

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
