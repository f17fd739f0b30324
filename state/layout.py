"""Which SQLite files hold a worker's state: one, or one per engine shard.

One shard (the default) keeps its state in ``state.db``, as before sharding existed; N shards
in ``state.shard-I-of-N.db`` (I = 0..N-1), one file per engine process
(:mod:`gateway.shards`). A respondent's state lives in the file its shard names, so a state
directory can only be opened with the shard count it was created with.
"""

from __future__ import annotations

import re
from pathlib import Path

from state.errors import StateStoreError

__all__ = ["SINGLE", "resolve_shards", "shard_paths", "stored_shards"]

SINGLE = "state.db"
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
