"""In-memory StateStore for unit tests: a dict, not durable beyond the process."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType

from state.errors import check_entries


class MemoryStore:
    """``StateStore`` over a dict. Batches are atomic (checked before any write); thread-safe."""

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._lock = threading.Lock()
        self._fingerprint: str | None = None
        self._meta: dict[str, str] = {}

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        data = self._data
        return {k: data[k] for k in keys if k in data}

    def put_many(self, entries: Mapping[bytes, bytes]) -> None:
        check_entries(entries)
        with self._lock:
            self._data.update(entries)

    def count(self) -> int:
        return len(self._data)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """All entries (a snapshot), for inspection and tests."""
        with self._lock:
            return iter(list(self._data.items()))

    def key_fingerprints(self) -> list[str | None]:
        return [self._fingerprint]

    def set_key_fingerprint(self, fingerprint: str) -> None:
        self._fingerprint = fingerprint

    def meta(self, name: str) -> str | None:
        """A fact about the state (``SQLiteStore.meta``), e.g. its draw derivation."""
        return self._meta.get(name)

    def set_meta(self, name: str, value: str) -> None:
        self._meta[name] = value

    def rotate_key_fingerprint(self, fingerprint: str) -> int:
        with self._lock:
            dropped = len(self._data)
            self._data.clear()
        self._fingerprint = fingerprint
        return dropped

    def close(self) -> None:
        pass

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
