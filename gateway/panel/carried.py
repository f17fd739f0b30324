"""What each roster row is carried forward with, a column a field: its claim row (the k claim's
values, one column an attribute), the raw values of the policy's non-``other`` attributes (one
column an attribute; which attributes a row carries is a list of names, numbered once a
roster), its sampling weight and the wave its values were observed in (an imputed row keeps its
last observation's).

A wave overwrites the rows of the members present and reads the columns of every active member:
as columns, both are a gather or a scatter per attribute instead of a list built per member.
Values are the objects the window held (numpy object arrays), so what is published from them is
what was published from the rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

Objects = NDArray[np.object_]


def objects(values: Sequence[Any]) -> Objects:
    """A column of values as an object array, element by element (a value is never spread)."""
    return np.fromiter(values, dtype=object, count=len(values))


@dataclass(frozen=True, slots=True)
class CarryBlock:
    """What a batch of respondents carries: the index of its attributes' names in the roster's
    ``names`` and one column of values an attribute, aligned with the batch."""

    names_id: int
    columns: Sequence[Sequence[Any]]


class Carried:
    """The columns (see the module docstring); ``names``: the distinct lists of carried
    attributes' names, ``nid`` each row's."""

    __slots__ = ("claim", "names", "nid", "observed", "sampling", "values")
    __hash__ = None  # type: ignore[assignment]  # mutable, compared by content

    def __init__(self) -> None:
        self.claim: list[Objects] = []
        self.names: list[list[str]] = []
        self.nid = np.empty(0, dtype=np.int32)
        self.values: dict[str, Objects] = {}
        self.sampling = np.empty(0, dtype=np.float64)
        self.observed = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return self.nid.size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Carried):
            return NotImplemented
        return (
            self.rows_as_lists() == other.rows_as_lists()
            and self.sampling.tolist() == other.sampling.tolist()
            and self.observed.tolist() == other.observed.tolist()
        )

    def names_id(self, names: Sequence[str]) -> int:
        """The index of a list of carried attributes' names (added if new: a roster sees a
        handful, the policy's attributes a window holds)."""
        for i, known in enumerate(self.names):
            if known == list(names):
                return i
        self.names.append(list(names))
        return len(self.names) - 1

    # -- rows written ---------------------------------------------------------------------
    def extend(
        self,
        claim: Sequence[Sequence[Any]],
        carry: CarryBlock,
        sampling: Sequence[float],
        observed: int,
    ) -> None:
        """New rows at the end: ``claim`` one column an attribute, aligned with ``carry``."""
        n, start = len(sampling), len(self)
        if not n:
            return
        if not self.claim:
            self.claim = [np.empty(start, dtype=object) for _ in claim]
        if len(claim) != len(self.claim):
            raise ValueError(f"a claim row has {len(self.claim)} values, got {len(claim)}")
        self.claim = [
            np.concatenate((old, objects(new))) for old, new in zip(self.claim, claim, strict=True)
        ]
        self.nid = np.concatenate((self.nid, np.full(n, carry.names_id, dtype=np.int32)))
        self.sampling = np.concatenate((self.sampling, np.asarray(sampling, dtype=np.float64)))
        self.observed = np.concatenate((self.observed, np.full(n, observed, dtype=np.int64)))
        for name in self.values.keys() | set(self.names[carry.names_id]):
            old = self.values.get(name)
            if old is None:
                old = np.full(start, None, dtype=object)
            self.values[name] = np.concatenate((old, np.full(n, None, dtype=object)))
        self._put_values(np.arange(start, start + n), carry)

    def assign(
        self,
        rows: NDArray[np.intp],
        claim: Sequence[Sequence[Any]],
        carry: CarryBlock,
        sampling: Sequence[float],
        observed: int,
    ) -> None:
        """Overwrite ``rows`` (distinct) with what their members answered in wave ``observed``."""
        if not rows.size:
            return
        if len(claim) != len(self.claim):
            raise ValueError(f"a claim row has {len(self.claim)} values, got {len(claim)}")
        for column, new in zip(self.claim, claim, strict=True):
            column[rows] = objects(new)
        self.nid[rows] = carry.names_id
        self.sampling[rows] = np.asarray(sampling, dtype=np.float64)
        self.observed[rows] = observed
        for name in set(self.names[carry.names_id]) - self.values.keys():
            self.values[name] = np.full(len(self), None, dtype=object)
        for name, column in self.values.items():  # a name the rows no longer carry: None
            if name not in self.names[carry.names_id]:
                column[rows] = None
        self._put_values(rows, carry)

    def _put_values(self, rows: NDArray[np.intp], carry: CarryBlock) -> None:
        for name, new in zip(self.names[carry.names_id], carry.columns, strict=True):
            self.values[name][rows] = objects(new)

    def set_claim(self, j: int, rows: NDArray[np.intp], values: Sequence[Any]) -> None:
        """Claim attribute ``j`` of ``rows`` replaced (an absent member's aged category)."""
        self.claim[j][rows] = objects(values)

    # -- rows read ------------------------------------------------------------------------
    def claim_columns(self, rows: NDArray[np.intp]) -> list[list[Any]]:
        """The claim at ``rows``, one list an attribute."""
        return [column[rows].tolist() for column in self.claim]

    def claim_rows(self, rows: NDArray[np.intp]) -> list[list[Any]]:
        """The claim at ``rows``, one list a row."""
        cols = self.claim_columns(rows)
        return [list(r) for r in zip(*cols, strict=True)] if cols else [[] for _ in rows]

    def combos(self, rows: NDArray[np.intp], positions: Sequence[int]) -> list[tuple[Any, ...]]:
        """The claim's values at ``positions`` (its nominal part) of each of ``rows``, as
        tuples."""
        if not positions or not rows.size:
            return [()] * rows.size
        return list(zip(*[self.claim[j][rows].tolist() for j in positions], strict=True))

    def values_of(self, row: int) -> dict[str, Any]:
        """The raw values, by attribute, that the row is carried forward with (a new map)."""
        return {name: self.values[name][row] for name in self.names[int(self.nid[row])]}

    def rows_as_lists(self) -> list[list[Any]]:
        """Every row as ``[claim row, carried values by name, sampling weight, wave]``."""
        claims = self.claim_rows(np.arange(len(self)))
        return [
            [claim, self.values_of(row), float(self.sampling[row]), int(self.observed[row])]
            for row, claim in enumerate(claims)
        ]

    # -- bytes ----------------------------------------------------------------------------
    def to_doc(self) -> dict[str, Any]:
        names = sorted(self.values)
        return {
            "claim": [column.tolist() for column in self.claim],
            "names": self.names,
            "nid": self.nid.tobytes(),
            "cols": [[name, self.values[name].tolist()] for name in names],
            "sw": self.sampling.tobytes(),
            "obs": self.observed.tobytes(),
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Carried:
        out = cls()
        out.claim = [objects(column) for column in doc["claim"]]
        out.names = [list(names) for names in doc["names"]]
        out.nid = np.frombuffer(doc["nid"], dtype=np.int32).copy()
        out.values = {str(name): objects(column) for name, column in doc["cols"]}
        out.sampling = np.frombuffer(doc["sw"], dtype=np.float64).copy()
        out.observed = np.frombuffer(doc["obs"], dtype=np.int64).copy()
        return out

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[Any]], names: Sequence[Sequence[str]]) -> Carried:
        """Rows as rosters wrote them before 2026-11-30: ``[claim row, carried values, sampling
        weight, wave]``, the values as ``[names index, v1, ...]`` (``names``: the roster's
        lists) or, before 2026-11-29, as one map a row."""
        out = cls()
        out.names = [list(n) for n in names]
        n = len(rows)
        nid: list[int] = []
        values: dict[str, list[Any]] = {}
        for i, (_, carry, _, _) in enumerate(rows):
            if isinstance(carry, dict):
                nid.append(out.names_id(list(carry)))
                held: Sequence[Any] = list(carry.values())
            else:
                nid.append(int(carry[0]))
                held = carry[1:]
            for name, value in zip(out.names[nid[-1]], held, strict=True):
                if name not in values:
                    values[name] = [None] * n
                values[name][i] = value
        claims = [list(col) for col in zip(*(row[0] for row in rows), strict=True)]
        out.claim = [objects(col) for col in claims]
        out.nid = np.asarray(nid, dtype=np.int32)
        out.values = {name: objects(col) for name, col in values.items()}
        out.sampling = np.asarray([float(row[2]) for row in rows], dtype=np.float64)
        out.observed = np.asarray([int(row[3]) for row in rows], dtype=np.int64)
        return out
