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

from collections.abc import Sequence
from dataclasses import dataclass, field

Combo = tuple[object, ...]


@dataclass(slots=True)
class Transitions:
    """Observed moves, previous tuple -> the current tuples of those who had it."""

    donors: dict[Combo, list[Combo]] = field(default_factory=dict)

    def observe(self, before: Combo, after: Combo) -> None:
        self.donors.setdefault(before, []).append(after)

    def observe_many(self, before: Sequence[Combo], after: Sequence[Combo]) -> None:
        """:meth:`observe` of each pair, in order."""
        donors = self.donors
        for b, a in zip(before, after, strict=True):
            held = donors.get(b)
            if held is None:
                donors[b] = [a]
            else:
                held.append(a)

    def freeze(self) -> None:
        """A canonical order per previous tuple, so a draw picks the same donor on a replay:
        by each tuple's text, repr'd once (a few distinct tuples among many moves; equal
        tuples share the text of the first one met, in the lists' order)."""
        reprs: dict[Combo, str] = {}
        for after in self.donors.values():
            for combo in after:
                if combo not in reprs:
                    reprs[combo] = repr(combo)
        key = reprs.__getitem__  # in C
        for after in self.donors.values():
            after.sort(key=key)

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
