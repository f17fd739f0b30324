"""One contract for every StateStore backend (memory, SQLite, RocksDB), plus backend specifics."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.keyed.keyed import Keyring
from gateway.state_store.state_api import KeyFingerprintCheck as Check
from gateway.state_store.state_api import (
    KeyFingerprintStore,
    SecretMismatchError,
    StateStore,
    check_key_fingerprint,
)
from state.changelog import ChangelogWriter
from state.errors import StateStoreError
from state.memory_store import MemoryStore
from state.rocks_store import RocksStore
from state.sqlite_store import SQLiteStore

REPO = Path(__file__).resolve().parents[2]
ALL = ["memory", "sqlite", "rocks"]
DURABLE = ["sqlite", "rocks"]

Store = MemoryStore | SQLiteStore | RocksStore


def open_store(kind: str, where: Path) -> Store:
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SQLiteStore(where / "sqlite" / "state.db")
    return RocksStore(where / "rocks")


def store_dir(kind: str, where: Path) -> Path:
    return where / kind


def key(i: int) -> bytes:
    return hashlib.sha256(b"k%d" % i).digest()


def value(i: int, version: int = 0) -> bytes:
    return hashlib.sha256(b"v%d/%d" % (i, version)).digest() * 6  # ~200 opaque bytes


def batch(lo: int, hi: int, version: int = 0) -> dict[bytes, bytes]:
    return {key(i): value(i, version) for i in range(lo, hi)}


@pytest.fixture(params=ALL)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=DURABLE)
def durable_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(kind: str, tmp_path: Path) -> Iterator[Store]:
    s = open_store(kind, tmp_path)
    yield s
    s.close()


# --- the contract ----------------------------------------------------------------------------


def test_is_a_state_store(store: Store) -> None:
    assert isinstance(store, StateStore)


def test_round_trip(store: Store) -> None:
    entries = batch(0, 100)
    store.put_many(entries)
    assert store.get_many(list(entries)) == entries
    assert store.count() == 100


def test_missing_keys_are_absent(store: Store) -> None:
    store.put_many(batch(0, 10))
    got = store.get_many([key(5), key(10), key(11), b"", b"\x00" * 32])
    assert got == {key(5): value(5)}
    assert store.get_many([]) == {}
    assert store.get_many([key(99)]) == {}


def test_overwrite_replaces_and_does_not_count_twice(store: Store) -> None:
    store.put_many(batch(0, 10))
    store.put_many(batch(5, 15, version=1))
    assert store.count() == 15
    got = store.get_many([key(i) for i in range(15)])
    assert got == {**batch(0, 5), **batch(5, 15, version=1)}


def test_count(store: Store) -> None:
    assert store.count() == 0
    store.put_many({})
    assert store.count() == 0
    store.put_many(batch(0, 3))
    store.put_many(batch(2, 7))
    assert store.count() == 7


def test_duplicate_and_unsorted_keys_in_get(store: Store) -> None:
    store.put_many(batch(0, 5))
    got = store.get_many([key(3), key(1), key(3), key(0)])
    assert got == {key(0): value(0), key(1): value(1), key(3): value(3)}


def test_values_are_opaque_bytes(store: Store) -> None:
    odd = {b"\x00": b"", b"\xff" * 32: bytes(range(256)) * 40, b"k": b"\x00\x00"}
    store.put_many(odd)
    assert store.get_many(list(odd)) == odd


@pytest.mark.parametrize("bad", ["value", "key"])
def test_failed_batch_leaves_nothing(store: Store, bad: str) -> None:
    """A bad entry in the middle of a batch: TypeError, and none of the batch is written."""
    store.put_many(batch(0, 10))
    entries: dict[object, object] = dict(batch(100, 150))
    if bad == "value":
        entries[key(1)] = "not bytes"  # an existing key, in the middle of the batch
    else:
        entries["not bytes"] = value(1)
    entries.update(batch(150, 200))
    with pytest.raises(TypeError, match="bytes"):
        store.put_many(entries)  # type: ignore[arg-type]
    assert store.count() == 10
    assert store.get_many([key(i) for i in range(100, 200)]) == {}
    assert store.get_many([key(1)]) == {key(1): value(1)}
    store.put_many(batch(10, 11))  # still usable
    assert store.count() == 11


def test_large_batch(store: Store) -> None:
    entries = batch(0, 50_000)
    store.put_many(entries)
    assert store.count() == 50_000
    keys = list(entries)
    got = store.get_many(keys)
    assert len(got) == 50_000
    assert got == entries


def test_context_manager_and_closed_store(kind: str, tmp_path: Path) -> None:
    with open_store(kind, tmp_path) as s:
        s.put_many(batch(0, 1))
    s.close()  # idempotent
    if kind != "memory":
        with pytest.raises(StateStoreError, match="closed"):
            s.get_many([key(0)])
        with pytest.raises(StateStoreError, match="closed"):
            s.put_many(batch(1, 2))


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.binary(min_size=1, max_size=4), st.binary(max_size=8), max_size=20),
        max_size=6,
    )
)
def test_behaves_like_a_dict(batches: list[dict[bytes, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model: dict[bytes, bytes] = {}
        stores = [open_store(k, Path(tmp)) for k in ALL]
        try:
            for b in batches:
                model.update(b)
                for s in stores:
                    s.put_many(b)
            probe = [*model, b"absent"]
            for s in stores:
                assert s.get_many(probe) == model
                assert s.count() == len(model)
                assert dict(s.items()) == model
        finally:
            for s in stores:
                s.close()


# --- durability --------------------------------------------------------------------------------


def test_durable_across_close_and_reopen(durable_kind: str, tmp_path: Path) -> None:
    with open_store(durable_kind, tmp_path) as s:
        s.put_many(batch(0, 1000))
        s.put_many(batch(500, 1500, version=2))
    with open_store(durable_kind, tmp_path) as s:
        assert s.count() == 1500
        assert s.get_many([key(i) for i in range(1500)]) == {
            **batch(0, 500),
            **batch(500, 1500, version=2),
        }


def test_one_process_at_a_time(durable_kind: str, tmp_path: Path) -> None:
    with open_store(durable_kind, tmp_path), pytest.raises(StateStoreError, match="in use"):
        open_store(durable_kind, tmp_path)


_CHILD = """
import hashlib, os, signal, sys
sys.path.insert(0, {repo!r})
from state.rocks_store import RocksStore
from state.sqlite_store import SQLiteStore

kind, where, mode = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "sqlite":
    store = SQLiteStore(where + "/sqlite/state.db")
else:
    store = RocksStore(where + "/rocks")

def batch(b):
    return {{
        hashlib.sha256(b"k%d" % (b * 1000 + i)).digest():
        hashlib.sha256(b"v%d" % (b * 1000 + i)).digest() * 6
        for i in range(1000)
    }}

if mode == "self":
    store.put_many(batch(0))
    print("ok", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
b = 0
while True:
    store.put_many(batch(b))
    print(b, flush=True)
    b += 1
"""


def _child_batch(b: int) -> dict[bytes, bytes]:
    return {
        hashlib.sha256(b"k%d" % (b * 1000 + i)).digest(): hashlib.sha256(
            b"v%d" % (b * 1000 + i)
        ).digest()
        * 6
        for i in range(1000)
    }


def _child(durable_kind: str, where: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(repo=str(REPO)), durable_kind, str(where), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def test_put_many_survives_kill_9_right_after_it_returns(durable_kind: str, tmp_path: Path) -> None:
    proc = _child(durable_kind, tmp_path, "self")
    out, _ = proc.communicate(timeout=60)
    assert out.strip() == "ok"
    assert proc.returncode == -signal.SIGKILL
    with open_store(durable_kind, tmp_path) as s:
        expected = _child_batch(0)
        assert s.count() == len(expected)
        assert s.get_many(list(expected)) == expected


def test_kill_9_while_writing_loses_no_acknowledged_batch(
    durable_kind: str, tmp_path: Path
) -> None:
    """SIGKILL at an arbitrary point: acknowledged batches are all there, the one in flight is
    all-or-nothing, nothing later exists."""
    proc = _child(durable_kind, tmp_path, "loop")
    assert proc.stdout is not None
    acked = [int(proc.stdout.readline()) for _ in range(4)]
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=60)
    acked += [int(line) for line in rest.split()]
    assert acked == list(range(len(acked)))
    with open_store(durable_kind, tmp_path) as s:
        for b in acked:
            expected = _child_batch(b)
            assert s.get_many(list(expected)) == expected
        in_flight = _child_batch(len(acked))
        got = s.get_many(list(in_flight))
        assert got in ({}, in_flight)
        assert s.count() == 1000 * len(acked) + len(got)
        assert s.get_many(list(_child_batch(len(acked) + 1))) == {}


# --- no raw personal data in the files ---------------------------------------------------------


def test_files_hold_no_canary(durable_kind: str, tmp_path: Path) -> None:
    secret = b"canary-test-secret-0123456789"
    ring = Keyring(secret)
    canaries = [b"CANARY-RID-123", b"canary-value-xyz"]
    rkeys = ring.respondent_keys(["CANARY-RID-123", *[f"R{i}" for i in range(999)]])
    digest = ring.value_digest("occupation", "canary-value-xyz")
    entries = {k: os.urandom(180) + digest for k in rkeys}
    with open_store(durable_kind, tmp_path) as s:
        s.put_many(entries)
    blobs = b"".join(
        p.read_bytes() for p in store_dir(durable_kind, tmp_path).rglob("*") if p.is_file()
    )
    # sanity: the scan does see what was stored (a key's tail: SST files share key prefixes)
    assert rkeys[0][4:] in blobs
    assert entries[rkeys[0]][:64] in blobs
    for canary in canaries:
        for encoded in (canary, canary.decode().encode("utf-16-le"), canary.hex().encode()):
            assert encoded not in blobs
    assert secret not in blobs


def test_sqlite_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "state.db"
    with SQLiteStore(path) as s:
        s.put_many(batch(0, 100))
        files = list(path.parent.iterdir())
        assert {p.name for p in files} >= {"state.db", "state.db-wal"}
        for p in files:
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p.name


def test_rocks_directory_is_private(tmp_path: Path) -> None:
    with RocksStore(tmp_path / "r") as s:
        s.put_many(batch(0, 10))
    assert stat.S_IMODE((tmp_path / "r").stat().st_mode) == 0o700


# --- RocksStore and its changelog --------------------------------------------------------------


class RecordingChangelog:
    """In-test ChangelogWriter: an append-only list (a changelog topic partition)."""

    def __init__(self, store_to_check: list[RocksStore] | None = None) -> None:
        self.entries: list[tuple[bytes, bytes]] = []
        self.fail = False
        self.seen_local_before_write: list[bool] = []
        self._store = store_to_check

    def write(self, entries: Mapping[bytes, bytes]) -> None:
        if self._store:
            present = self._store[0].get_many(list(entries))
            self.seen_local_before_write.append(
                any(present.get(k) == v for k, v in entries.items())
            )
        if self.fail:
            raise ConnectionError("changelog unavailable")
        self.entries.extend(entries.items())


def test_recording_changelog_is_a_changelog_writer() -> None:
    assert isinstance(RecordingChangelog(), ChangelogWriter)


def test_rocks_restore_rebuilds_the_store(tmp_path: Path) -> None:
    log = RecordingChangelog()
    with RocksStore(tmp_path / "a", changelog=log) as a:
        a.put_many(batch(0, 3000))
        a.put_many(batch(1000, 4000, version=1))
        a.put_many(batch(3500, 3600, version=2))
        original = dict(a.items())
        original_count = a.count()
    assert len(log.entries) == 3000 + 3000 + 100
    with RocksStore(tmp_path / "b") as b:
        assert b.restore(iter(log.entries)) == len(log.entries)
        assert dict(b.items()) == original
        assert b.count() == original_count == 4000
    with RocksStore(tmp_path / "b") as b:  # the restore is durable too
        assert b.count() == 4000
        assert dict(b.items()) == original


def test_rocks_restore_later_entries_win_across_chunks(tmp_path: Path) -> None:
    entries = [(key(i % 7), value(i)) for i in range(25_000)]
    with RocksStore(tmp_path / "r") as r:
        r.put_many({key(0): b"old", key(100): b"kept"})
        assert r.restore(entries) == 25_000
        assert r.count() == 8
        last = {key(i % 7): value(i) for i in range(25_000)}
        assert r.get_many([*last, key(100)]) == {**last, key(100): b"kept"}
        assert r.restore([]) == 0


def test_rocks_writes_the_changelog_before_the_local_store(tmp_path: Path) -> None:
    holder: list[RocksStore] = []
    log = RecordingChangelog(holder)
    with RocksStore(tmp_path / "r", changelog=log) as r:
        holder.append(r)
        r.put_many(batch(0, 10))
        r.put_many(batch(0, 10, version=1))
        assert log.seen_local_before_write == [False, False]
        assert r.get_many([key(0)]) == {key(0): value(0, 1)}


def test_rocks_changelog_failure_writes_nothing_locally(tmp_path: Path) -> None:
    log = RecordingChangelog()
    with RocksStore(tmp_path / "r", changelog=log) as r:
        r.put_many(batch(0, 10))
        log.fail = True
        with pytest.raises(ConnectionError):
            r.put_many(batch(5, 20, version=1))
        assert r.count() == 10
        assert r.get_many([key(i) for i in range(20)]) == batch(0, 10)
        log.fail = False
        bad: dict[object, object] = {**batch(20, 30), key(25): 1}
        with pytest.raises(TypeError):
            r.put_many(bad)  # type: ignore[arg-type]
    assert len(log.entries) == 10  # neither the failed nor the bad batch reached the changelog


class _HeldChangelog:
    """A changelog whose acknowledgement waits until the test releases it (a slow broker)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, entries: Mapping[bytes, bytes]) -> None:
        self.entered.set()
        assert self.release.wait(30), "the test never released the changelog"


def test_rocks_readers_do_not_wait_for_the_changelog(tmp_path: Path) -> None:
    """The worker's event loop both sends the changelog's records and counts the store (an
    observer, a scrape): a count that waited for a write in flight stalled the two against
    each other until the changelog's 120 s timeout (CI, tests/stream_jobs/test_state_routing)."""
    log = _HeldChangelog()
    with RocksStore(tmp_path / "r", changelog=log) as r:
        writer = threading.Thread(target=r.put_many, args=(batch(0, 10),))
        writer.start()
        assert log.entered.wait(10)
        answers: list[tuple[int, int, dict[bytes, bytes]]] = []
        reader = threading.Thread(
            target=lambda: answers.append(
                (r.count(), r.count_prefix(b"group:"), r.get_many([key(0)]))
            )
        )
        reader.start()
        reader.join(10)
        stalled = reader.is_alive()
        log.release.set()
        writer.join(30)
        reader.join(30)
        assert not stalled, "a reader waited for the changelog's acknowledgement"
        assert answers == [(0, 0, {})]  # the batch is not local before its acknowledgement
        assert r.count() == 10 and r.get_many([key(0)]) == {key(0): value(0)}


# --- the key fingerprint a state was written with (gateway.state_store.state_api)
# ------------------------


def test_key_fingerprint_is_stored_apart_from_respondents(store: Store) -> None:
    assert isinstance(store, KeyFingerprintStore)
    assert store.key_fingerprints() == [None]
    store.put_many(batch(0, 10))
    store.set_key_fingerprint("0123456789abcdef")
    assert store.key_fingerprints() == ["0123456789abcdef"]
    assert store.count() == 10  # not a respondent
    assert len(list(store.items())) == 10
    store.set_key_fingerprint("fedcba9876543210")
    assert store.key_fingerprints() == ["fedcba9876543210"]


def test_key_fingerprint_is_durable(durable_kind: str, tmp_path: Path) -> None:
    with open_store(durable_kind, tmp_path) as s:
        s.set_key_fingerprint("0123456789abcdef")
    with open_store(durable_kind, tmp_path) as s:
        assert s.key_fingerprints() == ["0123456789abcdef"]


def test_check_key_fingerprint_records_refuses_and_rotates(store: Store) -> None:
    a, b = Keyring(b"a" * 32).fingerprint(), Keyring(b"b" * 32).fingerprint()
    assert check_key_fingerprint(store, a, rotate=False, where="t").outcome is Check.NEW
    assert check_key_fingerprint(store, a, rotate=False, where="t").outcome is Check.SAME
    with pytest.raises(SecretMismatchError) as err:
        check_key_fingerprint(store, b, rotate=False, where="the test dir")
    message = str(err.value)
    assert a in message and b in message and "--rotate-secret" in message
    assert "the test dir" in message
    assert store.key_fingerprints() == [a]  # a refusal writes nothing
    rotated = check_key_fingerprint(store, b, rotate=True, where="t")
    assert rotated.outcome is Check.ROTATED and rotated.previous == (a,)
    assert store.key_fingerprints() == [b]


def test_rocks_fingerprint_goes_through_the_changelog_and_is_restored(tmp_path: Path) -> None:
    log = RecordingChangelog()
    with RocksStore(tmp_path / "a", changelog=log) as a:
        a.put_many(batch(0, 100))
        a.set_key_fingerprint("0123456789abcdef")
    with RocksStore(tmp_path / "b") as b:
        assert b.restore(iter(log.entries)) == 101
        assert b.key_fingerprints() == ["0123456789abcdef"]
        assert b.count() == 100 and len(list(b.items())) == 100


def test_count_prefix_counts_the_group_registry_only(durable_kind: str, tmp_path: Path) -> None:
    # respondent digests on both sides of b"group:" in key order, and look-alike prefixes
    entries = {**batch(0, 40), b"group:a": b"1", b"group:3.b": b"2", b"groupX": b"3", b"grou": b"4"}
    with open_store(durable_kind, tmp_path) as s:
        s.put_many(entries)
        want = sum(1 for k in entries if k.startswith(b"group:"))
        assert s.count_prefix(b"group:") == want == 2
        assert s.count() == len(entries)
