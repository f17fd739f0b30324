"""RocksStore: the partitioned backend for scale-out (one RocksDB per Kafka partition).

A partition's state lives in a local RocksDB (rocksdict, raw bytes mode — never pickle) and,
when a ``ChangelogWriter`` is given, in a changelog topic, which is the source of truth when the
partition moves to another worker: the new owner rebuilds its local copy with ``restore``.

``put_many`` order: changelog first, then the local store. The changelog must never be *behind*
a local store, because a local store may be thrown away (partition moved, disk lost) and
rebuilt from the changelog alone:
- crash after the changelog write, before the local write: ``put_many`` did not return, so no
  output depending on the batch was produced; the local copy lags, and is caught up from the
  changelog on restart/reassignment (or overwritten by the replayed batch). Nothing diverges.
- the other order, crash between the two: the local copy holds state the changelog never got.
  This worker would go on using it, while a worker that takes the partition over would not
  have it — two histories for the same respondents (e.g. different centroids).
So the local write is a cache of the changelog, never ahead of it.

Durability: the local batch is one ``WriteBatch`` written with ``sync=True`` (WAL fsynced), so it
is atomic and survives kill -9 and power loss when ``put_many`` returns.

Count: an exact respondent count is kept in a separate column family (``privgw_meta``), updated
in the same WriteBatch as the rows (a multi-get of the batch's keys tells which are new). The
data column family holds nothing but respondent entries, so any key is allowed and iteration
needs no filtering.

Threads: RocksDB is thread-safe. Writers are serialised by ``_writing``, held across the
changelog's acknowledgement; ``_lock`` guards the database handle and the count (read-modify-
write) and is held only for local reads and writes. So a reader on another thread (a metrics
scrape, the worker's event loop, which the changelog itself sends on) never waits for the
broker: with one lock it did, and the engine's write, waiting for the event loop, and the event
loop, waiting for the lock, stalled each other until the changelog's timeout. One process per
directory (RocksDB's own LOCK file enforces it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import cast

from rocksdict import ColumnFamily, Options, Rdict, WriteBatch, WriteOptions

from state.changelog import FINGERPRINT_ENTRY, META_ENTRY_PREFIX, ChangelogWriter
from state.errors import StateStoreError, check_entries, check_entry

_META_CF = "privgw_meta"
_COUNT_KEY = b"respondents"
_FINGERPRINT_KEY = b"key_fingerprint"  # in the meta column family
_META_KEY = b"meta/"  # + name: set_meta's facts, in the meta column family
# the fingerprint's changelog entry (state.changelog.FINGERPRINT_ENTRY) restores it with the
# rows; no engine key looks like it (respondent keys are digests, group keys "group:…")
_RESTORE_CHUNK = 10_000


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_keep_log_file_num(2)
    return opts


class RocksStore:
    """``gateway.state_store.state_api.StateStore`` on a RocksDB directory (see the module
    docstring)."""

    def __init__(
        self, path: str | os.PathLike[str], *, changelog: ChangelogWriter | None = None
    ) -> None:
        self.path = Path(path)
        self._changelog = changelog
        self._writing = threading.Lock()  # one writer; taken before _lock, never inside it
        self._lock = threading.Lock()
        self.path.mkdir(parents=True, exist_ok=True)
        os.chmod(self.path, 0o700)  # RocksDB creates its files 0644; keep others out of the dir
        try:
            self._db: Rdict | None = Rdict(
                str(self.path),
                options=_options(),
                column_families={_META_CF: Options(raw_mode=True)},
            )
        except Exception as exc:  # rocksdict raises plain Exception
            if "lock" in str(exc).lower():
                raise StateStoreError(
                    f"state store {self.path} is in use by another process "
                    "(only one worker may open it)"
                ) from None
            raise StateStoreError(f"cannot open state store {self.path}: {exc}") from None
        self._meta: Rdict | None = self._db.get_column_family(_META_CF)
        self._meta_cf: ColumnFamily | None = self._db.get_column_family_handle(_META_CF)
        self._sync = WriteOptions()
        self._sync.sync = True
        stored = self._meta.get(_COUNT_KEY)
        if isinstance(stored, bytes):
            self._count = int.from_bytes(stored, "big")
        else:  # new store (or one written without a count): count once and persist
            all_keys = self._db.keys()
            self._count = sum(1 for _ in all_keys)
            self._write({}, self._count)

    def _open(self) -> tuple[Rdict, Rdict]:
        if self._db is None or self._meta is None:
            raise StateStoreError(f"state store {self.path} is closed")
        return self._db, self._meta

    def _write(self, entries: Mapping[bytes, bytes], new_count: int) -> None:
        db, _ = self._open()
        batch = WriteBatch(raw_mode=True)
        for key, value in entries.items():
            batch.put(key, value)
        batch.put(_COUNT_KEY, new_count.to_bytes(8, "big"), self._meta_cf)
        db.write(batch, self._sync)
        self._count = new_count

    def _multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        db, _ = self._open()
        found = db.get(cast("list[str | int | float | bytes | bool]", keys))
        return cast("list[bytes | None]", found)

    def _new_keys(self, keys: list[bytes]) -> int:
        return sum(1 for v in self._multi_get(keys) if v is None)

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        keys = list(keys)
        if not keys:
            self._open()
            return {}
        return {k: v for k, v in zip(keys, self._multi_get(keys), strict=True) if v is not None}

    def put_many(self, entries: Mapping[bytes, bytes]) -> None:
        check_entries(entries)  # before the changelog: a bad batch goes nowhere
        if not entries:
            return
        with self._writing:
            self._open()
            if self._changelog is not None:
                self._changelog.write(entries)  # first: the changelog is never behind
            with self._lock:
                self._write(entries, self._count + self._new_keys(list(entries)))

    def restore(self, entries: Iterable[tuple[bytes, bytes]]) -> int:
        """Apply changelog entries in order (later ones win); return how many were read.

        Does not write to the changelog. Applied in synced batches of ``_RESTORE_CHUNK``.
        """
        applied = 0
        chunk: dict[bytes, bytes] = {}
        with self._writing, self._lock:
            for key, value in entries:
                check_entry(key, value)
                if key == FINGERPRINT_ENTRY:  # not a respondent: into the meta family
                    self._put_meta(_FINGERPRINT_KEY, value)
                    applied += 1
                    continue
                if key.startswith(META_ENTRY_PREFIX):
                    self._put_meta(_META_KEY + key[len(META_ENTRY_PREFIX) :], value)
                    applied += 1
                    continue
                chunk[key] = value
                applied += 1
                if len(chunk) >= _RESTORE_CHUNK:
                    self._write(chunk, self._count + self._new_keys(list(chunk)))
                    chunk = {}
            if chunk:
                self._write(chunk, self._count + self._new_keys(list(chunk)))
        return applied

    def count(self) -> int:
        self._open()
        return self._count

    def count_prefix(self, prefix: bytes) -> int:
        """Keys that start with ``prefix`` (the engine's group registry rows, for metrics): a
        seek to the prefix and a scan of its range only."""
        with self._lock:
            db, _ = self._open()
            n = 0
            for key in db.keys(from_key=prefix):
                if not bytes(key).startswith(prefix):
                    break
                n += 1
            return n

    def key_fingerprints(self) -> list[str | None]:
        _, meta = self._open()
        stored = meta.get(_FINGERPRINT_KEY)
        return [stored.decode() if isinstance(stored, bytes) else None]

    def set_key_fingerprint(self, fingerprint: str) -> None:
        """Changelog first, as every write: a store rebuilt from it gets the fingerprint too."""
        value = fingerprint.encode()
        with self._writing:
            self._open()
            if self._changelog is not None:
                self._changelog.write({FINGERPRINT_ENTRY: value})
            with self._lock:
                self._put_meta(_FINGERPRINT_KEY, value)

    def meta(self, name: str) -> str | None:
        """A fact about the partition's state (e.g. its draw derivation), restored with it."""
        _, meta = self._open()
        stored = meta.get(_META_KEY + name.encode())
        return stored.decode() if isinstance(stored, bytes) else None

    def set_meta(self, name: str, value: str) -> None:
        """Through the changelog first, as every write, so a restore brings it along."""
        raw = value.encode()
        with self._writing:
            self._open()
            if self._changelog is not None:
                self._changelog.write({META_ENTRY_PREFIX + name.encode(): raw})
            with self._lock:
                self._put_meta(_META_KEY + name.encode(), raw)

    def _put_meta(self, key: bytes, value: bytes) -> None:
        db, _ = self._open()
        batch = WriteBatch(raw_mode=True)
        batch.put(key, value, self._meta_cf)
        db.write(batch, self._sync)

    def keys(self) -> list[bytes]:
        """Every respondent and group key (a migration reads the registry rows first)."""
        db, _ = self._open()
        return [cast(bytes, key) for key in db.keys()]  # noqa: SIM118 (Rdict: no __iter__)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """All respondent entries in key order, for inspection, tests and hand-over."""
        db, _ = self._open()
        for key, value in db.items():
            yield cast(bytes, key), cast(bytes, value)

    def close(self) -> None:
        with self._writing, self._lock:  # after a write in flight, as before
            if self._db is not None:
                # column-family views and handles keep the DB (and its LOCK) alive: drop them
                self._meta = None
                self._meta_cf = None
                db, self._db = self._db, None
                db.close()

    def __enter__(self) -> RocksStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RocksStore({str(self.path)!r})"
