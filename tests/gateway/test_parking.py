"""Waves set aside until they close (gateway.grouping.parking): what the parking remembers of
the records it set aside agrees with the records, however the windows come."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.engine.records import SourceRef, ValidRecord, record_ids_at, window_id, window_id_from
from gateway.grouping.parking import Parking
from gateway.grouping.release import ReleaseClock

windows = st.lists(
    st.tuples(
        st.lists(st.integers(1, 4), max_size=12),  # the new records' waves
        st.booleans(),  # a revocation drops the first record handed back
        st.booleans(),  # the last flush
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(windows)
def test_the_ids_of_parked_records_are_theirs_and_give_the_windows_id(
    steps: list[tuple[list[int], bool, bool]],
) -> None:
    parking, clock = Parking(max_hold_seconds=30.0), ReleaseClock()
    held: list[ValidRecord] = []
    offset = 0
    for waves, drop, flush_all in steps:
        new = [
            ValidRecord(None, {"wave": w}, SourceRef("in", 0, offset + j), 0.0)
            for j, w in enumerate(waves)
        ]
        offset += len(new)
        records = [*(held[1:] if drop else held), *new]

        def rids_at(positions: object, records: list[ValidRecord] = records) -> list[str]:
            return record_ids_at(records, positions)  # type: ignore[arg-type]

        def releases_at(positions: object, records: list[ValidRecord] = records) -> list[str]:
            return [str(records[i].values["wave"]) for i in positions]  # type: ignore[attr-defined]

        parked = parking.split(
            records,
            lambda fresh: ([0.0] * len(fresh), [("in", 0)] * len(fresh), [None] * len(fresh)),
            rids_at,
            releases_at,
            clock,
            now=1.0,
            flush_all=flush_all,
        )
        assert parking.rids == record_ids_at(records, parked)
        active = [i for i in range(len(records)) if i not in set(parked)]
        parts = [(parked, parking.rids), (active, record_ids_at(records, active))]
        assert window_id_from(records, parts) == window_id(records)
        held = [records[i] for i in parked]
        if flush_all:
            assert not parked


def test_a_window_without_input_positions_keeps_its_id() -> None:
    records = [ValidRecord(None, {}, None, 0.0), ValidRecord(None, {}, SourceRef("in", 0, 7), 0.0)]
    parts = [([0, 1], record_ids_at(records, [0, 1]))]
    assert window_id_from(records, parts) == window_id(records)
