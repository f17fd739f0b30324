"""Ageing an absent member's carried values by the wave-to-wave moves of those present in
both waves, so that imputed values move as the present ones did.

* **The claim's categories** as one tuple (an aged tuple is one somebody really moved to: a
  marriage moves marital status and relationship together): an absent member whose last tuple
  is ``c`` takes the current tuple of a donor drawn, by its keyed uniform, among those who had
  ``c`` in the previous wave; with no such donor it keeps ``c``.
* **The answers outside the claim together** (randomized and noised ones among them, and the
  ``other`` attributes published beside them): the moves of one donor who had the member's
  categorical answers and numbers' levels (:class:`JointMoves`); where no donor had them,
  each categorical answer the same way on its own, and each number by the change of a donor
  among those whose previous number was nearest its own.
* **Each timestamp** (a published ``other`` one: when it was answered) the same way, by the
  shift of a donor whose previous timestamp was nearest its own: a donor's own time, copied
  whole, told an imputed record (it shared its minute with a present record of the wave), and
  a member who answers at a habitual time took a random respondent's.

``other`` attributes published beside the claim (a region kept, the day answered) are aged
like answers: drawn from any present respondent of the wave, a member's stable value changed
for 80 % of imputed records against 11 % of present ones in a probe.

Carried forward unchanged, an absent member's answers pulled the wave's estimates toward the
previous wave, and a published answer that changed told a present member.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, timedelta
from typing import cast

import numpy as np
from numpy.typing import NDArray

from gateway.mechanisms.masking import parse_timestamp
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


def wave_moves(
    categorical: tuple[str, ...], numbers: tuple[str, ...], times: tuple[str, ...]
) -> WaveMoves:
    """What a wave observes to age its absent members: the claim's categories, each aged
    answer on its own, and the answers together."""
    answers: dict[str, Moves] = {name: Transitions() for name in categorical}
    answers.update((name, NumberMoves()) for name in numbers)
    answers.update((name, TimeMoves()) for name in times)
    joint = JointMoves(categorical, numbers) if categorical or numbers else None
    return Transitions(), answers, joint


def age_absent(
    roster: Roster,
    absent: list[int],
    moves: WaveMoves,
    *,
    nominal: list[int],
    uniforms: Uniforms,
    wave: int,
) -> None:
    """The absent members' carried values one wave on: the claim's categories as a tuple
    (``nominal``: their positions in the claim); the answers outside the claim together, as
    one donor's moved (:class:`JointMoves`), or each on its own when no donor had the member's
    answers; timestamps each on its own. Aged answers change as often as the present ones did,
    so the wave's estimates are current; each is randomized with the member's own sticky draws."""
    if not absent:
        return
    claim, answers, joint = moves
    keys = [roster.keys[r] for r in absent]
    draws = uniforms(f"panel/age/{wave}", keys)
    rows = np.asarray(absent, dtype=np.intp)
    aged = cast(list[Combo], claim.age(roster.carried.combos(rows, nominal), draws))
    for t, j in enumerate(nominal):
        roster.carried.set_claim(j, rows, [combo[t] for combo in aged])
    values = roster.carried.values
    magnitude: dict[str, list[float]] = {}

    def each(name: str) -> list[float]:  # the member's own uniform for one answer
        if name not in magnitude:
            magnitude[name] = uniforms(f"panel/age/{wave}/{name}", keys)
        return magnitude[name]

    alone = np.ones(rows.size, dtype=np.bool_)  # aged one answer at a time
    if joint is not None and joint.pairs:
        last = {n: _column(values.get(n), rows) for n in joint.names}
        together, alone = joint.age(last, uniforms(f"panel/age-together/{wave}", keys), each)
        for name, new in together.items():
            if (column := values.get(name)) is not None:
                column[rows] = objects(new)
    for name, moved in answers.items():
        column = values.get(name)
        if column is None or not moved.pairs:
            continue
        at = rows if joint is None or name not in joint.names else rows[alone]
        u = each(name) if at is rows else np.asarray(each(name))[alone].tolist()
        column[at] = objects(moved.age(column[at].tolist(), u))


def observe_moves(
    carried: Carried,
    rows: NDArray[np.intp],
    now: CarryBlock,
    answers: Mapping[str, Moves],
    joint: JointMoves | None = None,
) -> None:
    """Each aged answer's moves: its value carried at ``rows`` (last wave's) -> ``now``; and
    the answers' moves together."""
    names = carried.names[now.names_id]
    before: dict[str, list[object]] = {}
    after: dict[str, Sequence[object]] = {}
    for name, moves in answers.items():
        before[name] = _column(carried.values.get(name), rows)
        after[name] = now.columns[names.index(name)] if name in names else [None] * rows.size
        moves.observe_many(before[name], after[name])
    if joint is not None:
        joint.observe_many(before, after)


def _column(column: NDArray[np.object_] | None, rows: NDArray[np.intp]) -> list[object]:
    return [None] * rows.size if column is None else column[rows].tolist()


@dataclass(slots=True)
class JointMoves:
    """The answers outside the claim moved together: an absent member takes the moves of one
    donor among those present in both waves who had its categorical answers and, for each
    number, its level (missing, zero or not): the donor's categorical answers, and, for each
    number the donor's changed, the change of a donor among the nearest of those whose number
    changed. Answers that change together (a new job: occupation, income, capital gain) so
    change together when imputed; aged one by one, an imputed change came alone, which a
    probe told from one wave (AUC 0.59)."""

    categorical: tuple[str, ...]
    numbers: tuple[str, ...]
    donors: Transitions = field(default_factory=Transitions)  # profile -> (answers, changed)
    changers: dict[str, NumberMoves] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return self.categorical + self.numbers

    @property
    def pairs(self) -> int:
        return self.donors.pairs

    def observe_many(
        self, before: Mapping[str, Sequence[object]], after: Mapping[str, Sequence[object]]
    ) -> None:
        n = len(before[self.names[0]])
        floats = {name: (_floats(before[name]), _floats(after[name])) for name in self.numbers}
        changed = {name: _changed(*floats[name]) for name in self.numbers}
        outcomes = list(
            zip(
                *(after[name] for name in self.categorical),
                *(changed[name] for name in self.numbers),
                strict=True,
            )
        ) if self.names else [()] * n  # fmt: skip
        self.donors.observe_many(self._profiles(before, n), outcomes)
        for name, flags in changed.items():
            b, a = floats[name]
            at = np.asarray(flags, dtype=np.bool_)
            moved = self.changers.setdefault(name, NumberMoves())
            moved.observe_many(b[at].tolist(), a[at].tolist())

    def freeze(self) -> None:
        self.donors.freeze()
        for moved in self.changers.values():
            moved.freeze()

    def age(
        self,
        last: Mapping[str, list[object]],
        draws: Sequence[float],
        each: Callable[[str], list[float]],
    ) -> tuple[dict[str, list[object]], NDArray[np.bool_]]:
        """The members' answers one wave on, where a donor had their profile; and which
        members had none (to be aged an answer at a time)."""
        n = len(draws)
        profiles = self._profiles(last, n)
        alone = np.array([p not in self.donors.donors for p in profiles], dtype=np.bool_)
        moved = cast(list[tuple[object, ...]], self.donors.age(profiles, draws))
        out = {name: list(last[name]) for name in self.names}
        ncat = len(self.categorical)
        for i in np.flatnonzero(~alone).tolist():
            outcome = moved[i]
            for t, name in enumerate(self.categorical):
                out[name][i] = outcome[t]
        for t, name in enumerate(self.numbers):
            change = [i for i in np.flatnonzero(~alone).tolist() if moved[i][ncat + t]]
            changers = self.changers.get(name)
            if not change or changers is None or not changers.pairs:
                continue
            u = each(name)
            new = changers.age([last[name][i] for i in change], [u[i] for i in change])
            for i, v in zip(change, new, strict=True):
                out[name][i] = v
        return out, alone

    def _profiles(self, values: Mapping[str, Sequence[object]], n: int) -> list[Value]:
        cats = [values[name] for name in self.categorical]
        levels = [_levels(values[name]) for name in self.numbers]
        return list(zip(*cats, *levels, strict=True)) if cats or levels else [()] * n


def _floats(values: Sequence[object]) -> NDArray[np.float64]:
    """Each value as a float, NaN where it is no finite number (a missing answer), in one
    conversion where it can be (a per-value check was a tenth of a returning wave)."""
    try:
        out = np.asarray(values, dtype=np.float64)  # None reads as NaN
    except (TypeError, ValueError):
        out = np.fromiter(
            (float(v) if _finite(v) else math.nan for v in values),  # type: ignore[arg-type]
            dtype=np.float64,
            count=len(values),
        )
    if out.shape != (len(values),):
        raise ValueError("numbers expected")  # (a nested value: never a validated answer)
    return np.where(np.isfinite(out), out, math.nan)


def _changed(before: NDArray[np.float64], after: NDArray[np.float64]) -> list[bool]:
    changed: list[bool] = (np.isfinite(before) & np.isfinite(after) & (before != after)).tolist()
    return changed


def _levels(values: Sequence[object]) -> list[int]:
    """Each number's level in a donor's profile: missing, zero, or not (a capital gain of
    zero moves far less often than one that is not)."""
    x = _floats(values)
    levels: list[int] = np.where(np.isnan(x), -1, (x != 0).astype(np.int64)).tolist()
    return levels


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
        b, a = _floats(before), _floats(after)
        both = np.isfinite(b) & np.isfinite(a)
        self.before.extend(b[both].tolist())
        self.after.extend(a[both].tolist())

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


@dataclass(slots=True)
class TimeMoves:
    """A carried timestamp's moves (ISO 8601 text), as :class:`NumberMoves` of its instant: an
    absent member's timestamp shifted by a donor's, the donor among those whose previous
    timestamp was nearest its own; kept in the member's own offset (a local date stays local)."""

    seconds: NumberMoves = field(default_factory=NumberMoves)

    def observe_many(self, before: Sequence[object], after: Sequence[object]) -> None:
        self.seconds.observe_many(_instants(before), _instants(after))

    def freeze(self) -> None:
        self.seconds.freeze()

    @property
    def pairs(self) -> int:
        return self.seconds.pairs

    def age(self, last: Sequence[object], uniforms: Sequence[float]) -> list[object]:
        at = _instants(last)
        aged = self.seconds.age(at, uniforms)
        out = list(last)
        for i, (was, now) in enumerate(zip(at, aged, strict=True)):
            if was is not None and now != was:
                ts = parse_timestamp(cast(str, last[i]))
                assert ts is not None  # it had an instant
                out[i] = (ts + timedelta(seconds=cast(float, now) - was)).isoformat()
        return out


def _instants(values: Sequence[object]) -> list[float | None]:
    """Each timestamp's instant in seconds (a naive one read as UTC), None for anything else."""
    out: list[float | None] = []
    for v in values:
        ts = parse_timestamp(v) if isinstance(v, str) else None
        if ts is not None and ts.tzinfo is None:
            ts = ts.replace(tzinfo=UTC)
        out.append(None if ts is None else ts.timestamp())
    return out


Moves = Transitions | NumberMoves | TimeMoves  # an answer's moves: categorical, a number, a time
# what a wave observes: the claim's categories, each answer on its own, the answers together
WaveMoves = tuple[Transitions, dict[str, Moves], JointMoves | None]
