"""PartitionedStore: keys go to the store of the partition they name; a partition that is not
open (not assigned to this worker) is an error, and a batch touching one writes nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from state.errors import StateStoreError
from state.partitioned_store import PartitionedStore


def _key(partition: int, i: int) -> bytes:
    return partition.to_bytes(2, "big") + hashlib.sha256(b"%d" % i).digest()


def test_keys_are_routed_to_their_partition_and_survive_a_reopen(tmp_path: Path) -> None:
    store = PartitionedStore(tmp_path)
    for p in (0, 3):
        store.open_partition(p)
    entries = {_key(p, i): b"v%d" % i for p in (0, 3) for i in range(10)}
    entries[b"group:3.abc"] = b'{"live":5}'
    store.put_many(entries)
    assert store.count() == 21
    assert store.get_many(list(entries)) == entries
    store.close_partition(3)
    assert store.partitions == [0]
    with pytest.raises(StateStoreError, match="partition 3 is not assigned"):
        store.get_many([_key(3, 1)])
    reopened = store.open_partition(3, fresh=False)
    assert reopened.count() == 11  # its own respondents and its group, nothing of partition 0
    store.close()


def test_a_batch_for_a_partition_not_open_writes_nothing(tmp_path: Path) -> None:
    store = PartitionedStore(tmp_path)
    store.open_partition(0)
    with pytest.raises(StateStoreError, match="partition 1 is not assigned"):
        store.put_many({_key(0, 1): b"a", _key(1, 1): b"b"})
    assert store.count() == 0
    with pytest.raises(StateStoreError, match="without a partition"):
        store.put_many({hashlib.sha256(b"x").digest(): b"c"})
    store.close()
