"""Our windows: when they flush, what they hold, which offsets they let the worker commit."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.engine.records import SourceRef, ValidRecord
from gateway.policy import HoldTimeout, Policy, WindowSpec, load_policy
from stream_jobs.windows.windows import FlushReason, WindowBuffer

ADULT = Path(__file__).resolve().parents[2] / "deploy" / "policies" / "adult.yaml"

SPEC = WindowSpec(
    max_records=3, max_seconds=5.0, max_hold_seconds=20.0, on_hold_timeout=HoldTimeout.SUPPRESS
)


def rec(offset: int, at: float, partition: int = 0) -> ValidRecord:
    return ValidRecord(f"r{offset}", {}, SourceRef("in", partition, offset), at)


def test_count_flush_and_next_offset_commit() -> None:
    buf = WindowBuffer(SPEC)
    for i in range(2):
        buf.add(rec(i, 0.0))
    assert buf.due(0.1) is None
    buf.add(rec(2, 0.2))
    assert buf.due(0.2) is FlushReason.COUNT
    flush = buf.take(FlushReason.COUNT)
    assert [r.source.offset for r in flush.records if r.source] == [0, 1, 2]
    assert buf.complete(flush, held=()) == {("in", 0): 3}


def test_timer_flush_without_new_records() -> None:
    buf = WindowBuffer(SPEC)
    buf.add(rec(0, 10.0))
    assert buf.deadline() == 15.0
    assert buf.due(14.9) is None
    assert buf.due(15.0) is FlushReason.TIME


def test_a_drained_input_closes_the_window_once_quiet_for_max_idle_seconds() -> None:
    spec = SPEC.model_copy(update={"max_idle_seconds": 0.5})
    buf = WindowBuffer(spec)
    assert buf.deadline() is None
    buf.add(rec(0, 10.0))
    buf.add(rec(1, 10.2))
    assert buf.deadline() == 10.7  # the idle deadline comes before max_seconds' 15.0
    assert buf.due(10.6, quiet=True) is None  # quiet, not yet for long enough
    # records still came in (a fetch returned some): not idle, however long since the last
    assert buf.due(12.0, quiet=False) is None
    assert buf.due(10.7, quiet=True) is FlushReason.IDLE
    flush = buf.take(FlushReason.IDLE)
    buf.complete(flush, held=[flush.records[0]])
    # held records alone are no window to close early: they wait for new ones or their time
    assert buf.due(30.0, quiet=True) is FlushReason.HOLD_TIMEOUT
    assert buf.due(29.0, quiet=True) is None
    # without the setting a drained input waits for the window's time
    plain = WindowBuffer(SPEC)
    plain.add(rec(0, 10.0))
    assert plain.due(14.0, quiet=True) is None
    assert plain.deadline() == 15.0


def test_max_idle_seconds_must_fit_in_the_window() -> None:
    with pytest.raises(ValueError, match=r"max_idle_seconds must be > 0 and ≤ window\.max_seconds"):
        SPEC.model_validate({**SPEC.model_dump(), "max_idle_seconds": 6.0})


def test_held_records_block_commits_and_expire_into_a_hold_timeout_flush() -> None:
    buf = WindowBuffer(SPEC)
    for i in range(3):
        buf.add(rec(i, 0.0))
    flush = buf.take(FlushReason.COUNT)
    held = [flush.records[1]]
    # offset 1 is still held: commit up to it, not past it
    assert buf.complete(flush, held) == {("in", 0): 1}
    buf.committed({("in", 0): 1})
    assert buf.due(19.9) is None
    assert buf.deadline() == 20.0
    assert buf.due(20.0) is FlushReason.HOLD_TIMEOUT
    again = buf.take(FlushReason.HOLD_TIMEOUT)
    assert again.records == held
    assert buf.complete(again, held=()) == {("in", 0): 3}


def test_hold_policy_never_expires_held_records() -> None:
    spec = WindowSpec(
        max_records=3, max_seconds=5.0, max_hold_seconds=1.0, on_hold_timeout=HoldTimeout.HOLD
    )
    buf = WindowBuffer(spec)
    buf.add(rec(0, 0.0))
    flush = buf.take(FlushReason.TIME)
    buf.complete(flush, held=list(flush.records))
    assert buf.deadline() is None
    assert buf.due(1e9) is None


# what the engine hands back held of a window's records at a time
Holds = Callable[[Sequence[ValidRecord], float], list[ValidRecord]]


def _run(
    buf: WindowBuffer, holds: Holds, until: float, arrivals: dict[float, int] | None = None
) -> list[tuple[float, FlushReason]]:
    """The worker's loop over simulated time, every 10 ms from 0 to ``until``, the input
    drained between ``arrivals`` (time -> new records then): each window due is taken and
    handed to the engine at once (``holds``). Returns each engine call's time and reason."""
    calls: list[tuple[float, FlushReason]] = []
    offset = 100
    for step in range(int(until * 100) + 1):
        now = step / 100
        for _ in range((arrivals or {}).get(now, 0)):
            buf.add(rec(offset, now))
            offset += 1
        reason = buf.due(now, quiet=True)
        if reason is not None:
            flush = buf.take(reason, now)
            calls.append((now, reason))
            buf.complete(flush, holds(flush.records, now))
    return calls


def _open_wave(records: Sequence[ValidRecord], now: float) -> list[ValidRecord]:
    return list(records)  # a panel's open wave: every record set aside, undecided


def test_an_open_panel_wave_past_the_hold_time_is_not_handed_over_again_and_again() -> None:
    """The shipped panel policy (max_hold_seconds 30, on_hold_timeout: suppress): the engine
    hands an open wave back held whatever its age (the hold timeout never decides a panel
    wave), so the hold time is no reason to hand it over again — that made a busy loop of ~70
    windows a second for as long as the wave stayed open. It goes to the engine again when
    new records come, and once the input has been quiet for the close grace."""
    policy: Policy = load_policy(ADULT)
    assert policy.window.max_hold_seconds == 30 and policy.window.max_idle_seconds == 0.25
    assert policy.republication.close_grace == 10
    buf = WindowBuffer.for_policy(policy)
    for i in range(5):
        buf.add(rec(i, 0.0))
    calls = _run(buf, _open_wave, 300.0, arrivals={100.0: 3})
    # the records' idle window, the input quiet for the close grace; the same after 100 s
    assert calls == [
        (0.25, FlushReason.IDLE),
        (10.0, FlushReason.WAVE),
        (100.25, FlushReason.IDLE),
        (110.0, FlushReason.WAVE),
    ]
    assert len(buf.held) == 8 and buf.due(300.0, quiet=True) is None
    assert buf.deadline() == 604800.0  # the oldest record's wave maximum
    assert buf.due(604800.0, quiet=True) is FlushReason.WAVE


def test_a_panel_wave_is_handed_over_at_its_maximum_once() -> None:
    """A panel wave closes at republication.max_wave_seconds after its first record, also
    with on_hold_timeout: hold; an engine that still holds it then is not asked again."""
    policy = load_policy(ADULT)
    rep = policy.republication.model_copy(update={"max_wave_seconds": 60.0})
    window = policy.window.model_copy(update={"on_hold_timeout": HoldTimeout.HOLD})
    held_on_timeout = policy.model_copy(update={"republication": rep, "window": window})
    buf = WindowBuffer.for_policy(held_on_timeout)
    buf.add(rec(0, 1.0))

    def until_its_maximum(records: Sequence[ValidRecord], now: float) -> list[ValidRecord]:
        return [r for r in records if now - r.arrived_at < 60.0]

    assert _run(buf, until_its_maximum, 200.0) == [
        (1.25, FlushReason.IDLE),
        (11.0, FlushReason.WAVE),
        (61.0, FlushReason.WAVE),
    ]
    assert buf.held == []
    stuck = WindowBuffer.for_policy(policy.model_copy(update={"republication": rep}))
    stuck.add(rec(0, 1.0))
    assert [at for at, _ in _run(stuck, _open_wave, 200.0)] == [1.25, 11.0, 61.0]


def test_the_hold_timeout_still_decides_held_records_outside_a_panel() -> None:
    """regroup and the other modes: a held record is handed over at its hold time, and the
    engine decides it then (suppressed); one it hands back held anyway is not asked again."""
    spec = SPEC.model_copy(update={"max_idle_seconds": 0.25})

    def until_their_hold(records: Sequence[ValidRecord], now: float) -> list[ValidRecord]:
        return [r for r in records if now - r.arrived_at < spec.max_hold_seconds]

    buf = WindowBuffer(spec)
    buf.add(rec(0, 0.0))
    buf.add(rec(1, 0.0))
    assert _run(buf, until_their_hold, 100.0, arrivals={5.0: 1}) == [
        (0.25, FlushReason.IDLE),
        (5.25, FlushReason.IDLE),
        (20.0, FlushReason.HOLD_TIMEOUT),
        (25.0, FlushReason.HOLD_TIMEOUT),
    ]
    stuck = WindowBuffer(spec)
    stuck.add(rec(0, 0.0))
    assert _run(stuck, _open_wave, 100.0) == [
        (0.25, FlushReason.IDLE),
        (20.0, FlushReason.HOLD_TIMEOUT),
    ]


def test_decided_runs_past_the_held_records_that_keep_the_commit_back() -> None:
    """The consumer lag's split (stream_jobs.ops.monitor): offsets between the commit and
    ``decided`` wait only because a record is held on purpose; a revoked or rewound partition
    forgets it."""
    buf = WindowBuffer(SPEC)
    for i in range(3):
        buf.add(rec(i, 0.0))
    flush = buf.take(FlushReason.COUNT)
    assert buf.decided() == {}  # taken is not decided: the window is in the engine
    assert buf.complete(flush, [flush.records[0]]) == {("in", 0): 0}  # offset 0 held
    assert buf.decided() == {("in", 0): 3}
    buf.add(rec(3, 1.0))
    assert buf.decided() == {("in", 0): 3}  # consumed, not decided
    assert buf.rewind(("in", 0), 0) and buf.decided() == {}
    buf.add(rec(0, 2.0, partition=1))
    buf.complete(buf.take(FlushReason.TIME), held=())
    assert buf.decided() == {("in", 0): 0, ("in", 1): 1}  # partition 0 from its new start
    buf.forget([("in", 1)])
    assert buf.decided() == {("in", 0): 0}


def test_revocation_hands_over_held_and_unflushed_records() -> None:
    buf = WindowBuffer(SPEC)
    buf.add(rec(0, 0.0, partition=0))
    buf.add(rec(0, 0.0, partition=1))
    flush = buf.take(FlushReason.TIME)
    buf.complete(flush, held=list(flush.records))
    buf.add(rec(1, 1.0, partition=1))
    assert buf.forget([("in", 1)]) == 2
    assert [(r.source.partition if r.source else -1) for r in buf.held] == [0]
    assert buf.new == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 6), st.sets(st.integers(0, 40))),
        min_size=1,
        max_size=12,
    )
)
def test_commits_never_pass_an_unpublished_record_and_never_go_back(
    steps: list[tuple[int, int, set[int]]],
) -> None:
    """Random interleavings of arrivals and flushes, the engine holding arbitrary records:
    a committed offset never exceeds the oldest record still held or not yet flushed on its
    partition, and per partition commits only increase. Every flushed record is decided:
    ``decided`` is the next offset, never below a commit (the lag behind it is not held)."""
    buf = WindowBuffer(SPEC)
    next_offset = [0, 0, 0]
    committed: dict[tuple[str, int], int] = {}
    unpublished: dict[tuple[str, int], set[int]] = {("in", p): set() for p in range(3)}
    for step, (partition, count, hold_pick) in enumerate(steps):
        batch = []
        for _ in range(count):
            o = next_offset[partition]
            next_offset[partition] += 1
            batch.append(rec(o, 0.0, partition))
            unpublished[("in", partition)].add(o)
        if step % 2:  # the worker's way, one fetched batch of a partition at once
            buf.add_partition_batch(batch)
        else:
            for r in batch:
                buf.add(r)
        flush = buf.take(FlushReason.COUNT)
        held = [r for i, r in enumerate(flush.records) if i in hold_pick]
        for r in flush.records:
            if r not in held and r.source is not None:
                unpublished[(r.source.topic, r.source.partition)].discard(r.source.offset)
        commits = buf.complete(flush, held)
        for tp, offset in commits.items():
            assert offset > committed.get(tp, -1)
            oldest = min(unpublished[tp], default=next_offset[tp[1]])
            assert offset <= oldest
            committed[tp] = offset
        buf.committed(commits)
        decided = buf.decided()
        assert decided[("in", partition)] == next_offset[partition]
        assert all(decided[tp] >= offset for tp, offset in committed.items())


def test_a_log_that_restarts_below_consumed_offsets_is_rewound() -> None:
    """A broker that lost its log gives offsets from 0 again: commits start again from there,
    and a window taken before the loss does not commit its (now meaningless) old position."""
    buf = WindowBuffer(SPEC)
    for i in range(100, 103):
        buf.add(rec(i, 0.0))
    old = buf.take(FlushReason.COUNT)
    assert buf.position(("in", 0)) == 103
    assert not buf.rewind(("in", 0), 103)  # not below: nothing to do
    assert buf.rewind(("in", 0), 0)
    assert buf.complete(old, held=()) == {}  # 103 is beyond the new log
    for i in range(3):
        buf.add(rec(i, 1.0))
    assert buf.complete(buf.take(FlushReason.COUNT), held=()) == {("in", 0): 3}


@settings(max_examples=60, deadline=None)
@given(offsets=st.lists(st.integers(0, 5), min_size=0, max_size=8), start=st.integers(0, 50))
def test_a_partition_batch_is_its_records_added_one_by_one(offsets: list[int], start: int) -> None:
    steps = [start + sum(offsets[: i + 1]) + i for i in range(len(offsets))]  # increasing
    one, batch = WindowBuffer(SPEC), WindowBuffer(SPEC)
    records = [rec(o, 1.0 + i, partition=1) for i, o in enumerate(steps)]
    for r in records:
        one.add(r)
    batch.add_partition_batch(records)
    assert (one.new, one.opened_at, one.position(("in", 1))) == (
        batch.new,
        batch.opened_at,
        batch.position(("in", 1)),
    )


def test_a_wave_read_again_is_handed_over_when_its_own_timestamps_say_it_closes() -> None:
    """After a restart the engine dates an open wave by its records' own timestamps; the
    buffer only knew their arrival, so a wave 95 s into a 100 s maximum waited 100 s more for
    its hand-over (the stream test passed only on a machine slow enough to start late)."""
    policy = load_policy(ADULT)
    rep = policy.republication.model_copy(update={"max_wave_seconds": 100.0})
    buf = WindowBuffer.for_policy(policy.model_copy(update={"republication": rep}))
    k = policy.microaggregation.k
    # the records' clock runs 1,000,000 s ahead of the worker's; stamped 95 s before arrival
    stamped = [
        ValidRecord(f"r{i}", {}, SourceRef("in", 0, i, (1_000_000 + 10 - 95) * 1000), 10.0)
        for i in range(k)
    ]
    for r in stamped:
        buf.add(r)
    flush = buf.take(FlushReason.IDLE, 10.0)
    buf.complete(flush, stamped, wall_offset=1_000_000.0)
    assert buf.deadline() == pytest.approx(15.0)  # 100 s after the k-th stamp, not after 10.0
    assert buf.due(15.0) is FlushReason.WAVE
    buf.complete(buf.take(FlushReason.WAVE, 15.0), stamped, wall_offset=1_000_000.0)
    assert buf.deadline() == pytest.approx(20.0)  # seen: the input's quiet, then its maximum
