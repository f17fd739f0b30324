"""A window's view of the respondents' states and of groups' live-member counts: read once
(the counts in one batch, through a loader the engine gives), changed by leaves and joins,
written back by the engine with the window."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.mechanisms.sticky import StoredLookup, store_drawn


@dataclass(slots=True)
class StateView:
    """The window's decoded respondent states and which of them the window changed."""

    states: dict[bytes, dict[str, Any]]
    sticky: bool
    touched: set[bytes] = field(default_factory=set)
    # group id -> live members (respondents currently published with its centroid), loaded
    # only for the groups the window's respondents leave or join: an unchanged respondent's
    # group is never read
    live: dict[str, int] = field(default_factory=dict)
    live_touched: set[str] = field(default_factory=set)
    # group id -> distinct respondents it was formed with (new groups, and registry entries read)
    sizes: dict[str, int] = field(default_factory=dict)
    load_live: Callable[[Sequence[str]], dict[str, tuple[int, int | None]]] | None = None
    looked_up: set[str] = field(default_factory=set)

    def lookup(self, keys: Sequence[bytes | None]) -> StoredLookup:
        """The stored publications of the records with these respondent keys."""
        return StoredLookup(self.states, keys)

    def keep_drawn(
        self,
        kind: str,
        name: str,
        *,
        keys: Sequence[bytes | None],
        digests: Sequence[tuple[bytes, str]],
        fresh: Sequence[int],
        drawn: Sequence[Any],
        version: str | None = None,
    ) -> None:
        store_drawn(
            self, kind, name, keys=keys, digests=digests, fresh=fresh, drawn=drawn, version=version
        )

    def prefetch(self, group_ids: Iterable[str]) -> None:
        """Read the live counts (and formation sizes) of these groups from the store, in one
        batch."""
        missing = sorted({g for g in group_ids if g not in self.looked_up})
        self.looked_up.update(missing)
        if missing and self.load_live is not None:
            for gid, (live, size) in self.load_live(missing).items():
                self.live[gid] = live
                if size is not None:
                    self.sizes.setdefault(gid, size)

    def members(self, group_id: str, default: int) -> int:
        """Live members of a group (read once from the store; ``default`` if it has no
        registry entry)."""
        if group_id not in self.looked_up:
            self.prefetch((group_id,))
        return self.live.get(group_id, default)

    def leave(self, group_id: str) -> None:
        self.live[group_id] = self.members(group_id, 0) - 1
        self.live_touched.add(group_id)

    def join(self, group_id: str) -> None:
        self.live[group_id] = self.members(group_id, 0) + 1
        self.live_touched.add(group_id)
