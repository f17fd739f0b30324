"""Ageing an absent member's categories by the wave-to-wave transitions of those present in
both waves.

The transition of a categorical tuple (the k claim's nominal part, taken whole so that an aged
tuple is one somebody really moved to: a marriage moves marital status and relationship
together) is estimated from the members who answered the previous wave and this one. An absent
member whose last tuple is ``c`` takes the current tuple of a donor drawn, by its keyed uniform,
among those who had ``c`` in the previous wave; with no such donor it keeps ``c``. In aggregate
the imputed tuples then move as the present ones did.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.engine.records import take_at

Combo = tuple[object, ...]


@dataclass(slots=True)
class Transitions:
    """Observed moves, previous tuple -> the current tuples of those who had it."""

    donors: dict[Combo, list[Combo]] = field(default_factory=dict)

    def observe(self, before: Combo, after: Combo) -> None:
        self.donors.setdefault(before, []).append(after)

    def freeze(self) -> None:
        """A canonical order per previous tuple, so a draw picks the same donor on a replay."""
        reprs: dict[Combo, str] = {}  # a few distinct tuples among many moves: repr'd once

        def canonical(combo: Combo) -> str:
            text = reprs.get(combo)
            if text is None:
                text = reprs[combo] = repr(combo)
            return text

        for before, after in self.donors.items():
            after.sort(key=canonical)
            self.donors[before] = after

    @property
    def pairs(self) -> int:
        return sum(len(v) for v in self.donors.values())

    def age(self, last: Sequence[Combo], uniforms: Sequence[float]) -> list[Combo]:
        """Each absent member's tuple one wave on (``uniforms``: its keyed draws in [0, 1))."""
        out: list[Combo] = []
        for combo, u in zip(last, uniforms, strict=True):
            pool = self.donors.get(combo)
            out.append(pool[min(int(u * len(pool)), len(pool) - 1)] if pool else combo)
        return out


def split_row(row: Sequence[object], numeric: Sequence[bool]) -> Combo:
    """The nominal part of a claim row."""
    return _nominal(tuple(numeric))(row)


def nominal_of(numeric: Sequence[bool]) -> Callable[[Sequence[object]], Combo]:
    """:func:`split_row` for these columns, as one function (looked up once for many rows)."""
    return _nominal(tuple(numeric))


@functools.cache
def _nominal(numeric: tuple[bool, ...]) -> Callable[[Sequence[object]], Combo]:
    """A function taking a claim row's nominal part (itemgetter: in C, for every record)."""
    return take_at([j for j, is_num in enumerate(numeric) if not is_num])


def with_combo(row: Sequence[object], numeric: Sequence[bool], combo: Combo) -> list[object]:
    """The claim row with its nominal part replaced by ``combo``."""
    it = iter(combo)
    return [v if is_num else next(it) for v, is_num in zip(row, numeric, strict=True)]
