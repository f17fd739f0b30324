"""Which backend a state directory holds, and which SQLite files hold a worker's state: one,
or one per engine shard.

The backend is read from the directory itself (:func:`resolve_backend`): the sqlite backend's
``state*.db`` files, or the partitioned backend's ``partitions/`` (local stores rebuilt from the
changelog) and ``policy-record.json``. Every command that opens a state directory asks it, so
that one given the other backend's directory is refused before anything is written there.

One shard (the default) keeps its state in ``state.db``, as before sharding existed; N shards
in ``state.shard-I-of-N.db`` (I = 0..N-1), one file per engine process
(:mod:`gateway.engine.shards`). A respondent's state lives in the file its shard names, so a state
directory can only be opened with the shard count it was created with.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path

from state.errors import StateStoreError

__all__ = [
    "PARTITIONED_RECORD",
    "PARTITIONS_DIR",
    "SINGLE",
    "Backend",
    "resolve_backend",
    "resolve_shards",
    "shard_paths",
    "stored_backend",
    "stored_shards",
]

SINGLE = "state.db"
PARTITIONS_DIR = "partitions"  # the partitioned backend's local stores
PARTITIONED_RECORD = "policy-record.json"  # the partitioned backend's policy record


class Backend(StrEnum):
    SQLITE = "sqlite"
    PARTITIONED = "partitioned"


def stored_backend(state_dir: Path) -> Backend | None:
    """The backend whose state ``state_dir`` holds; None when it holds no state yet."""
    sqlite = stored_shards(state_dir) is not None
    partitioned = (state_dir / PARTITIONS_DIR).is_dir() or (
        state_dir / PARTITIONED_RECORD
    ).is_file()
    if sqlite and partitioned:
        raise StateStoreError(
            f"state dir {state_dir} holds state of both backends (state*.db files and "
            f"{PARTITIONS_DIR}/ or {PARTITIONED_RECORD}): a worker's state is one backend's; "
            "move the files that do not belong to it elsewhere"
        )
    if sqlite:
        return Backend.SQLITE
    return Backend.PARTITIONED if partitioned else None


def resolve_backend(state_dir: Path, requested: str | None) -> Backend:
    """The backend to open ``state_dir`` with: ``requested``, which must be the one whose
    state is there; None: that one, or sqlite (the default) for a new state."""
    stored = stored_backend(state_dir)
    if requested is None:
        return stored or Backend.SQLITE
    wanted = Backend(requested)
    if stored is not None and stored is not wanted:
        files = f"{SINGLE} or its shards" if stored is Backend.SQLITE else f"{PARTITIONS_DIR}/"
        raise StateStoreError(
            f"state dir {state_dir} holds the {stored.value} backend's state ({files}), but "
            f"the state backend is {wanted.value}: use --state-backend {stored.value} "
            f"(PRIVGW_STATE_BACKEND={stored.value}), or give the other backend's --state-dir. "
            "Nothing was written"
        )
    return wanted


_SHARD = re.compile(r"state\.shard-(\d+)-of-(\d+)\.db")


def shard_paths(state_dir: Path, shards: int) -> list[Path]:
    if shards == 1:
        return [state_dir / SINGLE]
    return [state_dir / f"state.shard-{i}-of-{shards}.db" for i in range(shards)]


def stored_shards(state_dir: Path) -> int | None:
    """The shard count of the state in ``state_dir``; None when it holds no state yet."""
    found = [
        (int(m.group(1)), int(m.group(2)))
        for p in _files(state_dir)
        if (m := _SHARD.fullmatch(p.name))
    ]
    counts = {n for _, n in found}
    if (state_dir / SINGLE).is_file():
        counts.add(1)
    if len(counts) > 1:
        raise StateStoreError(
            f"state dir {state_dir} holds state for {_shards(sorted(counts))}; a worker's "
            "state is one layout: move the files that do not belong to it elsewhere"
        )
    if not counts:
        return None
    shards = counts.pop()
    if shards > 1 and sorted(i for i, _ in found) != list(range(shards)):
        # a shard's file gone is its respondents' state gone: not to be recreated quietly
        names = shard_paths(state_dir, shards)
        missing = [p.name for p in names if not p.is_file()]
        problem = (
            f"lacks {', '.join(missing)}"
            if missing
            else f"has shard files besides {names[0].name} .. {names[-1].name}"
        )
        raise StateStoreError(
            f"state dir {state_dir} holds state for {_shards([shards])} but {problem}: "
            "restore the files, or start from a new --state-dir"
        )
    return shards


def resolve_shards(state_dir: Path, requested: int | None) -> int:
    """The shard count to open ``state_dir`` with: ``requested``, which must match the state
    already there; None: the state's own count, or 1 for a new state."""
    stored = stored_shards(state_dir)
    if requested is None:
        return stored or 1
    if stored is not None and stored != requested:
        raise StateStoreError(
            f"engine_shards is {requested}, but state dir {state_dir} holds state for "
            f"{_shards([stored])}: respondents' state is where their shard put it. Set "
            f"PRIVGW_ENGINE_SHARDS / --engine-shards to {stored} (or leave it unset), or "
            "start from a new --state-dir"
        )
    return requested


def _files(state_dir: Path) -> list[Path]:
    return list(state_dir.iterdir()) if state_dir.is_dir() else []


def _shards(counts: list[int]) -> str:
    return " and ".join(f"{n} engine shard" + ("s" if n > 1 else "") for n in counts)
