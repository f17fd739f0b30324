"""A wave closes once a later wave is seen and no partition still sending lags behind it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.engine.engine import Engine
from gateway.engine.records import InputMarks, SourceRef, ValidRecord
from gateway.grouping.release import ReleaseClock
from gateway.keyed.keyed import Keyring
from gateway.policy import Policy, load_policy, parse_policy
from gateway.validation import Validator
from state.memory_store import MemoryStore
from state.sqlite_store import SQLiteStore
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

ROOT = Path(__file__).resolve().parents[2]
P0, P1 = ("in", 0), ("in", 1)


def test_without_sources_the_newest_wave_alone_closes_the_older_ones() -> None:
    clock = ReleaseClock(quiet_after=2.0)
    clock.see(["1", "1", "2"])
    assert clock.closed("1") and clock.closed("1", now=0.0)
    assert not clock.closed("2") and not clock.closed("w-window")


def test_a_partition_still_sending_a_wave_keeps_it_open_until_it_moves_on_or_goes_quiet() -> None:
    clock = ReleaseClock(quiet_after=2.0)
    clock.see(["1", "1"], [P0, P1], [0.0, 0.0])
    clock.see(["2", "1"], [P0, P1], [0.5, 0.5])
    assert not clock.closed("1", now=0.6)  # partition 1 is still on wave 1
    assert clock.closed("1")  # (the one watermark of before)
    assert clock.closed("1", now=2.5)  # partition 1 quiet for 2 s: it holds nothing back
    clock.see(["2"], [P1], [0.7])
    assert clock.closed("1", now=0.8)
    assert not clock.closed("2", now=10.0)


def test_a_record_without_an_event_time_takes_no_part_in_the_close_graces_span() -> None:
    """Its arrival (the worker's monotonic clock) stood in for its event time beside stamped
    records (epoch seconds): the next wave's span was decades long, and the grace passed at
    once. Now the grace runs on the worker's clock, or on the stamped records' own span."""
    stamp = 1_800_000_000.0
    clock = ReleaseClock(quiet_after=2.0)
    clock.see(["1", "1", "1"], [P0, P0, P0], [0.0, 0.0, 0.0], [stamp, stamp, stamp])
    clock.see(["2", "2"], [P0, P0], [1.0, 1.0], [None, stamp + 1])
    assert clock.closed("1", now=1.5)
    assert not clock.closed_after("1", 1.5, grace=10.0)
    assert clock.closed_after("1", 11.0, grace=10.0)  # the worker's clock
    clock.see(["2"], [P0], [2.0], [stamp + 12])
    assert clock.closed_after("1", 2.5, grace=10.0)  # the records' own span: 11 s


def test_fewer_than_k_records_with_a_clock_far_off_do_not_pass_the_close_grace() -> None:
    """The grace's event-time span runs from the next wave's k-th earliest to its k-th latest
    record: one producer whose clock is an hour ahead no longer closed the open wave at once
    (its members' answers still in flight were imputed); k such records are a clock, not a
    stray."""
    k, stamp = 3, 1_800_000_000.0

    def clock_with(ahead: int) -> ReleaseClock:
        clock = ReleaseClock(quiet_after=2.0, min_records=k)
        clock.see(["1"] * k, [P0] * k, [0.0] * k, [stamp] * k, _at(["a", "b", "c"]))
        times = [stamp + 1 + i for i in range(6)] + [stamp + 3600] * ahead
        n = len(times)
        rids = [f"r{i}" for i in range(n)]
        clock.see(["2"] * n, [P0] * n, [1.0] * n, times, _at(rids))
        assert clock.closed("1", now=1.5)
        return clock

    assert not clock_with(k - 1).closed_after("1", 1.5, grace=10.0)
    assert clock_with(k - 1).closed_after("1", 11.5, grace=10.0)  # the worker's clock
    assert clock_with(k).closed_after("1", 1.5, grace=10.0)


Answer = tuple[str | None, dict[str, object]]


def _panel(**survey: object) -> tuple[list[Answer], list[int]]:
    """The simulated panel's records, validated (60 respondents, 2 waves unless ``survey``
    says otherwise), and each one's wave."""
    policy = load_policy(ROOT / "deploy" / "policies" / "adult.yaml")
    validator = Validator(policy)
    settings: dict[str, Any] = {"respondents": 60, "waves": 2, "seed": 2, **survey}
    rows = list(PanelSurvey(**settings, rows=load_rows()).records())
    answers = [validator.decode_and_validate(*reversed(encode(row))) for row in rows]
    return answers, [int(row["wave"]) for row in rows]


class _Inputs:
    """Records as the worker hands them to the engine: each input partition's offsets run on."""

    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}

    def on(self, partition: int, batch: list[Answer], at: float) -> list[ValidRecord]:
        out = []
        for rid, values in batch:
            offset = self.offsets.get(partition, 0)
            out.append(ValidRecord(rid, values, SourceRef("in", partition, offset), at))
            self.offsets[partition] = offset + 1
        return out


def _window(
    engine: Engine, held: list[ValidRecord], new: list[ValidRecord], now: float
) -> tuple[set[tuple[int, int]], list[ValidRecord]]:
    result = engine.protect_window([*held, *new], now=now)
    out = {(p.source.partition, p.source.offset) for p in result.published if p.source}
    return out, list(result.held)


def _regroup() -> Policy:
    """The shipped policy as it was before the panel mode: regroup, one pool per wave, decided
    when the watermark closes it (what these tests are about)."""
    data = yaml.safe_load((ROOT / "deploy" / "policies" / "adult.yaml").read_text())
    data["republication"] = {"mode": "regroup", "wave_attribute": "wave", "pool": "release"}
    return parse_policy(data)


def _engine(tmp_path: Path) -> Engine:
    policy = _regroup()  # window.max_seconds 2
    store = SQLiteStore(tmp_path / "state.db")
    return Engine(policy, keyring=Keyring(b"release-clock-secret-0123"), store=store)


def test_a_wave_is_decided_with_the_records_a_lagging_partition_still_sends(
    tmp_path: Path,
) -> None:
    answers, waves = _panel()
    first = [a for a, w in zip(answers, waves, strict=True) if w == 1]
    second = [a for a, w in zip(answers, waves, strict=True) if w == 2]
    on = _Inputs().on

    engine = _engine(tmp_path)
    half = len(first) // 2
    # partition 0 sends its part of wave 1, then wave 2; partition 1 is slower
    w1 = on(0, first[:half], 0.0) + on(1, first[half : half + 5], 0.0)
    published, held = _window(engine, [], w1, now=0.0)
    assert not published
    late = on(1, first[half + 5 :], 0.5)
    published, held = _window(engine, held, on(0, second[:10], 0.5) + late, now=0.5)
    # one watermark would have decided wave 1 here, without the records partition 1 still sends
    assert not published
    assert {(r.source.partition, r.source.offset) for r in w1 + late if r.source} <= {
        (r.source.partition, r.source.offset) for r in held if r.source
    }
    published, held = _window(engine, held, on(1, second[10:], 1.0), now=1.0)
    wave1 = {(r.source.partition, r.source.offset) for r in w1 + late if r.source}
    assert wave1 <= published


def test_a_quiet_partition_holds_no_wave_back(tmp_path: Path) -> None:
    answers, waves = _panel()
    first = [a for a, w in zip(answers, waves, strict=True) if w == 1]
    second = [a for a, w in zip(answers, waves, strict=True) if w == 2]
    engine = _engine(tmp_path)
    half = len(first) // 2
    w1 = [
        ValidRecord(rid, values, SourceRef("in", 0 if i < half else 1, i), 0.0)
        for i, (rid, values) in enumerate(first)
    ]
    published, held = _window(engine, [], w1, now=0.0)
    assert not published
    w2 = [
        ValidRecord(rid, values, SourceRef("in", 0, len(first) + i), 5.0)
        for i, (rid, values) in enumerate(second[:10])
    ]
    published, _ = _window(engine, held, w2, now=5.0)  # partition 1 sent nothing since 0.0
    assert {(r.source.partition, r.source.offset) for r in w1 if r.source} <= published


def test_a_partition_owned_but_not_heard_from_holds_waves_back_until_quiet() -> None:
    clock = ReleaseClock(quiet_after=2.0)
    clock.own([P0, P1], now=0.0)
    clock.see(["1", "2"], [P0, P0], [0.1, 0.2])
    assert not clock.closed("1", now=0.3)  # partition 1 may still send wave 1
    assert clock.closed("1", now=2.0)  # nothing from it for 2 s
    clock.own([P0, P1], now=5.0)  # known already: its clock does not restart
    assert clock.closed("1", now=5.0)


def test_an_owned_partition_of_a_topic_no_record_came_from_holds_nothing_back() -> None:
    # a worker that re-keys also reads its input topic, whose records never reach the engine
    clock = ReleaseClock(quiet_after=2.0)
    clock.own([P0, ("raw", 0)], now=0.0)
    clock.see(["1", "2"], [P0, P0], [0.1, 0.2])
    assert clock.closed("1", now=0.3)
    clock.own([P1], now=0.4)  # a partition of a topic heard from: it may still send wave 1
    assert not clock.closed("1", now=0.5)
    assert clock.closed("1", now=2.4)


def test_an_operator_close_closes_its_wave_and_earlier_ones_whatever_the_sources_show() -> None:
    clock = ReleaseClock(quiet_after=2.0)
    clock.see(["2", "3"], [P0, P1], [0.0, 0.0], [None, None])  # P1 still sends wave 3
    assert not clock.closed("2", now=0.5) and not clock.closed_after("2", 0.5, grace=60.0)
    clock.close_through(2)
    clock.close_through(1)  # an older close after a newer one changes nothing
    assert clock.closed("2", now=0.5) and clock.closed_after("2", 0.5, grace=60.0)
    assert clock.closed("1", now=0.5) and clock.closed_after("1", 0.5, grace=60.0)
    assert not clock.closed("3", now=0.5) and not clock.closed_after("3", 0.5, grace=60.0)
    assert not clock.closed("w-window", now=0.5)  # window releases are no waves


def _see_record_by_record(
    clock: ReleaseClock,
    keys: list[str],
    sources: list[tuple[str, int] | None],
    arrived: list[float],
    events: list[float | None],
    *,
    rids: list[str | None],
    stamps: dict[int, list[float]],
) -> None:
    """What ``see`` means, one record at a time (its vectorised form must agree); ``stamps``:
    every known event time of each wave so far."""
    for key, source, at, event, rid in zip(keys, sources, arrived, events, rids, strict=True):
        if not key.isdigit():
            continue
        wave = int(key)
        if event is not None:
            stamps.setdefault(wave, []).append(event)
        if wave not in clock.seen:
            ids = clock.pending.setdefault(wave, set())
            ids.add(object() if rid is None else rid)
            if len(ids) >= clock.min_records:
                clock.seen.add(wave)
                del clock.pending[wave]
                clock.newest = wave if clock.newest is None else max(clock.newest, wave)
        clock.sources[source] = max(at, clock.sources.get(source, at))
        clock.shown.setdefault(source, set()).add(wave)
        if wave in clock.seen:
            # an unknown event time takes no part in the span; the span needs only the ends
            first, times = clock.arrivals.get(wave, (at, ()))
            times = tuple(sorted([*times, *([] if event is None else [event])]))
            keep = clock.min_records
            if len(times) > 2 * keep:
                times = times[:keep] + times[-keep:]
            clock.arrivals[wave] = (min(first, at), times)


def _at(values: list[str | None]) -> Callable[[Sequence[int]], list[str | None]]:
    return lambda positions: [values[i] for i in positions]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 4),
    st.lists(
        st.lists(
            st.tuples(
                st.sampled_from(["1", "2", "3", "w-a"]),
                st.sampled_from([P0, P1, None]),
                st.floats(0, 100, allow_nan=False),
                st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False)),
                st.sampled_from(["a", "b", "c", "d", None]),
            ),
            max_size=30,
        ),
        max_size=4,
    ),
)
def test_seeing_a_window_at_once_is_seeing_its_records_one_by_one(
    min_records: int,
    windows: list[list[tuple[str, tuple[str, int] | None, float, float | None, str | None]]],
) -> None:
    fast = ReleaseClock(quiet_after=2.0, min_records=min_records)
    slow = ReleaseClock(quiet_after=2.0, min_records=min_records)
    stamps: dict[int, list[float]] = {}
    for window in windows:
        keys, sources, arrived, events, rids = (
            (list(c) for c in zip(*window, strict=True)) if window else ([], [], [], [], [])
        )
        fast.see(keys, sources, arrived, events, _at(rids))
        _see_record_by_record(slow, keys, sources, arrived, events, rids=rids, stamps=stamps)
        # a wave opened at its min_records-th earliest known event time, once that many are
        for wave in (1, 2, 3):
            known = sorted(stamps.get(wave, []))
            opened = known[min_records - 1] if len(known) >= min_records else None
            assert fast.opened_at(wave) == opened
        assert (fast.newest, fast.sources, fast.shown, fast.arrivals, fast.seen) == (
            slow.newest,
            slow.sources,
            slow.shown,
            slow.arrivals,
            slow.seen,
        )
        assert {w: len(ids) for w, ids in fast.pending.items()} == {
            w: len(ids) for w, ids in slow.pending.items()
        }


def _stray_run(tmp_path: Path, strays: int, wave: int = 3) -> list[set[bytes]]:
    """The shipped panel policy, one partition sending wave 1, then half of wave 2 with
    ``strays`` respondents of a mistyped ``wave`` on another partition, a pause, the rest of
    wave 2, then wave 3; what each window published (the strays' own records left out)."""
    policy = load_policy(ROOT / "deploy" / "policies" / "adult.yaml")
    answers, waves = _panel(respondents=120, waves=3, new_share=0)
    by_wave = {w: [a for a, v in zip(answers, waves, strict=True) if v == w] for w in (1, 2, 3)}
    on = _Inputs().on

    strayed = [
        (f"stray-{i}", {**values, "wave": wave})
        for i, (_, values) in enumerate(by_wave[2][:strays])
    ]
    engine = Engine(
        policy,
        keyring=Keyring(b"release-clock-secret-0123"),
        store=SQLiteStore(tmp_path / f"s{strays}-{wave}.db"),
    )
    held: list[ValidRecord] = []
    published: list[set[bytes]] = []
    for new, now in [
        (on(0, by_wave[1], 0.0), 0.0),
        (on(0, by_wave[2][:60], 100.0) + on(1, strayed, 100.0), 100.0),
        ([], 130.0),  # past the close grace and the sources' quiet time
        (on(0, by_wave[2][60:], 200.0), 200.0),
        (on(0, by_wave[3], 300.0), 300.0),
        ([], 400.0),
    ]:
        result = engine.protect_window([*held, *new], now=now)
        held = list(result.held)
        published.append(
            {p.value for p in result.published if orjson.loads(p.value)["wave"] != wave}
        )
    return published


def test_fewer_than_k_respondents_of_a_later_wave_close_no_wave_before_it(tmp_path: Path) -> None:
    # one record with a mistyped wave number closed the open wave at the sources' first pause:
    # its members still to answer were imputed, and every later wave closed the same way
    k = load_policy(ROOT / "deploy" / "policies" / "adult.yaml").microaggregation.k
    clean = _stray_run(tmp_path, 0)
    waves = [{orjson.loads(value)["wave"] for value in window} for window in clean]
    assert 2 not in set().union(*waves[:5]) and 2 in waves[5], "wave 2 closes once 3 arrives"
    assert _stray_run(tmp_path, 1, wave=3) == clean
    assert _stray_run(tmp_path, k - 1, wave=3) == clean
    # k respondents of the next wave make it: wave 2 closes at the pause, with half its members
    assert 2 in {orjson.loads(value)["wave"] for value in _stray_run(tmp_path, k, wave=3)[2]}


def test_a_wave_number_far_ahead_closes_no_wave_and_is_not_decided(tmp_path: Path) -> None:
    """Five records of wave 2^31 - 1 (the largest accepted) closed every later wave about a
    close grace after it opened, and the members answering after that were imputed, their
    answers never published. Beyond republication.max_wave_step (10) of the newest wave read,
    a wave is never seen: k of it close nothing, and its records are published at once with
    their quasi-identifiers suppressed, not decided (decided, it would close every wave)."""
    k = load_policy(ROOT / "deploy" / "policies" / "adult.yaml").microaggregation.k
    clean = _stray_run(tmp_path, 0)
    for wave in (13, 2**31 - 1):
        assert _stray_run(tmp_path, k, wave=wave) == clean
        assert _stray_run(tmp_path, 3 * k, wave=wave) == clean


@settings(max_examples=300, deadline=None)
@given(
    st.integers(2, 5),
    st.lists(
        st.tuples(
            st.sampled_from(["1", "2", "3"]),
            st.sampled_from([P0, P1]),
            st.floats(0, 100, allow_nan=False),
            st.sampled_from(["a", "b", "c", "d", "e", "f"]),
        ),
        max_size=40,
    ),
    st.lists(st.tuples(st.sampled_from([P0, P1]), st.floats(0, 100, allow_nan=False)), max_size=8),
    st.data(),
)
def test_fewer_than_min_records_respondents_of_a_wave_close_nothing(
    min_records: int,
    records: list[tuple[str, tuple[str, int], float, str]],
    strays: list[tuple[tuple[str, int], float]],
    data: st.DataObject,
) -> None:
    # strays: records of wave 9 from fewer than min_records respondents, anywhere in the stream
    rids = [f"s{data.draw(st.integers(0, min_records - 2))}" for _ in strays]
    mixed = list(records)
    for (source, at), rid in zip(strays, rids, strict=True):  # the records' own order kept
        mixed.insert(data.draw(st.integers(0, len(mixed))), ("9", source, at, rid))
    clean = ReleaseClock(quiet_after=2.0, min_records=min_records)
    strayed = ReleaseClock(quiet_after=2.0, min_records=min_records)
    for clock, stream in ((clean, records), (strayed, mixed)):
        keys, sources, arrived, who = (
            (list(c) for c in zip(*stream, strict=True)) if stream else ([], [], [], [])
        )
        clock.see(keys, sources, arrived, list(arrived), _at(who))
    for now in (0.0, 50.0, 101.0, 103.0, 1000.0):
        for key in ("1", "2", "3"):
            # a stray may hold a wave back (its partition still sending), never close one
            assert not strayed.closed(key, now) or clean.closed(key, now)
            assert not strayed.closed_after(key, now, 10.0) or clean.closed_after(key, now, 10.0)


def _stamped(records: list[ValidRecord], stamps_ms: list[int]) -> list[ValidRecord]:
    """The records with these broker timestamps."""
    out = []
    for r, ms in zip(records, stamps_ms, strict=True):
        assert r.source is not None
        out.append(r._replace(source=r.source._replace(timestamp_ms=ms)))
    return out


@functools.cache
def _short_waves() -> Policy:
    """The shipped panel policy with max_wave_seconds 100."""
    data = yaml.safe_load((ROOT / "deploy" / "policies" / "adult.yaml").read_text())
    assert data["republication"]["mode"] == "panel", "the Adult policy changed: update this"
    data["republication"]["max_wave_seconds"] = 100
    return parse_policy(data)


@functools.cache
def _one_wave(respondents: int) -> tuple[Answer, ...]:
    """A panel's first wave, validated (read only: the runs below share it)."""
    return tuple(_panel(respondents=respondents, waves=1)[0])


def _open_wave_run(stamps_ms: list[int], steps: list[tuple[float, float, bool]]) -> list[bool]:
    """Wave 1 of a panel (max_wave_seconds 100, no wave after it) with these timestamps, fed
    again at each step (now, wall time, restart first): whether it was published by then.
    A restart is a new engine on the same state reading the wave's records again."""
    policy = _short_waves()
    records = _stamped(_Inputs().on(0, _one_wave(len(stamps_ms)), 0.0), stamps_ms)
    store = MemoryStore()

    def engine() -> Engine:
        return Engine(policy, keyring=Keyring(b"release-clock-secret-0123"), store=store)

    current, held, done, out = engine(), [], False, []
    for now, wall, restart in steps:
        if restart and not done:
            current = engine()
            held = [r._replace(arrived_at=now) for r in records]  # read again, arriving now
        elif not held and not done:
            held = [r._replace(arrived_at=now) for r in records]
        result = current.protect_window(held, now=now, marks=InputMarks(wall_time=wall))
        held = list(result.held)
        done = done or bool(result.published)
        out.append(done)
    return out


def test_a_restart_does_not_start_an_open_panel_waves_maximum_again() -> None:
    """A wave with no later one closes max_wave_seconds after it opened. Its records stay
    uncommitted, so a restart reads them again: counted from that read, a worker restarted
    more often than max_wave_seconds never closed the panel's last wave (and its records
    outlived the topic's retention). Counted from the records' own timestamps too, it closes
    on time; fewer than k records with a clock far behind do not date it back."""
    t0 = 1_800_000_000.0
    stamps = [int((t0 + i) * 1000) for i in range(30)]
    # read at mono 0 (wall t0 + 30), restart at wall t0 + 90 (mono 5000), then on at 20 s steps
    steps = [(0.0, t0 + 30, False), (60.0, t0 + 90, False), (5000.0, t0 + 90.5, True)]
    steps += [(5000.0 + 20 * i, t0 + 90.5 + 20 * i, False) for i in (1, 2)]
    assert _open_wave_run(stamps, steps) == [
        *(False,) * 3,
        True,  # wall t0 + 110.5: the wave's 5th earliest record (t0 + 4) is 106.5 s old
        True,
    ]
    # without timestamps the maximum runs from the read again: 100 s after mono 5000
    assert _open_wave_run([-1] * 30, steps) == [False] * 5
    # k - 1 records stamped in 1970 (a producer's clock not set) date nothing back
    k = load_policy(ROOT / "deploy" / "policies" / "adult.yaml").microaggregation.k
    skewed = [0] * (k - 1) + stamps[k - 1 :]
    assert _open_wave_run(skewed, steps[:3]) == [False] * 3
    # k of them do, once the source has gone quiet (it may still be sending the wave)
    quiet = [(0.0, t0 + 30, False), (3.0, t0 + 33, False)]
    assert _open_wave_run([0] * k + stamps[k:], quiet) == [False, True]


def test_a_backlog_of_old_records_is_read_whole_before_its_wave_is_decided() -> None:
    """A wave whose records' timestamps are long past its maximum (a platform loading last
    year's panel) is due by them only once no source still sends it: decided whole, with every
    member, not with the first window's."""
    policy = _short_waves()
    answers, _ = _panel(respondents=30, waves=1)
    year_ago = 1_800_000_000.0 - 365 * 86_400
    inputs = _Inputs()
    engine = Engine(policy, keyring=Keyring(b"release-clock-secret-0123"), store=MemoryStore())
    held: list[ValidRecord] = []
    published = []
    quiet = policy.window.max_seconds  # a source sending nothing this long holds nothing back
    for step, now in enumerate([0.0, 0.5, 1.0, 1.0 + quiet]):
        batch = answers[10 * step : 10 * step + 10]
        stamps = [int((year_ago + i) * 1000) for i in range(len(batch))]
        new = _stamped(inputs.on(0, batch, now), stamps)
        marks = InputMarks(wall_time=1_800_000_000.0 + now)
        result = engine.protect_window([*held, *new], now=now, marks=marks)
        held = list(result.held)
        published.append(len(result.published))
    assert published == [0, 0, 0, len(answers)]


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.floats(0, 60), min_size=8, max_size=8),  # how long before the first read
    st.lists(st.tuples(st.floats(3, 40), st.booleans()), min_size=3, max_size=7),
)
def test_restarts_close_an_open_wave_at_the_first_step_after_they_would_have_anyway(
    ages: list[float], steps: list[tuple[float, bool]]
) -> None:
    """Random timestamps (produced up to a minute before the wave is first read, so that it
    closes along the way, 40-100 s after the read) and random restarts at steps at least the
    sources' quiet time apart: the wave is published at the step it is without restarts, or,
    if a restart reads it again then (its source still sending), at the first step after
    without one. A restart no longer starts the maximum again: without timestamps, restarts
    every step would keep the wave open for good."""
    t0 = 1_800_000_000.0
    stamps = [int((t0 - age) * 1000) for age in ages]
    now, plan = 0.0, [(0.0, t0, False)]
    for gap, restart in steps:
        now += gap
        plan.append((now, t0 + now, restart))
    alone = _open_wave_run(stamps, [(at, wall, False) for at, wall, _ in plan])
    restarted = _open_wave_run(stamps, plan)
    first = alone.index(True) if True in alone else len(plan)
    expected = next((j for j in range(first, len(plan)) if not plan[j][2]), len(plan))
    assert (restarted.index(True) if True in restarted else len(plan)) == expected, (
        alone,
        restarted,
    )
