"""A panel's sticky draws as columns, kept with its roster: per drawing attribute, the sorted
(respondent, value digest) pairs and the publication stored for each.

Every active member is published in every wave, so every member's draws are looked up in
every release. As one state entry a respondent (``state[kind][attribute][digest]``) that meant
a read, a decode and a walk of nested maps per member and wave, and an encode and a write per
member that drew afresh. Here a window looks an attribute's draws up in one pass over arrays
(:meth:`DrawTable.found`) and stores its fresh draws with one merge (:meth:`DrawTable.put`);
the table is written with the roster, in the same durable batch, as arrays.

A respondent is numbered by its first appearance (``keys``: state keys, keyed digests, never
ids), and so is each distinct value digest of a column; a draw is the int64 pair of numbers
(respondent × 2^32 + digest: exact, sorted, a respondent's few draws side by side) and the
int32 code of its publication among the column's distinct ones. A stored publication is what a
respondent's state held: the value, or ``[value, matrix version]`` for randomized response.

A respondent the table does not know may hold draws in a state entry of its own: written
before the panel kept its draws here, or under another republication mode. The panel step
reads those once (:meth:`DrawTable.absorb`) and the table knows the respondent from then on.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray

from gateway.grouping.live_view import StateView
from gateway.mechanisms.sticky import publications

DIGEST_BYTES = 16  # a value digest (gateway.keyed.keyed.value_digest)
_encode = msgspec.msgpack.Encoder(order="sorted").encode
_first = operator.itemgetter(0)
KINDS = ("noise", "rr")  # the drawing mechanisms' kinds (Protection.kind)
_MAX_NUMBER = (1 << 31) - 1  # respondent and digest numbers: a pair fits an int64


class DrawColumn:
    """One attribute's draws of one kind.

    ``digests``: the distinct value digests met, numbered in order; ``pairs``: each draw's
    respondent number times 2^32 plus its digest's, sorted and distinct (exact: no hash);
    ``codes``: each draw's publication among ``publications``, the distinct ones met."""

    __slots__ = (
        "_digest_no",
        "_publication_no",
        "_starts",
        "codes",
        "digests",
        "pairs",
        "publications",
    )
    __hash__ = None  # type: ignore[assignment]  # mutable, compared by content

    def __init__(
        self,
        digests: list[bytes] | None = None,
        pairs: NDArray[np.int64] | None = None,
        codes: NDArray[np.int32] | None = None,
        publications: list[Any] | None = None,
    ) -> None:
        self.digests: list[bytes] = [] if digests is None else digests
        self.pairs: NDArray[np.int64] = np.empty(0, np.int64) if pairs is None else pairs
        self.codes: NDArray[np.int32] = np.empty(0, np.int32) if codes is None else codes
        self.publications: list[Any] = [] if publications is None else publications
        if self.codes.size != self.pairs.size:
            raise ValueError("a draw column needs one publication per pair")
        self._digest_no = {d: i for i, d in enumerate(self.digests)}
        self._publication_no = {_encode(v): i for i, v in enumerate(self.publications)}
        self._starts: NDArray[np.intp] | None = None  # first position of each respondent

    def __len__(self) -> int:
        return self.pairs.size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DrawColumn):
            return NotImplemented
        return self.digests == other.digests and (
            bool(np.array_equal(self.pairs, other.pairs))
            and [self.publications[c] for c in self.codes.tolist()]
            == [other.publications[c] for c in other.codes.tolist()]
        )

    def digest_numbers(self, digests: Sequence[bytes], *, add: bool) -> NDArray[np.int64]:
        """Each digest's number (-1: never met, unless ``add``, which numbers it)."""
        if add:
            known = self._digest_no
            for d in dict.fromkeys(digests):
                if d not in known:
                    if len(d) != DIGEST_BYTES:
                        raise ValueError(f"a value digest must be {DIGEST_BYTES} bytes")
                    if len(self.digests) >= _MAX_NUMBER:
                        raise ValueError(f"a draw column numbers at most {_MAX_NUMBER} values")
                    known[d] = len(self.digests)
                    self.digests.append(d)
        return np.fromiter(
            map(self._digest_no.get, digests, repeat(-1)),
            dtype=np.int64,
            count=len(digests),
        )

    def positions(self, query: NDArray[np.int64]) -> NDArray[np.intp]:
        """Each pair's position in the column (-1: not stored). A respondent's pairs are
        consecutive and few (its distinct values of the attribute), so each query checks
        its respondent's run in place of a binary search over the whole column."""
        pairs = self.pairs
        out = np.full(query.size, -1, dtype=np.intp)
        if not pairs.size or not query.size:
            return out
        starts = self._starts
        respondents = query >> 32
        top = int(respondents.max()) + 2
        if starts is None or starts.size < top:
            last = int(pairs[-1] >> 32) + 2
            bounds = np.arange(max(top, last), dtype=np.int64) << 32
            starts = self._starts = np.searchsorted(pairs, bounds)
        begin, end = starts[respondents], starts[respondents + 1]
        runs = end - begin
        longest = int(runs.max())
        for j in range(longest):
            at = np.flatnonzero(runs > j)
            cand = begin[at] + j
            hit = pairs[cand] == query[at]
            out[at[hit]] = cand[hit]
        return out

    def publication_codes(self, values: Sequence[Any]) -> NDArray[np.int32]:
        """Each publication's code (numbered if new; equal encodings, one code: -0.0 is not
        0.0, nor 1 1.0)."""
        known = self._publication_no
        raws = list(map(_encode, values))
        codes: list[int | None] = list(map(known.get, raws))
        if None in codes:
            for i in [i for i, c in enumerate(codes) if c is None]:
                code = known.get(raws[i])
                if code is None:
                    code = known[raws[i]] = len(self.publications)
                    self.publications.append(values[i])
                codes[i] = code
        return np.asarray(codes, dtype=np.int32)

    def put(self, query: NDArray[np.int64], values: Sequence[Any]) -> None:
        """Store ``values`` at these pairs (a pair given twice keeps its last value, a stored
        one is replaced, as a map's assignment would)."""
        if not query.size:
            return
        order = np.argsort(query, kind="stable")
        q = query[order]
        last = np.ones(q.size, dtype=np.bool_)
        last[:-1] = q[1:] != q[:-1]
        q = q[last]
        codes = self.publication_codes([values[i] for i in order[last].tolist()])
        at = self.positions(q)
        stored = at >= 0
        if stored.any():
            self.codes[at[stored]] = codes[stored]
        new = ~stored
        if new.any():
            where = np.searchsorted(self.pairs, q[new])
            self.pairs = np.insert(self.pairs, where, q[new])
            self.codes = np.insert(self.codes, where, codes[new])
            self._starts = None

    def found(self, at: NDArray[np.intp]) -> NDArray[Any]:
        """The publications at these positions (-1: None), as an object array."""
        table = np.empty(len(self.publications) + 1, dtype=object)
        table[:-1] = self.publications  # (element-wise: a publication may be a list)
        table[-1] = None
        code = np.where(at >= 0, self.codes[np.maximum(at, 0)], -1) if self.codes.size else at
        return table[code]


class DrawTable:
    """A scope's stored draws (see the module docstring)."""

    __slots__ = ("_index", "columns", "keys")
    __hash__ = None  # type: ignore[assignment]  # mutable, compared by content

    def __init__(
        self,
        keys: list[bytes] | None = None,
        columns: dict[tuple[str, str], DrawColumn] | None = None,
    ) -> None:
        self.keys: list[bytes] = [] if keys is None else keys
        self._index = {k: i for i, k in enumerate(self.keys)}
        self.columns: dict[tuple[str, str], DrawColumn] = {} if columns is None else columns

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DrawTable):
            return NotImplemented
        return self.keys == other.keys and self.columns == other.columns

    def unknown(self, keys: Iterable[bytes | None]) -> list[bytes]:
        """The distinct keys the table does not know, in order of first appearance."""
        index = self._index
        return [k for k in dict.fromkeys(keys) if k is not None and k not in index]

    def learn(self, keys: Iterable[bytes | None]) -> None:
        """Know these respondents (a respondent known holds every draw of it here; None: no
        respondent), numbered in order of first appearance."""
        index, own = self._index, self.keys
        new = [k for k in dict.fromkeys(keys) if k is not None and k not in index]
        if not new:
            return
        width = len(own[0]) if own else len(new[0])
        if set(map(len, new)) != {width}:
            wrong = next(len(k) for k in new if len(k) != width)
            raise ValueError(f"a draw table's respondent keys are {width} bytes, got {wrong}")
        if len(own) + len(new) > _MAX_NUMBER:
            raise ValueError(
                f"a scope's draw table numbers at most {_MAX_NUMBER} respondents: partition the "
                'state (docs/operating.md, "Scaling out: partitions, state and engine shards")'
            )
        index.update(zip(new, range(len(own), len(own) + len(new)), strict=True))
        own.extend(new)

    def ids(self, keys: Sequence[bytes | None]) -> NDArray[np.int64]:
        """Each respondent's number (-1: unknown, or no key)."""
        return np.fromiter(
            map(self._index.get, keys, repeat(-1)),  # type: ignore[arg-type]
            dtype=np.int64,
            count=len(keys),
        )

    def found(
        self,
        kind: str,
        name: str,
        ids: NDArray[np.int64],
        digests: Sequence[tuple[bytes, str]],
    ) -> list[Any]:
        """Each (respondent, value digest)'s stored publication (None: none); ``ids``: the
        respondents' numbers (:meth:`ids`)."""
        column = self.columns.get((kind, name))
        if column is None or not len(column):
            return [None] * len(digests)
        dno = column.digest_numbers(list(map(_first, digests)), add=False)
        ok = (ids >= 0) & (dno >= 0)
        at = np.full(len(digests), -1, dtype=np.intp)
        at[ok] = column.positions((ids[ok] << 32) | dno[ok])
        out: list[Any] = column.found(at).tolist()
        return out

    def put(
        self,
        kind: str,
        name: str,
        keys: Sequence[bytes | None],
        digests: Sequence[tuple[bytes, str]],
        values: Sequence[Any],
    ) -> None:
        """Store a publication for each (respondent, value digest); a respondent without a key
        has nothing to keep it by, and a new one becomes known."""
        self.learn(keys)
        column = self.columns.get((kind, name))
        if column is None:
            if all(k is None for k in keys):
                return  # nothing to keep: no column for it
            column = self.columns[(kind, name)] = DrawColumn()
        ids = self.ids(keys)
        dno = column.digest_numbers(list(map(_first, digests)), add=True)
        ok = np.flatnonzero(ids >= 0)
        column.put((ids[ok] << 32) | dno[ok], [values[i] for i in ok.tolist()])

    def absorb(self, keys: Sequence[bytes], states: Mapping[bytes, Mapping[str, Any]]) -> None:
        """Know ``keys``, taking in the draws of those that hold a state of their own."""
        self.learn(keys)
        held_by = [key for key in keys if states.get(key)]  # most have none (new respondents)
        for kind in KINDS:
            names = {n for key in held_by for n in states[key].get(kind, ())}
            for name in sorted(names):
                ks: list[bytes | None] = []
                ds: list[tuple[bytes, str]] = []
                vs: list[Any] = []
                for key in held_by:
                    held = (states.get(key) or {}).get(kind, {}).get(name, {})
                    for hexed, value in held.items():
                        ks.append(key)
                        ds.append((bytes.fromhex(hexed), hexed))
                        vs.append(value)
                self.put(kind, name, ks, ds, vs)

    def entries(self) -> Iterator[tuple[str, str, bytes, bytes, Any]]:
        """Every stored draw: (kind, attribute, respondent key, value digest, publication)."""
        for (kind, name), column in sorted(self.columns.items()):
            for pair, code in zip(column.pairs.tolist(), column.codes.tolist(), strict=True):
                key, digest = self.keys[pair >> 32], column.digests[pair & 0xFFFFFFFF]
                yield kind, name, key, digest, column.publications[code]

    def drop(self, names: Iterable[str]) -> dict[str, int]:
        """Forget every draw of these attributes (a policy upgrade that draws them afresh);
        how many each had."""
        gone: dict[str, int] = {}
        for kind, name in list(self.columns):
            if name in names:
                gone[name] = gone.get(name, 0) + len(self.columns.pop((kind, name)))
        return gone

    # -- bytes ---------------------------------------------------------------------------
    def to_doc(self) -> dict[str, Any]:
        return {
            "keys": b"".join(self.keys),
            "klen": len(self.keys[0]) if self.keys else 0,
            "cols": [
                [
                    kind,
                    name,
                    b"".join(c.digests),
                    c.pairs.tobytes(),
                    c.codes.tobytes(),
                    c.publications,
                ]
                for (kind, name), c in sorted(self.columns.items())
            ],
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> DrawTable:
        raw: bytes = doc["keys"]
        klen = int(doc["klen"])
        keys = [raw[at : at + klen] for at in range(0, len(raw), klen)] if klen else []
        columns = {
            (str(kind), str(name)): DrawColumn(
                [digests[at : at + DIGEST_BYTES] for at in range(0, len(digests), DIGEST_BYTES)],
                np.frombuffer(pairs, dtype=np.int64).copy(),
                np.frombuffer(codes, dtype=np.int32).copy(),
                list(publications),
            )
            for kind, name, digests, pairs, codes, publications in doc["cols"]
        }
        return cls(keys, columns)


def drop_draws(doc: dict[str, Any], names: Iterable[str]) -> dict[str, int]:
    """:meth:`DrawTable.drop` on a roster's decoded document (no secret needed: the draws
    are published values and keyed digests); how many draws each attribute had."""
    held = doc.get("draws")
    if not held:
        return {}
    wanted = set(names)
    gone: dict[str, int] = {}
    kept = []
    for col in held["cols"]:
        if col[1] in wanted:
            gone[col[1]] = gone.get(col[1], 0) + len(col[3]) // 8
        else:
            kept.append(col)
    held["cols"] = kept
    return gone


class TableLookup:
    """:class:`~gateway.mechanisms.sticky.StoredDraws` over the draw tables of a window's
    scopes; ``scope_of`` maps a respondent key to its scope (None: one scope). The records'
    numbers in their tables are looked up once, for every attribute."""

    __slots__ = ("_groups", "keys")
    _Group = tuple["DrawTable", list[int], NDArray[np.int64], list[int]]

    def __init__(
        self,
        tables: Mapping[int | None, DrawTable],
        scope_of: Mapping[bytes, int | None] | None,
        keys: Sequence[bytes | None],
    ) -> None:
        self.keys = keys
        self._groups: list[TableLookup._Group] = []
        for table, at in by_table(tables, scope_of, keys):
            ids = table.ids(keys if len(at) == len(keys) else [keys[i] for i in at])
            self._groups.append((table, at, ids, [len(table.keys)]))

    def _ids(self, group: TableLookup._Group) -> NDArray[np.int64]:
        """The group's numbers, those of respondents met since (a fresh draw stored for
        another attribute) added."""
        table, at, ids, known = group
        if known[0] != len(table.keys):
            known[0] = len(table.keys)
            miss = np.flatnonzero(ids < 0)
            keys = self.keys
            ids[miss] = table.ids([keys[at[i]] for i in miss.tolist()])
        return ids

    def found(self, kind: str, name: str, digests: Sequence[tuple[bytes, str]]) -> list[Any]:
        if len(digests) != len(self.keys):
            raise ValueError("found: one value digest per record")
        groups = self._groups
        if len(groups) == 1 and len(groups[0][1]) == len(digests):
            return groups[0][0].found(kind, name, self._ids(groups[0]), digests)
        out: list[Any] = [None] * len(digests)
        for group in groups:
            table, at = group[0], group[1]
            got = table.found(kind, name, self._ids(group), [digests[i] for i in at])
            for i, value in zip(at, got, strict=True):
                out[i] = value
        return out


def by_table(
    tables: Mapping[int | None, DrawTable],
    scope_of: Mapping[bytes, int | None] | None,
    keys: Sequence[bytes | None],
) -> list[tuple[DrawTable, list[int]]]:
    """The positions of ``keys`` by the table of their scope (keys of no known scope, or
    None, belong to none)."""
    if scope_of is None:
        return [(table, list(range(len(keys)))) for table in tables.values()][:1]
    at: dict[int | None, list[int]] = {}
    for i, key in enumerate(keys):
        if key is not None and key in scope_of:
            at.setdefault(scope_of[key], []).append(i)
    return [(tables[s], pos) for s, pos in at.items() if s in tables]


@dataclass(slots=True)
class TableView(StateView):
    """A panel window's view of its draws: the draw tables of its scopes' rosters (the
    respondent states of :class:`StateView` stay empty, nothing is written to them)."""

    tables: dict[int | None, DrawTable] = field(default_factory=dict)
    scope_of: dict[bytes, int | None] | None = None

    def lookup(self, keys: Sequence[bytes | None]) -> TableLookup:  # type: ignore[override]
        return TableLookup(self.tables, self.scope_of, keys)

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
    ) -> None:
        stored = publications(drawn, version)
        ks = [keys[i] for i in fresh]
        ds = [digests[i] for i in fresh]
        for table, at in by_table(self.tables, self.scope_of, ks):
            if len(at) == len(ks):
                table.put(kind, name, ks, ds, stored)
            else:
                values = [stored[i] for i in at]
                table.put(kind, name, [ks[i] for i in at], [ds[i] for i in at], values)
