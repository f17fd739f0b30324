"""SQLiteStore: the default embedded, durable respondent state (one file per worker).

Durability: WAL journal with ``synchronous=FULL``, so the WAL is fsynced at every commit and
``put_many`` returns only once its batch survives a kill -9 of the process *and* a power loss.
(``NORMAL`` would also survive a kill -9 — the WAL is in the OS page cache — but could lose the
last commits on power loss, after the outputs that depend on them were produced. It was not
needed for throughput: measured the same within noise, see bench/state_store.py.)

Layout: ``state(id INTEGER PRIMARY KEY, key BLOB, value BLOB)`` with **no index on key**; the
key -> id map is held in memory (rebuilt on open by one scan: 0.6 s for 1,000,000 respondents,
~150 MB). Keys are HMAC digests, so an on-disk key index takes every insert to a random page:
a batch of 5,000 new respondents dirtied ~4,000 index pages, all fsynced through the WAL, which
capped puts at SQLite's own ~85-100k/s (bench/state_store.py, ``sqlite-raw-insert``). Here new
respondents are appended (consecutive ids, a few pages per batch) and existing ones updated in
place by id. Versions 1 and 2 (``respondent(key PRIMARY KEY, value)``) are copied over on open.

One transaction per ``put_many`` (``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any error,
including a bad entry found midway), so a batch is all-or-nothing. ``get_many`` queries
``id IN (?, …)`` in chunks of up to ``_GET_CHUNK`` ids (below the connection's variable limit).
The in-memory map changes only after a commit succeeded.

The file is opened in ``locking_mode=EXCLUSIVE``: a second process (a second worker by mistake)
cannot open the same store while this one has it open; SQLite then keeps the WAL index in
process memory, so there is no ``-shm`` file. Files are created 0600 (SQLite gives the ``-wal``
file the database file's mode).

Threads: the connection may be used from any thread (e.g. an executor), calls are serialised by
a lock. Not safe to share between processes (and the exclusive lock prevents it).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from state.errors import StateStoreError, check_entries, check_keys
from state.failures import os_error, sqlite_error

_SCHEMA_VERSION = 3
_GET_CHUNK = 4096
_CACHE_KIB = 128 * 1024
_WAL_AUTOCHECKPOINT_PAGES = 16384  # ~64 MiB of WAL between checkpoints (default: 1000)

_MMAP_BYTES = 1 << 30  # reads of hot pages without a copy into the page cache
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS state "
    "(id INTEGER PRIMARY KEY, key BLOB NOT NULL, value BLOB NOT NULL)",
    # facts about the state itself, apart from respondents (count and items never see them)
    "CREATE TABLE IF NOT EXISTS privgw_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
)
_FINGERPRINT = "key_fingerprint"  # gateway.state_store.state_api.KeyFingerprintStore
# versions 1 and 2 kept the key as an indexed primary key (1 also a count trigger)
_MIGRATE = (
    "INSERT INTO state (key, value) SELECT key, value FROM respondent ORDER BY rowid",
    "DROP TABLE respondent",
    "DROP TRIGGER IF EXISTS respondent_count",
    "DROP TABLE IF EXISTS meta",
)
_INSERT = "INSERT INTO state (id, key, value) VALUES (?, ?, ?)"
_UPDATE = "UPDATE state SET value = ? WHERE id = ?"


class SQLiteStore:
    """``gateway.state_store.state_api.StateStore`` on one SQLite file (see the module
    docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
        except OSError as err:  # named: path, condition, errno (state.failures)
            raise os_error(err, self.path, "state file") from None
        self._con: sqlite3.Connection | None = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=0.0
        )
        try:
            self._setup(self._con)
            limit = self._con.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
            self._chunk = max(1, min(_GET_CHUNK, limit))
            self._ids: dict[bytes, int] = {}
            for row_id, key in self._con.execute("SELECT id, key FROM state ORDER BY id"):
                self._ids[key] = row_id  # (a later row would win; put_many never writes one)
            row = self._con.execute("SELECT max(id) FROM state").fetchone()
            self._next_id = int(row[0] or 0) + 1
        except sqlite3.Error as exc:
            self._con.close()
            self._con = None
            if "locked" in str(exc):
                raise StateStoreError(
                    f"state store {self.path} is in use by another process "
                    "(only one worker may open it)"
                ) from None
            raise sqlite_error(exc, self.path, "opening it") from None

    @staticmethod
    def _setup(con: sqlite3.Connection) -> None:
        con.execute("PRAGMA locking_mode = EXCLUSIVE")
        mode = con.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"WAL journal not available (got {mode})")
        con.execute("PRAGMA synchronous = FULL")
        con.execute(f"PRAGMA cache_size = -{_CACHE_KIB}")
        con.execute(f"PRAGMA mmap_size = {_MMAP_BYTES}")
        con.execute(f"PRAGMA wal_autocheckpoint = {_WAL_AUTOCHECKPOINT_PAGES}")
        con.execute(f"PRAGMA journal_size_limit = {_WAL_AUTOCHECKPOINT_PAGES * 4096}")
        con.execute("BEGIN IMMEDIATE")  # takes the exclusive lock now, not at the first write
        try:
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, 1, 2, _SCHEMA_VERSION):
                raise sqlite3.OperationalError(f"unknown schema version {version}")
            for statement in _SCHEMA:
                con.execute(statement)
            if version in (1, 2):
                for statement in _MIGRATE:
                    con.execute(statement)
            if version != _SCHEMA_VERSION:  # an unconditional write would change a backup read
                con.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def _connection(self) -> sqlite3.Connection:
        if self._con is None:
            raise StateStoreError(f"state store {self.path} is closed")
        return self._con

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        check_keys(keys)
        out: dict[bytes, bytes] = {}
        with self._lock:
            con = self._connection()
            ids = self._ids
            wanted = sorted({i for k in keys if (i := ids.get(k)) is not None})
            chunk = self._chunk
            try:
                for start in range(0, len(wanted), chunk):
                    part = wanted[start : start + chunk]
                    marks = ",".join("?" * len(part))
                    sql = f"SELECT key, value FROM state WHERE id IN ({marks})"
                    out.update(con.execute(sql, part))
            except sqlite3.Error as exc:
                raise sqlite_error(exc, self.path, "reading respondents' state") from None
        return out

    def put_many(self, entries: Mapping[bytes, bytes]) -> None:
        if not entries:
            return
        check_entries(entries)  # before the transaction: a bad batch writes nothing
        with self._lock:
            con = self._connection()
            ids = self._ids
            updates: list[tuple[bytes, int]] = []
            inserts: list[tuple[int, bytes, bytes]] = []
            fresh: dict[bytes, int] = {}
            next_id = self._next_id
            for key, value in entries.items():
                row_id = ids.get(key)
                if row_id is None:
                    fresh[key] = next_id
                    inserts.append((next_id, key, value))
                    next_id += 1
                else:
                    updates.append((value, row_id))
            updates.sort(key=lambda u: u[1])  # page order
            try:
                con.execute("BEGIN IMMEDIATE")
                try:
                    if updates:
                        con.executemany(_UPDATE, updates)
                    if inserts:
                        con.executemany(_INSERT, inserts)
                    con.execute("COMMIT")
                except BaseException:
                    if con.in_transaction:
                        with contextlib.suppress(sqlite3.Error):  # the first error is the one
                            con.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise sqlite_error(exc, self.path, "writing a window's state") from None
            ids.update(fresh)  # only once the batch is durable
            self._next_id = next_id

    def count_prefix(self, prefix: bytes) -> int:
        """Keys that start with ``prefix`` (the engine's group registry rows, for metrics)."""
        with self._lock:
            self._connection()
            return sum(1 for key in self._ids if key.startswith(prefix))

    def count(self) -> int:
        with self._lock:
            self._connection()
            return len(self._ids)

    def key_fingerprints(self) -> list[str | None]:
        with self._lock:
            row = (
                self._connection()
                .execute("SELECT value FROM privgw_meta WHERE name = ?", (_FINGERPRINT,))
                .fetchone()
            )
        return [str(row[0]) if row is not None else None]

    def set_key_fingerprint(self, fingerprint: str) -> None:
        with self._lock:
            con = self._connection()
            con.execute("BEGIN IMMEDIATE")
            try:
                con.execute(
                    "INSERT OR REPLACE INTO privgw_meta (name, value) VALUES (?, ?)",
                    (_FINGERPRINT, fingerprint),
                )
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise

    def meta(self, name: str) -> str | None:
        """A fact about the state (``privgw_meta``), e.g. the policy it was written under."""
        with self._lock:
            row = (
                self._connection()
                .execute("SELECT value FROM privgw_meta WHERE name = ?", (name,))
                .fetchone()
            )
        return None if row is None else str(row[0])

    def set_meta(self, name: str, value: str) -> None:
        """Record a fact about the state; durable when it returns."""
        with self._lock:
            con = self._connection()
            try:
                con.execute("BEGIN IMMEDIATE")
                try:
                    con.execute(
                        "INSERT OR REPLACE INTO privgw_meta (name, value) VALUES (?, ?)",
                        (name, value),
                    )
                    con.execute("COMMIT")
                except BaseException:
                    if con.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            con.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise sqlite_error(exc, self.path, f"recording its {name}") from None

    def keys(self) -> list[bytes]:
        """Every key (a snapshot, in insertion order): batched reads of the whole state."""
        with self._lock:
            self._connection()
            return list(self._ids)

    def rotate_key_fingerprint(self, fingerprint: str) -> int:
        """Drop every entry and record ``fingerprint``, in one transaction; returns how many
        entries were dropped. After a secret rotation the entries are keyed by digests of the
        old secret, which no respondent reaches again: kept, they would be orphans."""
        with self._lock:
            con = self._connection()
            con.execute("BEGIN IMMEDIATE")
            try:
                dropped = len(self._ids)
                con.execute("DELETE FROM state")
                con.execute(
                    "INSERT OR REPLACE INTO privgw_meta (name, value) VALUES (?, ?)",
                    (_FINGERPRINT, fingerprint),
                )
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
            self._ids = {}
            return dropped

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """All entries (a snapshot, in key order), for inspection and tests."""
        with self._lock:
            rows = self._connection().execute("SELECT key, value FROM state ORDER BY key")
            return iter(rows.fetchall())

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()  # last connection: checkpoints and removes the WAL
                self._con = None
                self._ids = {}

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"
