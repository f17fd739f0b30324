"""Which SQLite files hold a worker's state (state.layout): one layout per state dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from state.errors import StateStoreError
from state.layout import resolve_shards, shard_paths, stored_shards


def _touch(paths: list[Path]) -> None:
    for p in paths:
        p.write_bytes(b"")


def test_one_shard_keeps_the_file_it_always_had(tmp_path: Path) -> None:
    assert shard_paths(tmp_path, 1) == [tmp_path / "state.db"]
    names = [p.name for p in shard_paths(tmp_path, 3)]
    assert names == [f"state.shard-{i}-of-3.db" for i in range(3)]


def test_a_new_state_dir_takes_what_is_asked_or_one(tmp_path: Path) -> None:
    assert stored_shards(tmp_path / "absent") is None
    assert resolve_shards(tmp_path, None) == 1
    assert resolve_shards(tmp_path, 4) == 4


def test_an_existing_state_dir_keeps_its_shard_count(tmp_path: Path) -> None:
    _touch(shard_paths(tmp_path, 2))
    (tmp_path / "state.shard-0-of-2.db-wal").write_bytes(b"")  # SQLite's files do not count
    assert stored_shards(tmp_path) == 2
    assert resolve_shards(tmp_path, None) == 2
    assert resolve_shards(tmp_path, 2) == 2
    with pytest.raises(StateStoreError, match=r"engine_shards is 3.*2 engine shards.*to 2"):
        resolve_shards(tmp_path, 3)


def test_single_file_state_refuses_shards(tmp_path: Path) -> None:
    _touch(shard_paths(tmp_path, 1))
    with pytest.raises(StateStoreError, match=r"1 engine shard\b.*--engine-shards"):
        resolve_shards(tmp_path, 2)


def test_two_layouts_in_one_dir_are_an_error(tmp_path: Path) -> None:
    _touch(shard_paths(tmp_path, 1) + shard_paths(tmp_path, 2))
    with pytest.raises(StateStoreError, match="1 engine shard and 2 engine shards"):
        stored_shards(tmp_path)


def test_a_missing_shard_file_is_not_recreated_quietly(tmp_path: Path) -> None:
    paths = shard_paths(tmp_path, 3)
    _touch([paths[0], paths[2]])
    with pytest.raises(StateStoreError, match=r"lacks state\.shard-1-of-3\.db.*restore"):
        resolve_shards(tmp_path, None)
