"""Ageing an absent member's carried values by the wave-to-wave moves of those present in
both waves, so that imputed values move as the present ones did.

* **The claim's categories** as one tuple (an aged tuple is one somebody really moved to: a
  marriage moves marital status and relationship together): an absent member whose last tuple
  is ``c`` takes the current tuple of a donor drawn, by its keyed uniform, among those who had
  ``c`` in the previous wave; with no such donor it keeps ``c``.
* **Each other categorical answer** (randomized ones among them) the same way, on its own.
* **Each number outside the claim** (noised ones among them): the change of a donor among
  those whose previous number was nearest its own.

Carried forward unchanged, an absent member's answers pulled the wave's estimates toward the
previous wave, and a published answer that changed told a present member.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from numpy.typing import NDArray

from gateway.panel.carried import Carried, CarryBlock, objects
from gateway.panel.roster import Roster

Combo = tuple[object, ...]
Value = Hashable  # what a move is observed on: a claim's tuple, or one answer
# (purpose, keys) -> one keyed uniform in [0, 1) per key
Uniforms = Callable[[str, Sequence[bytes]], list[float]]


@dataclass(slots=True)
class Transitions:
    """Observed moves, previous value -> the current values of those who had it (a value: the
    claim's categories as a tuple, or one categorical answer)."""

    donors: dict[Value, list[Value]] = field(default_factory=dict)

    def observe(self, before: Value, after: Value) -> None:
        self.donors.setdefault(before, []).append(after)

    def observe_many(self, before: Sequence[Value], after: Sequence[Value]) -> None:
        """:meth:`observe` of each pair, in order."""
        donors = self.donors
        for b, a in zip(before, after, strict=True):
            held = donors.get(b)
            if held is None:
                donors[b] = [a]
            else:
                held.append(a)

    def freeze(self) -> None:
        """A canonical order per previous value, so a draw picks the same donor on a replay:
        by each value's text, repr'd once (a few distinct values among many moves; equal
        values share the text of the first one met, in the lists' order)."""
        reprs: dict[Value, str] = {}
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

    def age(self, last: Sequence[Value], uniforms: Sequence[float]) -> list[Value]:
        """Each absent member's value one wave on (``uniforms``: its keyed draws in [0, 1))."""
        out: list[Value] = []
        for combo, u in zip(last, uniforms, strict=True):
            pool = self.donors.get(combo)
            out.append(pool[min(int(u * len(pool)), len(pool) - 1)] if pool else combo)
        return out


def age_absent(
    roster: Roster,
    absent: list[int],
    moves: tuple[Transitions, Mapping[str, Moves]],
    *,
    nominal: list[int],
    uniforms: Uniforms,
    wave: int,
) -> None:
    """The absent members' carried values one wave on: the claim's categories as a tuple
    (``nominal``: their positions in the claim), then each answer outside the claim on its own
    (categorical or a number), by the moves of those present in both waves. Aged answers
    change as often as the present ones did, so the wave's estimates are current; each is
    randomized with the member's own sticky draws."""
    if not absent:
        return
    claim, answers = moves
    draws = uniforms(f"panel/age/{wave}", [roster.keys[r] for r in absent])
    rows = np.asarray(absent, dtype=np.intp)
    aged = cast(list[Combo], claim.age(roster.carried.combos(rows, nominal), draws))
    for t, j in enumerate(nominal):
        roster.carried.set_claim(j, rows, [combo[t] for combo in aged])
    keys = [roster.keys[r] for r in absent]
    for name, moved in answers.items():
        column = roster.carried.values.get(name)
        if column is None or not moved.pairs:
            continue
        aged_values = moved.age(column[rows].tolist(), uniforms(f"panel/age/{wave}/{name}", keys))
        column[rows] = objects(aged_values)


def observe_moves(
    carried: Carried, rows: NDArray[np.intp], now: CarryBlock, answers: Mapping[str, Moves]
) -> None:
    """Each aged answer's moves: its value carried at ``rows`` (last wave's) -> ``now``."""
    names = carried.names[now.names_id]
    for name, moves in answers.items():
        old = carried.values.get(name)
        before = [None] * rows.size if old is None else old[rows].tolist()
        after = now.columns[names.index(name)] if name in names else [None] * rows.size
        moves.observe_many(before, after)


# -- numbers ------------------------------------------------------------------------------
NEIGHBOURS = 50  # donors whose last number is nearest an absent member's, to draw one from


@dataclass(slots=True)
class NumberMoves:
    """A carried number's moves from the previous wave to this one, of those present in both:
    an absent member takes the change of a donor drawn among the NEIGHBOURS whose previous
    number was nearest its own (all of those who had exactly its number, when more did: the
    zeros of a capital gain), so imputed numbers move as the present ones did, where they
    were carried forward unchanged (a noised number that changed told a present answer)."""

    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)

    def observe_many(self, before: Sequence[object], after: Sequence[object]) -> None:
        for b, a in zip(before, after, strict=True):
            if _finite(b) and _finite(a):
                self.before.append(float(b))  # type: ignore[arg-type]
                self.after.append(float(a))  # type: ignore[arg-type]

    def freeze(self) -> None:
        """A canonical order, so a draw picks the same donor on a replay: by value, not by
        arrival."""
        pairs = sorted(zip(self.before, self.after, strict=True))
        self.before = [b for b, _ in pairs]
        self.after = [a for _, a in pairs]

    @property
    def pairs(self) -> int:
        return len(self.before)

    def age(self, last: Sequence[object], uniforms: Sequence[float]) -> list[object]:
        """Each absent member's number one wave on (a missing one stays missing); once
        frozen."""
        if not self.before:
            return list(last)
        prev = np.asarray(self.before)
        change = np.asarray(self.after) - prev
        low, high = float(np.min(self.after)), float(np.max(self.after))
        n, width = prev.size, min(NEIGHBOURS, prev.size)
        out = list(last)
        at = [i for i, x in enumerate(last) if _finite(x)]
        xs = np.array([float(last[i]) for i in at])  # type: ignore[arg-type]
        lo = np.searchsorted(prev, xs, "left")
        hi = np.searchsorted(prev, xs, "right")
        near = hi - lo < width  # fewer had exactly its number: the nearest ones around it
        lo = np.where(near, np.clip((lo + hi - width) // 2, 0, n - width), lo)
        hi = np.where(near, lo + width, hi)
        u = np.asarray(uniforms, dtype=np.float64)[at] if at else np.empty(0)
        d = change[lo + np.minimum((u * (hi - lo)).astype(np.int64), hi - lo - 1)]
        aged = np.clip(xs + d, low, high)
        for i, di, v in zip(at, d.tolist(), aged.tolist(), strict=True):
            if di != 0.0:  # else the same object: its digest, so its sticky draw, unchanged
                out[i] = int(v) if isinstance(last[i], int) and v.is_integer() else v
        return out


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


Moves = Transitions | NumberMoves  # an answer's moves: categorical, or a number
