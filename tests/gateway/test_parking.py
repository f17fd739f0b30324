"""Waves set aside until they close (gateway.grouping.parking): what the parking remembers of
the records it set aside agrees with the records, however the windows come."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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


def _rids_at(records: list[ValidRecord]) -> Callable[[Sequence[int]], list[str]]:
    """The parking's ``rids_at`` over a window's records."""
    return lambda positions: record_ids_at(records, positions)


def _releases_at(records: list[ValidRecord]) -> Callable[[Sequence[int]], list[str]]:
    """The parking's ``releases_at``: each record's wave as its release key."""
    return lambda positions: [str(records[i].values["wave"]) for i in positions]


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

        parked = parking.split(
            records,
            lambda fresh: ([0.0] * len(fresh), [("in", 0)] * len(fresh), [None] * len(fresh)),
            _rids_at(records),
            _releases_at(records),
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


_ARRIVALS = st.floats(0.0, 60.0)  # the worker's monotonic clock: always known
waves_timed = st.lists(
    st.tuples(
        # the new records: their release (a wave, or a window's id) and arrival time
        st.lists(st.tuples(st.sampled_from(["1", "2", "3", "w-x"]), _ARRIVALS), max_size=10),
        st.booleans(),  # a revocation drops the first record handed back
        st.floats(0.0, 40.0),  # how far the clock moves on
        st.booleans(),  # the last flush
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(waves_timed)
def test_the_records_parked_are_those_of_waves_not_due(
    steps: list[tuple[list[tuple[str, float]], bool, float, bool]],
) -> None:
    """A wave waits from its earliest known arrival among the window's records; it is due when
    closed, past its hold, or flushed. Its records are parked until then; a window's own
    release never waits."""
    hold = 30.0
    parking, clock = Parking(max_hold_seconds=hold), ReleaseClock()
    held: list[ValidRecord] = []
    offset, now = 0, 0.0
    for new_records, drop, later, flush_all in steps:
        now += later
        new = [
            ValidRecord(None, {"wave": r}, SourceRef("in", 0, offset + j), at)
            for j, (r, at) in enumerate(new_records)
        ]
        offset += len(new)
        records = [*(held[1:] if drop else held), *new]

        def origins(fresh: range, records: list[ValidRecord] = records) -> Any:
            at = [records[i].arrived_at for i in fresh]
            return at, [("in", 0)] * len(fresh), [None] * len(fresh)

        parked = parking.split(
            records,
            origins,
            _rids_at(records),
            _releases_at(records),
            clock,
            now=now,
            flush_all=flush_all,
        )
        oldest: dict[str, float] = {}
        for r in records:
            w, at = str(r.values["wave"]), r.arrived_at
            if w.isdigit():
                oldest[w] = min(at, oldest.get(w, at))
        due = {
            w for w, at in oldest.items() if flush_all or now - at >= hold or clock.closed(w, now)
        }
        waiting = set(oldest) - due
        assert parked == [i for i, r in enumerate(records) if r.values["wave"] in waiting]
        held = [records[i] for i in parked]
