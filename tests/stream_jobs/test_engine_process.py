"""The engine in its own process (stream_jobs.engine_process.engine_process): same results as
in-process, failures reported without values, a child that cannot outlive its worker."""

from __future__ import annotations

import decimal
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from streamkit import regroup_adult, validated_panel

from gateway.engine.engine import Engine
from gateway.engine.keyed_inputs import KeyedInputs
from gateway.engine.records import InputMarks, ValidRecord
from gateway.engine.shards import ShardedEngine
from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy
from gateway.state_store.state_codec import decode_state
from state.sqlite_store import SQLiteStore
from stream_jobs.engine_process.engine_process import (
    EngineProcess,
    EngineProcessError,
    EngineShards,
    EngineSpec,
    PackedRecords,
)
from stream_jobs.engine_process.engine_wire import HeldAt, HeldInChild, decode_window, encode_window

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "deploy" / "policies" / "adult.yaml"
SECRET = b"engine-process-test-secret-0123456789"


@pytest.fixture
def engine_process(tmp_path: Path) -> Iterator[EngineProcess]:
    proc = EngineProcess(EngineSpec(load_policy(ADULT), tmp_path / "child.db", SECRET))
    yield proc
    proc.close()


def _same_windows(
    child: EngineProcess | EngineShards,
    local: Engine | ShardedEngine,
    records: list[ValidRecord],
    size: int,
    *,
    ahead: bool = False,
) -> None:
    """Windows of ``size`` records, each with the records its engine held from the last one:
    the child's results equal the in-process engine's, window for window, and some records
    did wait (the last window flushes them). ``ahead``: the new records of each window reach
    the child packed ahead in batches of 3, as the worker packs them while the engine is busy;
    only the held ones are packed at hand-over."""
    held_child: list[ValidRecord] = []
    held_local: list[ValidRecord] = []
    saw_held = False
    for start in range(0, len(records), size):
        chunk = records[start : start + size]
        last = start + size >= len(records)
        if ahead:
            assert isinstance(child, EngineProcess)
            batches = [child.pack(chunk[i : i + 3]) for i in range(0, len(chunk), 3)]
            tail = PackedRecords(len(chunk), tuple(batches))
            call = child.prepare([*held_child, *chunk], now=1.0, flush_all=last, tail=tail)
            got = call()
        else:
            got = child.protect_window([*held_child, *chunk], now=1.0, flush_all=last)
        want = local.protect_window([*held_local, *chunk], now=1.0, flush_all=last)
        assert got.published == want.published
        assert got.report == want.report
        assert [h.source for h in got.held] == [h.source for h in want.held]
        # held records come back as the caller's own objects, not copies
        window = {id(r) for r in [*held_child, *chunk]}
        assert all(id(h) in window for h in got.held)
        saw_held = saw_held or bool(got.held)
        held_child, held_local = list(got.held), list(want.held)
    assert saw_held and not held_child


def test_windows_protected_in_the_child_match_the_engine_in_process(
    engine_process: EngineProcess, tmp_path: Path
) -> None:
    policy = load_policy(ADULT)
    store = SQLiteStore(tmp_path / "local.db")
    local = Engine(policy, keyring=Keyring(SECRET), store=store)
    assert engine_process.version == local.version
    assert engine_process.metadata() == local.metadata()
    # windows of 7 leave records waiting for a group of k = 5: holds travel back and forth
    _same_windows(engine_process, local, validated_panel(1200), size=7)
    assert engine_process.count() == store.count()
    engine_process.close()
    store.close()
    with SQLiteStore(tmp_path / "child.db") as a, SQLiteStore(tmp_path / "local.db") as b:
        assert dict(a.items()) == dict(b.items())


def test_windows_packed_ahead_match_the_engine_in_process(
    engine_process: EngineProcess, tmp_path: Path
) -> None:
    with SQLiteStore(tmp_path / "local.db") as store:
        local = Engine(load_policy(ADULT), keyring=Keyring(SECRET), store=store)
        _same_windows(engine_process, local, validated_panel(600), size=7, ahead=True)


def test_a_scrape_does_not_wait_for_the_window_in_the_child(
    engine_process: EngineProcess,
) -> None:
    engine_process.protect_window(validated_panel(600), now=0.0, flush_all=True)
    before = engine_process.count()
    assert before > 0
    big = validated_panel(20000, seed=9)  # new respondents: more than a second in the child
    window = threading.Thread(
        target=engine_process.protect_window, args=(big,), kwargs={"now": 0.0, "flush_all": True}
    )
    window.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    during = engine_process.count()
    waited = time.monotonic() - t0
    in_flight = window.is_alive()
    window.join()
    assert in_flight, "the window had finished before the scrape: nothing was tested"
    assert during == before and waited < 0.5
    assert engine_process.count() > before


def test_a_window_keeps_values_marshal_cannot_carry() -> None:
    records = validated_panel(3)
    odd = records[0]._replace(values={**records[0].values, "wave": decimal.Decimal("2")})
    blob = encode_window([odd, *records[1:]])
    assert blob[:1] == b"p"  # fell back to pickle
    assert decode_window([blob])[0] == [odd, *records[1:]]
    assert encode_window(records)[:1] == b"m"
    decoded, columns, _ = decode_window([encode_window(records)])
    assert decoded == records
    assert columns is not None and columns["age"] == [r.values["age"] for r in records]


def test_a_window_whose_records_differ_in_attributes_travels_as_mappings() -> None:
    records = validated_panel(3)
    short = records[1]._replace(
        values={k: v for k, v in records[1].values.items() if k != "submitted_at"}
    )
    window = [records[0], short, records[2]]
    decoded, columns, _ = decode_window([encode_window(window)])
    assert columns is None
    assert decoded == window
    assert "submitted_at" not in decoded[1].values


@pytest.mark.parametrize("cuts", [(1,), (2, 5), (4, 5, 6)])
def test_a_window_in_segments_decodes_as_the_whole(cuts: tuple[int, ...]) -> None:
    """Segments packed ahead (one per validated batch) join into the window packed at once:
    the same records and columns; with a segment whose records lack an attribute, the same
    records as mappings."""
    records = validated_panel(8)
    bounds = [0, *cuts, len(records)]
    segments = [encode_window(records[a:b]) for a, b in itertools.pairwise(bounds)]
    assert decode_window(segments) == decode_window([encode_window(records)])
    short = records[3]._replace(
        values={k: v for k, v in records[3].values.items() if k != "submitted_at"}
    )
    mixed = [*records[:3], short, *records[4:]]
    segments = [encode_window(mixed[a:b]) for a, b in itertools.pairwise(bounds)]
    decoded, columns, _ = decode_window(segments)
    assert decoded == mixed
    assert columns is None  # the short record's segment travelled as mappings
    assert "submitted_at" not in decoded[3].values


@pytest.mark.parametrize("mode", ["panel", "regroup"])
@pytest.mark.parametrize("cuts", [(), (2, 5), (4, 5, 6)])
def test_keys_packed_with_segments_join_into_the_windows_keys(
    cuts: tuple[int, ...], mode: str, tmp_path: Path
) -> None:
    """The keyed digests computed as segments are packed join into those of the whole window,
    and a segment with a record that has no input position leaves the engine to compute
    them (its draw key would be bound to its index in the window, unknown to the packer).
    A panel looks no claim tuple up by its digest: none is computed for it."""
    policy = load_policy(ADULT if mode == "panel" else regroup_adult(tmp_path))
    inputs = KeyedInputs(policy, Keyring(SECRET))
    records = validated_panel(8)
    bounds = [0, *cuts, len(records)]
    segments = [encode_window(records[a:b], inputs) for a, b in itertools.pairwise(bounds)]
    decoded, _, keys = decode_window(segments)
    assert decoded == records
    assert keys == inputs.of(records)
    assert len(keys.respondents) == len(records) and all(keys.respondents)
    assert len(keys.quasi_identifiers) == (0 if mode == "panel" else len(records))
    assert decode_window([encode_window(records)])[2] is None  # packed without inputs
    loose = [*records[:3], records[3]._replace(source=None), *records[4:]]
    segments = [encode_window(loose[a:b], inputs) for a, b in itertools.pairwise(bounds)]
    assert decode_window(segments)[2] is None


def test_the_child_runs_this_copy_of_privgw_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A working directory holding another copy of privgw (an old checkout) must not give the
    child code that speaks another protocol: `python -m` would put it first on the path."""
    for package in ("stream_jobs", "gateway"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("raise SystemExit('another copy')\n")
    monkeypatch.chdir(tmp_path)
    proc = EngineProcess(EngineSpec(load_policy(ADULT), tmp_path / "s.db", SECRET))
    try:
        records = validated_panel(20)
        result = proc.protect_window(records, now=1.0, flush_all=True)
        assert len(result.published) == len(records) > 0
    finally:
        proc.close()


def test_an_engine_failure_is_reported_without_the_value(
    engine_process: EngineProcess,
) -> None:
    # 6 respondents a wave over partitions 0, 1, 2 (a later wave counts from k respondents)
    bad = validated_panel(18)
    # in wave 1, which every partition has moved past (for longer than the panel's close
    # grace): decided in this window
    bad[1] = bad[1]._replace(values={**bad[1].values, "age": "forty-two-years"})
    with pytest.raises(EngineProcessError) as err:
        engine_process.protect_window(bad, now=100.0)
    assert "forty-two" not in str(err.value)
    assert "ValueError" in str(err.value) or "TypeError" in str(err.value)
    # the child is still there and serves the next window: every record published or held
    after = engine_process.protect_window(validated_panel(18), now=100.0)
    assert len(after.published) + len(after.held) == 18


def test_a_dead_child_is_an_error_not_a_hang(engine_process: EngineProcess) -> None:
    os.kill(engine_process.pid, signal.SIGKILL)
    with pytest.raises(EngineProcessError, match="exited"):
        engine_process.protect_window(validated_panel(10), now=0.0)


def test_a_second_engine_on_the_same_state_is_refused(
    engine_process: EngineProcess, tmp_path: Path
) -> None:
    with pytest.raises(EngineProcessError, match="in use by another process"):
        EngineProcess(EngineSpec(load_policy(ADULT), tmp_path / "child.db", SECRET))


def test_the_secret_is_not_on_the_childs_command_line_or_in_its_environment(
    secret_env: str, tmp_path: Path
) -> None:
    # the worker's own environment holds a secret (PRIVGW_SECRET); the child's does not
    proc = EngineProcess(EngineSpec(load_policy(ADULT), tmp_path / "s.db", secret_env.encode()))
    try:
        for part in ("cmdline", "environ"):
            raw = Path(f"/proc/{proc.pid}/{part}").read_bytes()
            assert secret_env.encode() not in raw
            assert b"PRIVGW_SECRET" not in raw
        assert proc.count() == 0  # and it works, with the secret from its start-up message
    finally:
        proc.close()


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"  # exited, not yet reaped


def test_the_child_dies_with_a_worker_killed_mid_window(tmp_path: Path) -> None:
    """Killed with SIGKILL while its engine protects a window, a worker takes the child with
    it: no engine lives on to write that window's state after a replacement has started."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pathlib import Path
        from gateway.policy import load_policy
        from stream_jobs.engine_process.engine_process import EngineProcess, EngineSpec
        from streamkit import regroup_adult, validated_panel
        records = validated_panel(20000)
        proc = EngineProcess(EngineSpec(load_policy({str(ADULT)!r}),
                                        Path({str(tmp_path / "s.db")!r}), {SECRET!r}))
        print(proc.pid, flush=True)
        proc.protect_window(records, now=0.0, flush_all=True)
        print("done", flush=True)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(0.3)  # the window is on its way to the child, or being protected
        assert not _gone(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 1.0  # far less than protecting 20,000 records takes
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(child)
        assert parent.stdout.read() == ""  # the window never completed
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    with SQLiteStore(tmp_path / "s.db") as store:  # free for the next worker, and untouched
        assert store.count() == 0


def _shard_specs(tmp_path: Path, n: int) -> list[EngineSpec]:
    return [EngineSpec(load_policy(ADULT), tmp_path / f"shard{i}.db", SECRET) for i in range(n)]


def test_shards_in_processes_match_shards_in_process(tmp_path: Path) -> None:
    policy = load_policy(ADULT)
    local_stores = [SQLiteStore(tmp_path / f"local{i}.db") for i in range(3)]
    local = ShardedEngine(
        [Engine(policy, keyring=Keyring(SECRET), store=s, measure_risk=False) for s in local_stores]
    )
    shards = EngineShards(_shard_specs(tmp_path, 3))
    try:
        assert len(set(shards.pids)) == 3 and shards.version == local.version
        _same_windows(shards, local, validated_panel(3000), size=40)  # ~13 a shard: holds
        assert shards.count() == sum(s.count() for s in local_stores)
    finally:
        shards.close()
        for store in local_stores:
            store.close()
    for i in range(3):
        child, local_db = tmp_path / f"shard{i}.db", tmp_path / f"local{i}.db"
        with SQLiteStore(child) as a, SQLiteStore(local_db) as b:
            assert dict(a.items()) == dict(b.items())


def test_a_dead_shard_fails_the_window_and_the_others_still_close(tmp_path: Path) -> None:
    shards = EngineShards(_shard_specs(tmp_path, 2))
    try:
        os.kill(shards.pids[1], signal.SIGKILL)
        with pytest.raises(EngineProcessError, match="exited"):
            shards.protect_window(validated_panel(60), now=100.0)  # waves past the grace
        # the live shard's reply was read and its lock released: it still answers
        assert shards.shards[0].count() > 0
    finally:
        shards.close(timeout=5.0)
    assert shards.shards[0]._proc.returncode == 0


def test_strata_and_l_diversity_in_the_child_match_the_engine_in_process(tmp_path: Path) -> None:
    """The keys the worker packs ahead digest each record's stratum with its tuple, as the
    engine does itself: the child decides every window as the engine in process does."""
    spec = yaml.safe_load(regroup_adult(tmp_path).read_text())  # panel groups no strata yet
    spec["microaggregation"].update(
        strata=["race"], small_strata="suppress", l_diversity={"attribute": "income", "l": 2}
    )
    path = tmp_path / "strata.yaml"
    path.write_text(yaml.safe_dump(spec))
    policy = load_policy(path)
    child = EngineProcess(EngineSpec(policy, tmp_path / "child.db", SECRET))
    try:
        with SQLiteStore(tmp_path / "local.db") as store:
            local = Engine(policy, keyring=Keyring(SECRET), store=store)
            assert child.metadata() == local.metadata()
            assert local.metadata()["strata"] == ["race"]
            _same_windows(child, local, validated_panel(600), size=40, ahead=True)
    finally:
        child.close()
    # the same state too: every respondent's tuple digest (stratum included) and group entry
    with SQLiteStore(tmp_path / "child.db") as a, SQLiteStore(tmp_path / "local.db") as b:
        assert dict(a.items()) == dict(b.items())


def test_committed_offsets_reach_the_child_and_bound_what_a_replay_keeps(
    engine_process: EngineProcess, tmp_path: Path
) -> None:
    """A respondent's state keeps what its records published (gateway.grouping.replay) until
    the worker says their offsets are committed: the offsets travel to the child with the
    window, and without them an engine keeps every entry up to its bound."""
    records = validated_panel(600)  # 200 respondents, wave 1 then wave 2
    first, second = records[:200], records[200:400]
    local_store = SQLiteStore(tmp_path / "local.db")
    policy = load_policy(regroup_adult(tmp_path))  # the mode whose replay entries these are
    engine_process.close()
    engine_process = EngineProcess(EngineSpec(policy, tmp_path / "regroup.db", SECRET))
    local = Engine(policy, keyring=Keyring(SECRET), store=local_store)
    done = {("in", p): 400 for p in range(3)}  # everything below offset 400 is committed
    for engine, committed in ((engine_process, done), (local, None)):
        engine.protect_window(first, now=1.0, flush_all=True)
        engine.protect_window(second, now=1.0, flush_all=True, marks=InputMarks(committed))
    engine_process.close()
    local_store.close()

    def kept(path: Path) -> list[list[int]]:
        """Per respondent, the offsets of the records its state keeps."""
        with SQLiteStore(path) as store:
            states = [decode_state(v) for k, v in store.items() if len(k) == 32]
        return [sorted(int(e[0].rsplit("/", 1)[1]) for e in s.get("p", ())) for s in states]

    child, control = kept(tmp_path / "regroup.db"), kept(tmp_path / "local.db")
    both = sum(len(offsets) == 2 for offsets in control)  # published in both windows
    assert both > 100
    # a respondent that published again dropped its committed entry (one not written since
    # keeps it: entries go when a state is written)
    again = [offsets for offsets in child if offsets and max(offsets) >= 200]
    assert len(again) >= both
    assert all(min(offsets) >= 200 for offsets in again)


def test_held_records_stay_in_the_child_and_travel_again_only_when_out_of_step(
    engine_process: EngineProcess, tmp_path: Path
) -> None:
    """With pool: release a wave's records come back held with every window until the wave
    closes: the worker sends how many of them start its window, not the records again. A
    window that does not start with them as they came back (a revocation dropped some) sends
    them all again, to the same result."""
    records = validated_panel(600)  # wave 1, then wave 2
    with SQLiteStore(tmp_path / "local.db") as store:
        local = Engine(load_policy(ADULT), keyring=Keyring(SECRET), store=store)
        got = engine_process.protect_window(records[:100], now=1.0)
        want = local.protect_window(records[:100], now=1.0)
        assert len(got.held) == 100  # the open wave, set aside
        window = [*got.held, *records[100:150]]
        request = engine_process.request(window, 1.0, False)
        assert request[-1] == 100 and len(decode_window(request[1])[0]) == 50
        # a revocation dropped one of them: the window no longer starts with them
        out_of_step = [*got.held[1:], *records[100:150]]
        request = engine_process.request(out_of_step, 1.0, False)
        assert request[-1] == 0 and len(decode_window(request[1])[0]) == 149
        got = engine_process.protect_window(out_of_step, now=1.0)
        want = local.protect_window([*want.held[1:], *records[100:150]], now=1.0)
        assert [h.source for h in got.held] == [h.source for h in want.held]
        # then in step again, up to the wave's close and the last flush
        for chunk, last in ((records[150:400], False), (records[400:], True)):
            got = engine_process.protect_window([*got.held, *chunk], now=1.0, flush_all=last)
            want = local.protect_window([*want.held, *chunk], now=1.0, flush_all=last)
            assert got.published == want.published
            assert [h.source for h in got.held] == [h.source for h in want.held]
        assert got.published and not got.held


def test_a_window_out_of_step_with_what_the_child_holds_is_refused() -> None:
    held = HeldInChild()
    records = validated_panel(30)
    held.keep(records, None, None, HeldAt([0, 1, 2], in_front=True))
    joined, _, _ = held.join(3, records[3:5], None, None)
    assert joined == records[:5]
    with pytest.raises(ValueError, match="out of step"):
        held.join(2, records[3:5], None, None)


def test_recoding_with_suppression_in_the_child_matches_the_engine_in_process(
    tmp_path: Path,
) -> None:
    """recode_suppress (gateway/grouping/recode_stream.py) decides waves in the child exactly
    as in process: outputs, reports, held records and the state written."""
    policy = load_policy(ROOT / "deploy" / "policies" / "adult_recode.yaml")
    child = EngineProcess(EngineSpec(policy, tmp_path / "child.db", SECRET))
    store = SQLiteStore(tmp_path / "local.db")
    try:
        local = Engine(policy, keyring=Keyring(SECRET), store=store)
        assert child.metadata() == local.metadata()
        # windows of 40: each wave waits (parked) until a later wave closes it
        _same_windows(child, local, validated_panel(900), size=40)
    finally:
        child.close()
        store.close()
    with SQLiteStore(tmp_path / "child.db") as a, SQLiteStore(tmp_path / "local.db") as b:
        entries = dict(a.items())
        assert entries == dict(b.items())
        assert any(k.startswith(b"group:rs.") for k in entries)  # the wave's classes
