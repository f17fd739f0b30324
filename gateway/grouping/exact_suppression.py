"""Local suppression to *exact-tuple* k: the stream's invariant for recoded keys.

sdcMicro's ``kAnon`` convention (:mod:`gateway.mechanisms.local_suppression`) lets a missing
value match any category, so a record may stand in an exact class of one as long as enough
records *could* be equal to it; an intruder who reads the published file sees those classes
(4,956 Adult records at k = 5). Here a suppressed cell is a value of its own ("missing"), and
cells are suppressed until every published tuple is shared by at least k distinct respondents.

One release at a time, records start from a mask each (the cells an unchanged respondent had
suppressed before: they stay suppressed), then:

1. every exact class below k (smallest first, ties by tuple) suppresses one more column for all
   its members: the least important one whose suppression lands the class in one that then
   holds k respondents, else the least important present one; repeat until none is below k;
2. the fully suppressed class, if it holds 1..k-1 respondents, takes respondents from the
   classes holding more than k (largest first; they keep ≥ k), else its records are withheld.

A class only ever grows or moves whole, so classes at k stay at k. Deterministic: dictionaries
are filled in record order and every choice breaks ties on values, never on hashes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

__all__ = ["Exact", "Key", "apply_mask", "present_bits", "suppress_exact"]

Key = tuple[str | None, ...]


def apply_mask(values: Key, mask: int) -> Key:
    """The tuple as published: the masked cells missing."""
    return tuple(None if mask >> j & 1 else v for j, v in enumerate(values))


def present_bits(values: Key) -> int:
    """The mask of the cells that hold a value."""
    return sum(1 << j for j, v in enumerate(values) if v is not None)


def _tie(t: Key) -> tuple[tuple[bool, str], ...]:
    return tuple((v is None, v or "") for v in t)


@dataclass(frozen=True, slots=True)
class Exact:
    """The masks after suppression, and the records withheld (a fully suppressed class that
    could not reach k)."""

    masks: list[int]
    withheld: list[int]


class _Classes:
    """Exact classes of one release: records and distinct respondents per published tuple."""

    def __init__(self, recoded: Sequence[Key], masks: list[int], who: Sequence[Hashable]):
        self.recoded, self.masks, self.who = recoded, masks, who
        self.members: dict[Key, list[int]] = {}
        self.people: dict[Key, set[Hashable]] = {}
        for i, (r, m) in enumerate(zip(recoded, masks, strict=True)):
            t = apply_mask(r, m)
            self.members.setdefault(t, []).append(i)
            self.people.setdefault(t, set()).add(who[i])

    def size(self, t: Key) -> int:
        return len(self.people.get(t, ()))

    def joined(self, t: Key, into: Key) -> int:
        """Respondents of ``into`` once ``t`` joins it."""
        there = self.people.get(into, set())
        return len(there) + sum(1 for x in self.people[t] if x not in there)

    def move(self, t: Key, records: list[int], into: Key) -> None:
        """Move ``records`` of class ``t`` to class ``into`` (a tuple with more cells missing)."""
        moved = set(records)
        left = [i for i in self.members[t] if i not in moved]
        for i in records:
            self.masks[i] |= present_bits(self.recoded[i]) & ~present_bits(into)
        self.members.setdefault(into, []).extend(records)
        self.people.setdefault(into, set()).update(self.who[i] for i in records)
        if left:
            self.members[t] = left
            self.people[t] = {self.who[i] for i in left}
        else:
            del self.members[t], self.people[t]


def _choose(c: _Classes, t: Key, k: int, order: Sequence[int]) -> int:
    """The column a class below k suppresses next (``order``: least important first)."""
    present = [j for j in order if t[j] is not None]
    for j in present:
        if c.joined(t, (*t[:j], None, *t[j + 1 :])) >= k:
            return j
    return present[0]


def _fill_full(c: _Classes, full: Key, k: int) -> list[int]:
    """Bring the fully suppressed class to k from classes above k; the records withheld."""
    need = k - c.size(full)
    if c.size(full) == 0 or need <= 0:
        return []
    donors = sorted(
        (t for t in c.members if t != full and c.size(t) > k), key=lambda t: (-c.size(t), _tie(t))
    )
    for t in donors:
        surplus = c.size(t) - k
        # the respondents seen last give way first; a respondent's records move together
        givers = list(dict.fromkeys(c.who[i] for i in reversed(c.members[t])))[: min(surplus, need)]
        chosen = set(givers)
        c.move(t, [i for i in c.members[t] if c.who[i] in chosen], full)
        need -= len(givers)
        if need <= 0:
            return []
    return sorted(c.members.pop(full))


def suppress_exact(
    recoded: Sequence[Key],
    start: Sequence[int],
    who: Sequence[Hashable],
    *,
    k: int,
    order: Sequence[int],
) -> Exact:
    """Masks (bit j: column j suppressed) that give every published tuple ≥ k distinct
    respondents (``who``: each record's respondent). ``start``: each record's mask to begin
    from; ``order``: the columns, least important (suppressed first) first."""
    masks = [m & present_bits(r) for m, r in zip(start, recoded, strict=True)]
    if not recoded:
        return Exact(masks, [])
    c = _Classes(recoded, masks, who)
    full: Key = (None,) * len(recoded[0])
    while True:
        small = sorted(
            (t for t in c.members if t != full and c.size(t) < k),
            key=lambda t: (c.size(t), _tie(t)),
        )
        if not small:
            break
        for t in small:
            if t in c.members and c.size(t) < k:
                j = _choose(c, t, k, order)
                c.move(t, list(c.members[t]), (*t[:j], None, *t[j + 1 :]))
    return Exact(masks, _fill_full(c, full, k))
