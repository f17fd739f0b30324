"""Documents an engine keeps decoded between windows, each with the bytes the store holds for
it, so that one read again as those same bytes is not decoded again (the panel's rosters:
``gateway.panel.roster.KeptRosters``).

A kept document is used only when the store returns exactly the bytes it was read or written
as: another engine's write (a partition that moved away and back), an erasure or a restore from
a backup give other bytes, or none, and it is decoded from the store as before. It is taken out
while a window works on it and kept again only after the window's write is durable, so a window
that fails midway leaves nothing stale.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from gateway.state_store.state_keys import state_key_partition

T = TypeVar("T")


class KeptByKey(Generic[T]):
    """Documents an engine keeps decoded between windows, each with the bytes the store held
    for it at its key."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[bytes, tuple[bytes, T]] = {}

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def partitions(self) -> set[int | None]:
        """The state partitions of what is kept (None: an engine without partitions)."""
        return {state_key_partition(key) for key in self._kept}

    def forget(self, partition: int) -> int:
        """Drop what is kept of a state partition gone to another worker (its worker lost the
        input partition): it would be read afresh on its return anyway, and a worker that many
        partitions pass through would otherwise hold every one. How many."""
        gone = [key for key in self._kept if state_key_partition(key) == partition]
        for key in gone:
            del self._kept[key]
        return len(gone)
