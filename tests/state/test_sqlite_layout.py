"""SQLiteStore specifics beyond the shared contract: the key -> id map survives a reopen, and
files of the earlier layouts (key as an indexed primary key) are migrated on open."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from state.sqlite_store import SQLiteStore


def _key(i: int) -> bytes:
    return hashlib.sha256(b"%d" % i).digest()


def test_reopened_store_updates_in_place_and_keeps_counting(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SQLiteStore(path) as s:
        s.put_many({_key(i): b"v1" for i in range(100)})
    with SQLiteStore(path) as s:
        s.put_many({_key(i): b"v2" for i in range(50, 150)})  # 50 updates, 50 new
        assert s.count() == 150
        got = s.get_many([_key(i) for i in range(150)])
    assert [got[_key(i)] for i in (0, 49, 50, 149)] == [b"v1", b"v1", b"v2", b"v2"]
    rows = sqlite3.connect(path).execute("SELECT count(*), count(DISTINCT key) FROM state")
    assert rows.fetchone() == (150, 150)  # updated in place, never a second row per key


def test_opening_and_reading_leaves_the_file_unchanged(tmp_path: Path) -> None:
    # state-check and policy diff read a state (often a backup copy): reading writes nothing
    path = tmp_path / "s.db"
    with SQLiteStore(path) as s:
        s.put_many({_key(i): b"v" for i in range(10)})
    before = path.read_bytes()
    with SQLiteStore(path) as s:
        assert s.count() == 10
        assert s.get_many([_key(3)]) == {_key(3): b"v"}
        assert s.meta("key_fingerprint") is None
    assert path.read_bytes() == before


def test_a_version_2_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE respondent (key BLOB PRIMARY KEY NOT NULL, value BLOB NOT NULL)")
    con.executemany(
        "INSERT INTO respondent VALUES (?, ?)", [(_key(i), b"old%d" % i) for i in range(20)]
    )
    con.execute("PRAGMA user_version = 2")
    con.commit()
    con.close()
    with SQLiteStore(path) as s:
        assert s.count() == 20
        assert s.get_many([_key(3)]) == {_key(3): b"old3"}
        s.put_many({_key(3): b"new", _key(99): b"x"})
        assert s.count() == 21
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert "respondent" not in tables
