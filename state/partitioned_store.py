"""PartitionedStore: one RocksStore per input partition, each written through its changelog.

The engine runs with ``partition_scope`` and names every key's partition
(``gateway.state_store.state_keys.state_key_partition``); this store routes each key to the store of
that partition. A worker opens a partition's store when the partition is assigned to it — after
rebuilding it from the changelog — and closes it when the partition is revoked, so the state of
a partition lives with the worker that owns the partition.

``put_many`` writes one batch per partition, in partition order. A crash between two of them
leaves some partitions' state ahead of the others; that is harmless because groups are formed
within one partition: the replayed window finds the written partitions' respondents with their
stored values (the same ones) and forms the other partitions' groups exactly as before.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gateway.state_store.state_keys import state_key_partition
from state.changelog import ChangelogWriter
from state.errors import StateStoreError, check_entries, check_keys
from state.rocks_store import RocksStore


class PartitionedStore:
    """``gateway.state_store.state_api.StateStore`` over the stores of the partitions this worker
    owns."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        changelog_for: Callable[[int], ChangelogWriter | None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        self.changelog_for = changelog_for
        self._stores: dict[int, RocksStore] = {}
        self._lock = threading.Lock()

    def _path(self, partition: int) -> Path:
        return self.root / f"partition-{partition}"

    def open_partition(self, partition: int, *, fresh: bool = True) -> RocksStore:
        """Open the local store of ``partition``; ``fresh`` empties it first (it is then
        rebuilt from the changelog, the source of truth)."""
        with self._lock:
            if partition in self._stores:
                return self._stores[partition]
            path = self._path(partition)
            if fresh and path.exists():
                shutil.rmtree(path)
            changelog = self.changelog_for(partition) if self.changelog_for else None
            store = RocksStore(path, changelog=changelog)
            self._stores[partition] = store
            return store

    def close_partition(self, partition: int) -> None:
        with self._lock:
            store = self._stores.pop(partition, None)
        if store is not None:
            store.close()

    @property
    def partitions(self) -> list[int]:
        with self._lock:
            return sorted(self._stores)

    def _route(self, keys: Sequence[bytes]) -> dict[int, list[bytes]]:
        routed: dict[int, list[bytes]] = {}
        for key in keys:
            partition = state_key_partition(key)
            if partition is None:
                raise StateStoreError(
                    "a state key without a partition reached the partitioned store; "
                    "run the engine with partition_scope"
                )
            routed.setdefault(partition, []).append(key)
        return routed

    def _store(self, partition: int) -> RocksStore:
        store = self._stores.get(partition)
        if store is None:
            raise StateStoreError(
                f"partition {partition} is not assigned to this worker (its store is not open)"
            )
        return store

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        check_keys(keys)
        out: dict[bytes, bytes] = {}
        for partition, part_keys in sorted(self._route(keys).items()):
            out.update(self._store(partition).get_many(part_keys))
        return out

    def put_many(self, entries: Mapping[bytes, bytes]) -> None:
        check_entries(entries)
        routed = self._route(list(entries))
        stores = {p: self._store(p) for p in routed}  # all open, or nothing is written
        for partition in sorted(routed):
            stores[partition].put_many({k: entries[k] for k in routed[partition]})

    def count(self) -> int:
        with self._lock:
            stores = list(self._stores.values())
        return sum(s.count() for s in stores)

    def count_prefix(self, prefix: bytes) -> int:
        with self._lock:
            stores = list(self._stores.values())
        return sum(s.count_prefix(prefix) for s in stores)

    def key_fingerprints(self) -> list[str | None]:
        """Of the partitions open here (each restored with its fingerprint from the
        changelog)."""
        return self.view(self.partitions).key_fingerprints()

    def set_key_fingerprint(self, fingerprint: str) -> None:
        self.view(self.partitions).set_key_fingerprint(fingerprint)

    def view(self, partitions: Sequence[int]) -> PartitionsView:
        """Some open partitions' stores, for checking the ones just assigned."""
        with self._lock:
            return PartitionsView([self._store(p) for p in sorted(partitions)])

    def close(self) -> None:
        for partition in self.partitions:
            self.close_partition(partition)

    def __repr__(self) -> str:
        return f"PartitionedStore({str(self.root)!r}, partitions={self.partitions})"


class PartitionsView:
    """``gateway.state_store.state_api.KeyFingerprintStore`` over some partitions' stores."""

    def __init__(self, stores: Sequence[RocksStore]) -> None:
        self.stores = list(stores)

    def key_fingerprints(self) -> list[str | None]:
        return [f for s in self.stores for f in s.key_fingerprints()]

    def set_key_fingerprint(self, fingerprint: str) -> None:
        for s in self.stores:
            s.set_key_fingerprint(fingerprint)  # through each partition's changelog
