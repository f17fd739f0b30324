"""The one interface of a published attribute's protection: an object built once from the
policy (:mod:`gateway.mechanisms.registry`), carrying its privacy cost, that turns a window's
column of true values into the published column.

``apply(values, draws) -> Published``: ``values`` are the column of the attribute for the
records published (or, for the l-diversity attribute, every record of the window); ``draws``
is what a drawing mechanism needs beside them, aligned with the values — where uniforms come
from, each value's draw key and keyed digest, the respondents' stored publications and where
fresh draws are stored. A deterministic recoding ignores ``draws``.
"""

from __future__ import annotations

import math
import operator
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, count, repeat
from typing import Any, ClassVar, NamedTuple

import numpy as np
from numpy.typing import NDArray

from gateway.keyed.randomness import UniformSource
from gateway.mechanisms.sticky import DrawnStates, StoredDraws


class Recalled(NamedTuple):
    """A sticky column's look-up: each value's stored publication (None: none, or nothing
    to draw), the positions drawn afresh, how many were stored, each fresh draw's key."""

    found: list[Any]
    fresh: list[int]
    hits: int
    keys: list[bytes]


class Published(NamedTuple):
    """A published column, with the sticky hits (stored draws republished), randomized
    response's (retention, records randomized), each value's matrix version, and the noise sd
    applied (noise: the window's, which a file's metadata publishes)."""

    values: list[Any]
    hits: int = 0
    retention: tuple[float, int] | None = None
    under: list[Any] | None = None
    noise_sd: float | None = None


@dataclass(frozen=True, slots=True)
class Draws:
    """What a window gives a mechanism that draws, for the records at ``positions`` of the
    window: ``keys`` (what each draw is bound to) and ``stored`` are aligned with them,
    ``value_digests`` (attribute -> each window record's (digest, hex)) is not.
    ``view.sticky``: draws are keyed and stored ones republished; ``stores``: fresh draws are
    kept in ``view``."""

    rand: UniformSource
    keys: Sequence[bytes | None]
    stored: StoredDraws
    view: DrawnStates
    stores: bool
    positions: Sequence[int]
    value_digests: Mapping[str, list[tuple[bytes, str]]]

    def digests(self, name: str) -> list[tuple[bytes, str]] | None:
        """Each value's keyed digest (None: the window has none, draws are not sticky)."""
        column = self.value_digests.get(name)
        if column is None:
            return None
        if len(self.positions) == len(column):  # increasing and distinct: all of them
            return column
        return [column[i] for i in self.positions]

    def recall(
        self, kind: str, name: str, digests: list[tuple[bytes, str]], drawn: Sequence[bool]
    ) -> Recalled:
        """The stored publications of ``name``'s values (those ``drawn`` at all) and what is
        left to draw: a fresh draw is keyed by its draw key and the value's digest."""
        if len(drawn) != len(digests):
            raise ValueError("recall: the digests and drawn flags must align")
        found = self.stored.found(kind, name, digests)
        # the positions left to draw walked in C (compress), then the values not drawn at all
        # (few: missing categories) taken out
        fresh = list(compress(count(), map(operator.is_, found, repeat(None))))
        if not all(drawn):
            found = [f if d else None for f, d in zip(found, drawn, strict=True)]
            fresh = [i for i in fresh if drawn[i]]
        keys = self.keys
        fresh_keys = [(keys[i] or b"") + digests[i][0] for i in fresh]
        return Recalled(found, fresh, len(found) - found.count(None), fresh_keys)

    def keep(
        self,
        kind: str,
        name: str,
        *,
        digests: Sequence[tuple[bytes, str]],
        fresh: Sequence[int],
        drawn: Sequence[Any],
        version: str | None = None,
    ) -> None:
        """Store the fresh draws (with the mechanism's version, if it has one) if this engine
        stores draws."""
        if self.stores and digests:
            self.view.keep_drawn(
                kind,
                name,
                keys=self.stored.keys,
                digests=digests,
                fresh=fresh,
                drawn=drawn,
                version=version,
            )


class Protection(ABC):
    """One published attribute's protection method, built once from the policy.

    ``kind``: the state's kind of its stored draws ("rr", "noise"; None: it stores none).
    ``cost``: its privacy cost where it has one (randomized response: the mechanism with its
    matrix, γ and ε; noise: its settings, from which the scale is taken per window)."""

    name: str
    kind: ClassVar[str | None] = None

    @property
    def cost(self) -> object | None:
        return None

    @abstractmethod
    def apply(self, values: list[Any], draws: Draws) -> Published:
        """The published column of ``values``."""

    def retention(
        self, values: Sequence[object], published: Sequence[Any]
    ) -> tuple[float, int] | None:
        """(Share published as its true value, records randomized); None: not randomized."""
        return None

    def release(self) -> dict[str, object]:
        """What the metadata topic publishes of it: section -> this attribute's entry."""
        return {}


def finite(v: float | np.floating[Any]) -> float | None:
    """A published number: None for NaN and infinities."""
    f = float(v)
    return f if math.isfinite(f) else None


def finite_list(values: NDArray[np.float64]) -> list[float | None]:
    """:func:`finite` of each value (the column converted in C, the few non-finite ones
    replaced after)."""
    out: list[float | None] = values.tolist()
    for i in np.flatnonzero(~np.isfinite(values)).tolist():
        out[i] = None
    return out
