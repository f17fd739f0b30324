"""Sticky draws in the respondents' states: a drawing mechanism looks up each respondent's
stored publication of a value (by the value's keyed digest) and stores its fresh draws, so the
same true value republishes the same draw. States are plain dicts, ``state[kind][attribute]
[value digest] -> stored publication``; the engine reads and writes them, mechanisms only see
them through :class:`StoredLookup` and :class:`DrawnStates`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any, Protocol

_NOTHING: Mapping[str, Any] = {}  # the default of chained look-ups; never written to


class DrawnStates(Protocol):
    """Where a window's fresh draws go (the engine's view of the respondents' states):
    ``sticky``, whether draws are keyed and republished at all; ``keep_drawn``, how fresh
    draws are stored (:func:`store_drawn` into respondent states, or a panel's draw table)."""

    sticky: bool

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
    ) -> None: ...


class StatesView(Protocol):
    """Respondent states as maps, and the keys a window changed (:func:`store_drawn`)."""

    states: dict[bytes, dict[str, Any]]
    touched: set[bytes]


class StoredDraws(Protocol):
    """Each record's stored publications: ``keys``, the records' respondent keys."""

    keys: Sequence[bytes | None]

    def found(self, kind: str, name: str, digests: Sequence[tuple[bytes, str]]) -> list[Any]:
        """Each record's stored publication of its value (by digest) of ``name``; None:
        none."""
        ...


class StoredLookup:
    """Each record's stored publications, by kind ("rr", "noise") and attribute (by value
    digest; empty: none stored): the respondents' states are looked up once per window and
    each kind once, not once per attribute."""

    __slots__ = ("_kinds", "_states", "keys")

    def __init__(
        self, states: Mapping[bytes, Mapping[str, Any]], keys: Sequence[bytes | None]
    ) -> None:
        self.keys = keys  # the records' respondent keys (None: no respondent id)
        nothing = _NOTHING
        self._states = [nothing if key is None else states.get(key, nothing) for key in keys]
        self._kinds: dict[str, list[Mapping[str, Any]]] = {}

    def maps(self, kind: str, name: str) -> list[Mapping[str, Any]]:
        # map(dict.get, ...) walks the records in C (states and their maps are dicts)
        of_kind = self._kinds.get(kind)
        if of_kind is None:
            of_kind = self._kinds[kind] = list(
                map(dict.get, self._states, repeat(kind), repeat(_NOTHING))  # type: ignore[arg-type]
            )
        return list(map(dict.get, of_kind, repeat(name), repeat(_NOTHING)))  # type: ignore[arg-type]

    def found(self, kind: str, name: str, digests: Sequence[tuple[bytes, str]]) -> list[Any]:
        maps = self.maps(kind, name)
        if len(maps) != len(digests):
            raise ValueError("found: one value digest per record")
        # the look-ups walked in C (map)
        return list(map(dict.get, maps, [hexed for _, hexed in digests]))  # type: ignore[arg-type]


def publications(drawn: Sequence[Any], version: str | None) -> Sequence[Any]:
    """What is stored of each fresh draw: ``[value, version]`` with a mechanism version
    (randomized response's matrix), else the value."""
    return drawn if version is None else [[value, version] for value in drawn]


def store_drawn(
    view: StatesView,
    kind: str,
    name: str,
    *,
    keys: Sequence[bytes | None],
    digests: Sequence[tuple[bytes, str]],
    fresh: Sequence[int],
    drawn: Sequence[Any],
    version: str | None = None,
) -> None:
    """Remember each respondent's fresh publication of a value (by its digest), so that the
    same value republishes it: ``[value, version]`` with a mechanism version (randomized
    response's matrix), else the value."""
    states = view.states
    stored = publications(drawn, version)
    # one look-up of the respondent's map per key (inlined: this runs once per fresh draw); a
    # respondent without a state (every one of a first wave) gets its nested maps in one go
    maps: dict[bytes, dict[str, Any]] = {}
    for i, value in zip(fresh, stored, strict=True):
        key = keys[i]
        if key is None:
            continue
        values = maps.get(key)
        if values is None:
            state = states.get(key)
            if state is None:
                values = {}
                states[key] = {kind: {name: values}}
            else:
                by_name = state.get(kind)
                if by_name is None:
                    values = {}
                    state[kind] = {name: values}
                else:
                    values = by_name.get(name)
                    if values is None:
                        values = by_name[name] = {}
            maps[key] = values
        values[digests[i][1]] = value
    view.touched.update(maps)


def stored_map(
    states: dict[bytes, dict[str, Any]], key: bytes, kind: str, name: str
) -> dict[str, Any]:
    """The respondent's stored values of ``kind`` for ``name``, created if absent."""
    state = states.get(key)
    if state is None:
        state = states[key] = {}
    by_name = state.get(kind)
    if by_name is None:
        by_name = state[kind] = {}
    values = by_name.get(name)
    if values is None:
        values = by_name[name] = {}
    return values
