"""Respondents' decoded states kept by an engine between windows, each with the bytes the store
holds for it, so that a state read again as those same bytes is not decoded again (a panel
wave reads every member's state: decoding was ~2.5 µs a member, about 5 % of a returning wave).

A kept state is used only when the store returns exactly the bytes it was read or written as:
another engine's write (a partition that moved away and back), an erasure or a restore from a
backup give other bytes, or none, and the state is decoded from the store as before. A state is
taken out while a window works on it and kept again only after the window's write is durable,
so a window that fails midway leaves nothing stale. A state written by the window is kept as
the document it encoded (MessagePack with sorted keys gives the same document back, its keys
in sorted order; nothing reads a state's keys in order).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from gateway.state_store.state_codec import decode_state
from gateway.state_store.state_keys import state_key_partition

# states kept at most (~2.4 KiB each for a panel member's sticky draws, its bytes included:
# ~600 MiB); past it the whole set is dropped and filled again, as the engine's digest caches are
KEPT_STATES_LIMIT = 1 << 18

T = TypeVar("T")


class KeptByKey(Generic[T]):
    """Documents an engine keeps decoded between windows, each with the bytes the store held
    for it at its key (:class:`KeptStates`; the panel's ``KeptRosters``)."""

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


class KeptStates(KeptByKey[dict[str, Any]]):
    """The kept states of one engine (see the module docstring); ``limit`` 0 keeps none."""

    __slots__ = ("_read", "limit")

    def __init__(self, limit: int = KEPT_STATES_LIMIT) -> None:
        if limit < 0:
            raise ValueError(f"the kept states' limit must be >= 0, got {limit}")
        super().__init__()
        self.limit = limit
        self._read: Mapping[bytes, bytes] = {}

    def decoded(self, found: Mapping[bytes, bytes]) -> dict[bytes, dict[str, Any]]:
        """The states of the entries the store returned (key -> bytes): a kept one where the
        bytes are the ones it was kept with, else decoded."""
        kept = self._kept
        out: dict[bytes, dict[str, Any]] = {}
        for key, raw in found.items():
            held = kept.pop(key, None)
            out[key] = held[1] if held is not None and held[0] == raw else decode_state(raw)
        self._read = found
        return out

    def written(
        self, states: Mapping[bytes, dict[str, Any]], entries: Mapping[bytes, bytes]
    ) -> None:
        """The window's write is durable: ``entries`` (key -> bytes) are stored; keep each of
        ``states`` (the window's, read or new) with the bytes the store now holds for it."""
        read, self._read = self._read, {}
        if len(self._kept) + len(states) > self.limit:
            self._kept.clear()
            if len(states) > self.limit:
                return
        kept = self._kept
        for key, state in states.items():
            raw = entries.get(key)
            if raw is None:
                raw = read.get(key)
            if raw is not None:
                kept[key] = (raw, state)
