"""The records a window takes and gives: validated input records with their source, the
protected records and the window's report, record and window ids, values by attribute, and the
published records' encoding."""

from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

import msgspec
import numpy as np
import orjson
from numpy.typing import NDArray

# The per-record types below are NamedTuples, not frozen dataclasses: equally immutable, but a
# frozen dataclass sets each field through object.__setattr__, which cost ~5 µs per published
# record and as much again per consumed one on the worker's hot path.


class SourceRef(NamedTuple):
    """Where a record came from; gives the deterministic record id."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int = -1

    @property
    def record_id(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"

    @property
    def topic_partition(self) -> tuple[str, int]:
        """The input partition it came from: what offsets are committed for."""
        return (self.topic, self.partition)


class ValidRecord(NamedTuple):
    """A decoded, validated input record (values typed per the policy; missing = None)."""

    respondent_id: str | None
    values: Mapping[str, object]
    source: SourceRef | None
    arrived_at: float  # monotonic seconds when the worker first saw it (hold timeout)


class PublishedRecord(NamedTuple):
    record_id: str
    key: bytes | None
    value: bytes  # orjson JSON; deterministic for a given input, state and policy
    source: SourceRef | None
    suppressed: bool
    # the respondent's state key the record stands for (imputed records included): for tests
    # and attack simulation only, kept in memory, never encoded, produced or logged
    respondent: bytes | None = None


# NamedTuples built from columns in C: ``tuple.__new__`` of the type, as ``NamedTuple._make``
# does (the generated ``__new__`` is a Python function: 0.37 against 0.22 µs a record).
_TUPLE_NEW = tuple.__new__


def published_records(
    record_ids: Sequence[str],
    keys: Sequence[bytes | None],
    values: Sequence[bytes],
    sources: Sequence[SourceRef | None],
    suppressed: Sequence[bool],
    *,
    respondents: Sequence[bytes | None],
) -> list[PublishedRecord]:
    """One :class:`PublishedRecord` a row of these columns."""
    rows = zip(record_ids, keys, values, sources, suppressed, respondents, strict=True)
    return list(map(_TUPLE_NEW, repeat(PublishedRecord), rows))


def valid_records(
    respondent_ids: Sequence[str | None],
    values: Sequence[Mapping[str, object]],
    sources: Sequence[SourceRef | None],
    arrived_at: Sequence[float],
) -> list[ValidRecord]:
    """One :class:`ValidRecord` a row of these columns."""
    rows = zip(respondent_ids, values, sources, arrived_at, strict=True)
    return list(map(_TUPLE_NEW, repeat(ValidRecord), rows))


def source_refs(
    topics: Sequence[str | None],
    partitions: Sequence[int],
    offsets: Sequence[int],
    stamps: Sequence[int],
) -> list[SourceRef | None]:
    """One :class:`SourceRef` a row of these columns (None where the topic is None)."""
    if None in topics:
        return [
            SourceRef(t, p, o, ts) if t is not None else None
            for t, p, o, ts in zip(topics, partitions, offsets, stamps, strict=True)
        ]
    rows = zip(topics, partitions, offsets, stamps, strict=True)
    return list(map(_TUPLE_NEW, repeat(SourceRef), rows))


@dataclass(frozen=True, slots=True)
class InputMarks:
    """What the input log tells the engine beyond a window's records. ``committed``: per input
    partition, (topic, partition) -> the offset the caller has committed (-1: nothing yet):
    what records below it published need not be kept for a replay
    (:mod:`gateway.grouping.replay`), and the partitions the release clock waits for.
    ``closed_through``: the newest wave an operator closed on every partition (``privgw wave
    close``): it and the waves before it are decided with the records in hand.
    ``wall_time``: the time now on the clock the records' timestamps use (epoch seconds), for
    a panel wave's maximum counted from its records' own timestamps."""

    committed: Mapping[tuple[str, int], int] | None = None
    closed_through: int | None = None
    wall_time: float | None = None


NO_MARKS = InputMarks()


@dataclass(frozen=True, slots=True)
class WindowReport:
    window_id: str
    records_in: int
    published: int
    held: int
    suppressed: int
    min_group_size: int | None
    groups: int
    sticky_hits: int
    deferred_moves: int = 0  # changed QIs kept in their group so it stays ≥ k live members
    risk_sampled: bool = False
    measures: Mapping[str, float] = field(default_factory=dict)
    retention: Mapping[str, float] = field(default_factory=dict)
    # records randomized per RR attribute: what ``retention`` is a share of (merging shards)
    randomized: Mapping[str, int] = field(default_factory=dict)
    # published records that stand for no record of the window (a panel wave's absent members,
    # and the imputed records a replay sends again): ``published`` counts the window's own
    imputed: int = 0
    # records of the window decided but not published (a panel member's repeated record of a
    # wave, a late copy, the late answer of a member imputed in its wave): its first record,
    # or its imputed one, stands for it; ``published`` does not count them
    withheld: int = 0
    # each noised attribute's sd as applied over the window (a file's metadata publishes it;
    # a stream's small windows do not: the spread of a few respondents' values)
    noise_sd: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WindowResult:
    published: Sequence[PublishedRecord]
    held: Sequence[ValidRecord]
    report: WindowReport
    rows: Sequence[dict[str, Any]] = ()  # the published values, decoded (file workflow)
    # protect_window(encode=False): the published values as columns (names, one list per
    # name, aligned with ``published``), left for the caller to encode with encode_rows;
    # ``published`` then carries empty values and ``rows`` is empty
    output: tuple[list[str], list[list[Any]]] | None = None
    # a shard's risk-sampled window (Engine(measure_risk=False)): its microaggregated records,
    # true and masked (rows alike), measured once the shards' results are merged
    aggregated: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None


def take_at(positions: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """The items at ``positions`` of a sequence, always as a tuple (``operator.itemgetter``,
    in C, gives the bare item for one position and refuses none)."""
    if not positions:
        return lambda seq: ()
    if len(positions) == 1:
        one = positions[0]
        return lambda seq: (seq[one],)
    return operator.itemgetter(*positions)


def record_ids_at(records: Sequence[ValidRecord], positions: Sequence[int]) -> list[str]:
    """:func:`record_ids` of the records at ``positions`` (their positions in ``records``)."""
    out = []
    for i in positions:
        s = records[i].source  # SourceRef.record_id, inlined: once per record of a window
        out.append(f"{s.topic}/{s.partition}/{s.offset}" if s else f"row/{i}")
    return out


def record_ids(records: Sequence[ValidRecord]) -> list[str]:
    """Each record's id: its input position, or its index in the window without one."""
    return [
        f"{s.topic}/{s.partition}/{s.offset}" if (s := r.source) else f"row/{i}"
        for i, r in enumerate(records)
    ]


Columns = Mapping[str, Sequence[Any]]
"""A window's values, one sequence per attribute name, aligned with its records: the one shape
in which the engine reads them."""


def uniform_columns(records: Sequence[ValidRecord]) -> dict[str, list[Any]] | None:
    """The records' values as :data:`Columns` if every record has the same attributes (the
    validated records of a stream), else None."""
    if not records:
        return {}
    names = list(records[0].values)
    width = len(names)
    maps = [r.values for r in records]
    if any(len(m) != width for m in maps):
        return None
    try:  # plain indexing is cheapest
        return {n: [m[n] for m in maps] for n in names}
    except KeyError:
        return None


def window_columns(records: Sequence[ValidRecord]) -> dict[str, list[Any]]:
    """The records' values as :data:`Columns`: one list per name any record carries, None
    where a record lacks it (built once a window for a caller that holds only records)."""
    columns = uniform_columns(records)
    if columns is not None:
        return columns
    maps = [r.values for r in records]
    names = list(dict.fromkeys(n for m in maps for n in m))  # file rows, optional fields
    return {n: [m.get(n) for m in maps] for n in names}


def values_at(
    records: Sequence[ValidRecord], columns: Columns | None, name: str | None
) -> Callable[[Sequence[int]], list[Any]]:
    """The values of ``name`` at the positions asked, from ``columns`` if the caller gave
    them, else from each record asked: for a step that reads a few records of a window before
    its columns are built (parking an open wave's records, most of them held again)."""
    if name is None:
        return lambda positions: [None] * len(positions)
    if columns is None:
        return lambda positions: [records[i].values.get(name) for i in positions]
    column = columns.get(name)
    if column is None:
        return lambda positions: [None] * len(positions)
    return lambda positions: [column[i] for i in positions]


def attribute_values(
    columns: Columns,
    size: int,
    names: Sequence[str],
    positions: Sequence[int] | None = None,
) -> list[list[Any]]:
    """The values of ``names`` for the window's records at ``positions`` (default: all
    ``size`` of them, in order), one list per name (a name without a column: None)."""
    # positions are increasing and distinct, so as many as records means all of them
    every = positions is None or len(positions) == size
    out: list[list[Any]] = []
    for name in names:
        col = columns.get(name)
        if col is None:
            out.append([None] * (size if positions is None else len(positions)))
        elif every:
            out.append(list(col))
        else:
            assert positions is not None
            out.append([col[i] for i in positions])
    return out


def output_rows(names: Sequence[str], columns: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The published records as mappings, members in ``names`` order (built by ``map``: a
    quarter less than a comprehension; each row has one value per name by construction)."""
    return list(map(dict, map(zip, repeat(names), zip(*columns, strict=True))))


def json_bytes(obj: Any) -> bytes:
    """``orjson.dumps(obj)`` copied into bytes of their own size: what orjson returns keeps its
    whole output buffer (tracemalloc: 8,154 bytes held for a record of 571, orjson 3.13), which
    would cost every record held in bulk, published or produced, 14 times its size."""
    return bytes(memoryview(orjson.dumps(obj)))


def encode_published(rows: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """The published records as the output topic carries them: one JSON object each, by
    :func:`json_bytes`. They are held until the broker acknowledges them, and a panel wave is
    one window: bench/output_encoding.py, 66,666 records, 713 MiB of peak memory with
    ``orjson.dumps`` alone against 199, and 0.36-0.60 s against 0.09-0.12 (page faults)."""
    return list(map(json_bytes, rows))


def encode_rows(names: Sequence[str], columns: Sequence[Sequence[Any]]) -> list[bytes]:
    """The published records' values (``WindowResult.output``) encoded as ``protect_window``
    encodes them itself unless told not to: the bytes of :func:`encode_published` of
    :func:`output_rows`, written in bulk.

    msgspec writes the rows as one Struct each, from the columns, into one buffer of lines
    that is then cut at its newlines (JSON text holds none: they are escaped), so no mapping
    is built a record (bench/output_encoding.py). msgspec and orjson write the same JSON but
    for a float's positive exponent (``1e16`` against ``1e+16``, at 1e16 and beyond): columns
    with such a float are written by orjson, as are a row type msgspec cannot build and a
    value it cannot write."""
    row_type = _row_type(tuple(names))
    if row_type is not None and columns and len(columns[0]) and not _any_exponent(columns):
        try:
            lines = _LINES.encode_lines(list(map(row_type, *columns)))
        except (TypeError, msgspec.EncodeError):
            pass
        else:
            return lines.split(b"\n")[:-1]
    return encode_published(output_rows(names, columns))


_LINES = msgspec.json.Encoder()
_NUMBERS = frozenset({float, int, bool, type(None)})
_NO_FLOATS = frozenset({str, int, bool, type(None)})


def _any_exponent(columns: Sequence[Sequence[Any]]) -> bool:
    """Whether a float at or beyond ±1e16 may be among the values (written with an exponent):
    a column of numbers is checked at once; one holding floats beside text, or values of any
    other type (a float's subclass), counts as one (the rare mixed column: orjson's)."""
    for column in columns:
        kinds = set(map(type, column))
        if kinds <= _NO_FLOATS:
            continue
        if not kinds <= _NUMBERS:  # floats beside text, or another kind: orjson's to write
            return True
        values = np.array(column, dtype=np.float64)  # None: NaN (never >= 1e16)
        if np.any(np.abs(values) >= 1e16):
            return True
    return False


@functools.lru_cache(maxsize=64)
def _row_type(names: tuple[str, ...]) -> type[msgspec.Struct] | None:
    """A Struct with one field a name, in order, written under the names themselves (None:
    names a Struct cannot take, such as one given twice)."""
    fields = [f"f{i}" for i in range(len(names))]
    try:
        return msgspec.defstruct(
            "Row", fields, rename=dict(zip(fields, names, strict=True)), gc=False
        )
    except (TypeError, ValueError):
        return None


def window_id(records: Sequence[ValidRecord]) -> str:
    """A window's id: a digest of its records' ids (positions for records without a source),
    the same for the same records whichever engine or shards protect them."""
    return window_digest(r.source.record_id if r.source else str(i) for i, r in enumerate(records))


_SOURCE = operator.attrgetter("source")


def window_id_from(
    records: Sequence[ValidRecord], parts: Sequence[tuple[Sequence[int], Sequence[str]]]
) -> str:
    """:func:`window_id` from the record ids at hand: ``parts`` are (positions, their
    :func:`record_ids`), covering the window between them (a window with parked records: the
    parking keeps their ids, so they are not built again for every window they wait)."""
    # a record without a source (a SourceRef is never empty, so never false): window_id
    # names those by position alone (all(): truth tests, cheaper than == None per record)
    if not all(map(_SOURCE, records)):
        return window_id(records)
    ids = [""] * len(records)
    for positions, rids in parts:
        lead = leading_run(positions)  # mostly the parked records, in front
        ids[:lead] = rids[:lead]
        for i, rid in zip(positions[lead:], rids[lead:], strict=True):
            ids[i] = rid
    return window_digest(ids)


def starts_with(items: Sequence[object], prefix: Sequence[object]) -> bool:
    """Whether ``items`` begins with the very objects of ``prefix``, in order (records handed
    back held come back first in the next window, as the same objects)."""
    return len(items) >= len(prefix) and all(map(operator.is_, items, prefix))


def leading_run(positions: Sequence[int]) -> int:
    """The largest m with ``positions[:m] == range(m)``, for increasing distinct positions
    (a binary search: position j is j exactly when every one before it is)."""
    lo, hi = 0, len(positions)
    while lo < hi:
        mid = (lo + hi) // 2
        if positions[mid] == mid:
            lo = mid + 1
        else:
            hi = mid
    return lo


def window_digest(ids: Iterable[str]) -> str:
    return hashlib.sha256("|".join(ids).encode()).hexdigest()[:16]
