"""A panel's state, one entry per scope: its members as columns, and the last waves' outcomes.

Members are rows that are never removed (a retired member keeps its row and its cohort, so a
return finds them). Per row: the respondent's state key (a keyed digest, never an id), its
cohort, whether it is active, how many waves in a row it was absent, the last wave it answered,
its linked candidate set (roster rows that published its tuple in every release it published
in) and the values it is carried forward with. Those values are true values, so they are kept
sealed (AES-GCM under a key derived from the secret, :class:`Sealer`): the entry holds them only
as ciphertext, and the canary scans of state files find nothing.

The newest decided waves' outcomes (each row's class, the classes' tuples and weights, and the
imputed records as published) let a record of such a wave read again after a crash, or
arriving late, republish what was published for its respondent, byte for byte.

A roster measures about 350 bytes a member, and a Kafka broker refuses a changelog record above
the topic's ``max.message.bytes`` (1 MiB unless configured). So a roster above
:data:`PART_BYTES` is written in parts (:func:`roster_entries`): a head at the roster's key, and
its bytes in parts of at most that size, read back and checked whole by :func:`read_roster`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray

from gateway.errors import StateDamagedError
from gateway.panel.carried import Carried, CarryBlock
from gateway.panel.draws import DrawTable, drop_draws
from gateway.state_store.kept_states import KeptByKey
from gateway.state_store.state_keys import group_key, roster_group_id, roster_part_key

NONCE_BYTES = 12
OUTCOMES_KEPT = 4  # decided waves a replay can republish (a backlog decides several at once)
PART_BYTES = 512 * 1024  # a roster's largest entry: half of Kafka's default record limit
GetMany = Callable[[Sequence[bytes]], Mapping[bytes, bytes]]  # a state store's get_many
_encode = msgspec.msgpack.Encoder(order="sorted").encode
_decode = msgspec.msgpack.Decoder().decode


def roster_key(scope: int | None) -> bytes:
    """The state entry of a scope's roster. Shaped as a group registry key (with its ``live``
    and ``size`` counts) so that partitioned state routes it with its partition and the
    registry's counters read it as one group."""
    return group_key(roster_group_id(scope))


def roster_members(get_many: GetMany, scopes: Sequence[int | None]) -> int:
    """Respondents the rosters of ``scopes`` hold (their rows, retired members included), read
    from their entries' plain counts: nothing sealed is opened."""
    entries = get_many([roster_key(scope) for scope in scopes])
    return sum(int(_decode(raw)["size"]) for raw in entries.values())


class Sealer:
    """AES-256-GCM over the carried values; ``key``: 32 bytes derived from the secret.

    The nonce is synthetic (as in SIV): an HMAC of the entry's key and the plaintext under a
    key of its own, so two engines, or a replay, given the same inputs write the same bytes,
    and two different plaintexts never share a nonce. Equal plaintexts give equal ciphertexts,
    which tells only that a roster did not change."""

    __slots__ = ("_aead", "_nonce_key")

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415

        if len(key) != 32:
            raise ValueError(f"the carry key must be 32 bytes, got {len(key)}")
        self._aead = AESGCM(key)
        self._nonce_key = hashlib.sha256(b"privgw/v1/panel-nonce\x00" + key).digest()

    def seal(self, plain: bytes, context: bytes) -> bytes:
        mac = hmac.new(self._nonce_key, len(context).to_bytes(4, "big") + context, "sha256")
        mac.update(plain)
        nonce = mac.digest()[:NONCE_BYTES]
        return nonce + self._aead.encrypt(nonce, plain, context)

    def open(self, sealed: bytes, context: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag  # noqa: PLC0415

        try:
            return self._aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], context)
        except InvalidTag:
            raise ValueError(
                "the panel roster's carried values do not open under this secret: the state "
                "was written with another one (see docs/operating.md, secret rotation)"
            ) from None


@dataclass(slots=True)
class Outcome:
    """What the last decided wave published: per roster row its class (-1: none), each class's
    tuple and weight, and the imputed records' published values."""

    wave: int
    class_of: NDArray[np.int32]
    tuples: list[list[Any]]
    weights: list[float]
    imputed_rids: list[str] = field(default_factory=list)
    imputed_rows: list[list[Any]] = field(default_factory=list)  # in ``imputed_names`` order
    imputed_names: list[str] = field(default_factory=list)
    imputed_members: list[int] = field(default_factory=list)
    # the newest input offset of the wave's records by input partition ("topic/partition"):
    # a record at or below it was read when the wave was decided, a record after it is a late
    # copy (None: not known, a roster written before 2026-12-07 or records without a source)
    through: dict[str, int] | None = None


@dataclass(slots=True)
class Roster:
    keys: list[bytes] = field(default_factory=list)
    cohort: list[int] = field(default_factory=list)
    active: list[bool] = field(default_factory=list)
    streak: list[int] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)  # last wave answered
    # never changed in place: a cohort's members whose sets are equal share one object, so a
    # wave intersects, and the encoding sorts, each distinct set once
    linked: list[Set[int]] = field(default_factory=list)
    # what each row is carried forward with: claim, carried values, sampling weight, wave the
    # values were observed in, as columns (gateway.panel.carried)
    carried: Carried = field(default_factory=Carried)
    next_cohort: int = 0
    # the smallest k a wave was decided under: linked sets are intersections over the history,
    # which a k raised later cannot grow back (None: none yet, or a roster before 2026-12-08)
    history_k: int | None = None
    # the newest decided waves' outcomes, oldest first: a crash can lose the outputs of the
    # last windows (a backlog decides several waves in one), which a replay publishes again
    outcomes: list[Outcome] = field(default_factory=list)
    # the members' sticky draws (and those of any respondent of the scope that drew), as
    # columns (gateway.panel.draws); a roster written before 2026-11-30 has none here
    draws: DrawTable = field(default_factory=DrawTable)
    # how many times it was written in parts (0: never): the slot its next parts go to
    generation: int = field(default=0, compare=False)
    _index: dict[bytes, int] = field(default_factory=dict)

    def row_of(self, key: bytes) -> int | None:
        if len(self._index) != len(self.keys):
            self._index = {k: i for i, k in enumerate(self.keys)}
        return self._index.get(key)

    def rows_of(self, keys: list[bytes]) -> list[int | None]:
        """:meth:`row_of` of each key."""
        self.row_of(b"")  # the index, built if stale
        return list(map(self._index.get, keys))

    def add(
        self,
        key: bytes,
        cohort: int,
        *,
        wave: int,
        claim: Sequence[Any],
        carry: CarryBlock,
        sampling: float,
    ) -> int:
        """A new member, active, seen in ``wave``; its row. ``carry``: a block of one."""
        return self.add_many(
            [key], [cohort], wave=wave, claim=[[v] for v in claim], carry=carry, sampling=[sampling]
        )[0]

    def add_many(
        self,
        keys: list[bytes],
        cohorts: list[int],
        *,
        wave: int,
        claim: Sequence[Sequence[Any]],
        carry: CarryBlock,
        sampling: Sequence[float],
    ) -> range:
        """New members in order (``claim`` one column an attribute, ``carry`` and ``sampling``
        aligned with ``keys``); their rows."""
        start, n = len(self.keys), len(keys)
        if not len(cohorts) == len(sampling) == n:
            raise ValueError("add_many: one cohort and one sampling weight per key")
        self.keys.extend(keys)
        self.cohort.extend(cohorts)
        self.active.extend([True] * n)
        self.streak.extend([0] * n)
        self.seen.extend([wave] * n)
        self.linked.extend([_NO_ROWS] * n)
        self.carried.extend(claim, carry, sampling, wave)
        self._index.update(zip(keys, range(start, start + n), strict=True))
        return range(start, start + n)

    @property
    def last_wave(self) -> int | None:
        """The newest wave decided (None: none yet)."""
        return self.outcomes[-1].wave if self.outcomes else None

    def outcome_of(self, wave: int) -> Outcome | None:
        return next((o for o in self.outcomes if o.wave == wave), None)

    def decided(self, outcome: Outcome) -> None:
        """Keep a decided wave's outcome (the newest OUTCOMES_KEPT)."""
        self.outcomes = [*self.outcomes, outcome][-OUTCOMES_KEPT:]

    def members(self) -> dict[int, list[int]]:
        """Active rows by cohort, in row order."""
        rows = np.flatnonzero(np.asarray(self.active, dtype=np.bool_))
        if not rows.size:
            return {}
        of = np.asarray(self.cohort, dtype=np.int64)[rows]
        cohorts, first, counts = np.unique(of, return_index=True, return_counts=True)
        # each cohort's rows in row order (a stable sort), the cohorts in order of first row
        ordered = rows[np.argsort(of, kind="stable")].tolist()
        ends = np.cumsum(counts).tolist()
        starts = [0, *ends[:-1]]
        ids = cohorts.tolist()
        return {
            ids[u]: ordered[starts[u] : ends[u]] for u in np.argsort(first, kind="stable").tolist()
        }

    # -- bytes ------------------------------------------------------------------------------
    def encode(self, sealer: Sealer, context: bytes) -> bytes:
        n = len(self.keys)
        linked_sizes, linked_flat = _linked_columns(self.linked)
        doc: dict[str, Any] = {
            "live": int(sum(self.active)),
            "size": n,
            "panel": 1,
            "keys": b"".join(self.keys),
            "klen": len(self.keys[0]) if n else 0,
            "cohort": np.asarray(self.cohort, dtype=np.int32).tobytes(),
            "active": np.asarray(self.active, dtype=np.bool_).tobytes(),
            "streak": np.asarray(self.streak, dtype=np.int16).tobytes(),
            "seen": np.asarray(self.seen, dtype=np.int32).tobytes(),
            "lsize": linked_sizes.tobytes(),
            "lflat": linked_flat.tobytes(),
            "carried": sealer.seal(_encode(self.carried.to_doc()), context),
            "next": self.next_cohort,
            **({} if self.history_k is None else {"hk": self.history_k}),
        }
        doc["draws"] = self.draws.to_doc()
        doc["outs"] = [
            {
                "wave": o.wave,
                "class": np.asarray(o.class_of, dtype=np.int32).tobytes(),
                "tuples": o.tuples,
                "weights": o.weights,
                "irids": o.imputed_rids,
                "irows": o.imputed_rows,
                "inames": o.imputed_names,
                "imembers": o.imputed_members,
                **({} if o.through is None else {"through": o.through}),
            }
            for o in self.outcomes
        ]
        return _encode(doc)

    @classmethod
    def decode(cls, raw: bytes, sealer: Sealer, context: bytes) -> Roster:
        return cls.from_doc(_decode(raw), sealer, context)

    @classmethod
    def from_doc(cls, doc: dict[str, Any], sealer: Sealer, context: bytes) -> Roster:
        n, klen = int(doc["size"]), int(doc["klen"])
        keys = [doc["keys"][i * klen : (i + 1) * klen] for i in range(n)]
        sizes = np.frombuffer(doc["lsize"], dtype=np.int32)
        raw_flat: bytes = doc["lflat"]
        flat = np.frombuffer(raw_flat, dtype=np.int32).tolist()
        ends = np.cumsum(sizes, dtype=np.int64).tolist()
        # equal sets (by their bytes) read as one shared object, as the waves had them
        distinct: dict[bytes, Set[int]] = {b"": _NO_ROWS}
        linked: list[Set[int]] = []
        for a, b in zip([0, *ends][:-1], ends, strict=True):
            held = distinct.get(raw_flat[4 * a : 4 * b])
            if held is None:
                held = distinct[raw_flat[4 * a : 4 * b]] = frozenset(flat[a:b])
            linked.append(held)
        outcomes = [
            Outcome(
                wave=int(o["wave"]),
                class_of=np.frombuffer(o["class"], dtype=np.int32).copy(),
                tuples=[list(t) for t in o["tuples"]],
                weights=[float(w) for w in o["weights"]],
                imputed_rids=list(o["irids"]),
                imputed_rows=[list(r) for r in o["irows"]],
                imputed_names=list(o["inames"]),
                imputed_members=list(o["imembers"]),
                through=None
                if "through" not in o
                else {str(t): int(n) for t, n in o["through"].items()},
            )
            for o in doc.get("outs", ())
        ]
        return cls(
            keys=keys,
            cohort=np.frombuffer(doc["cohort"], dtype=np.int32).tolist(),
            active=np.frombuffer(doc["active"], dtype=np.bool_).tolist(),
            streak=np.frombuffer(doc["streak"], dtype=np.int16).tolist(),
            seen=np.frombuffer(doc["seen"], dtype=np.int32).tolist(),
            linked=linked,
            carried=_carried(_decode(sealer.open(doc["carried"], context)), doc),
            next_cohort=int(doc["next"]),
            history_k=None if "hk" not in doc else int(doc["hk"]),
            outcomes=outcomes,
            draws=DrawTable.from_doc(doc["draws"]) if "draws" in doc else DrawTable(),
        )


_NO_ROWS: frozenset[int] = frozenset()


def _carried(opened: Any, doc: Mapping[str, Any]) -> Carried:
    """The carried columns; rows as written before 2026-11-30 (one list a member, the names'
    lists in the roster's ``cnames``) are read as they are."""
    if isinstance(opened, dict):
        return Carried.from_doc(opened)
    return Carried.from_rows(opened, doc.get("cnames", ()))


def _linked_columns(linked: Sequence[Set[int]]) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
    """Each member's linked-set size, and the sets' rows sorted, one after the other in row
    order: each distinct set object sorted once (members share a few thousand sets), then
    gathered for every member in one numpy pass."""
    n = len(linked)
    # the sets are alive while the roster encodes, so an id names one set
    ids = np.fromiter(map(id, linked), dtype=np.uint64, count=n)
    _, first, which = np.unique(ids, return_index=True, return_inverse=True)
    distinct = [sorted(linked[i]) for i in first.tolist()]
    d_sizes = np.fromiter(map(len, distinct), dtype=np.int64, count=len(distinct))
    d_flat = np.fromiter(chain.from_iterable(distinct), dtype=np.int32, count=int(d_sizes.sum()))
    d_starts = np.cumsum(d_sizes) - d_sizes
    which = which.reshape(-1)
    sizes = d_sizes[which]
    # member i's rows: d_flat[d_starts[which[i]] + 0 .. sizes[i] - 1]
    at = np.arange(int(sizes.sum()), dtype=np.int64)
    at += np.repeat(d_starts[which] - (np.cumsum(sizes) - sizes), sizes)
    return sizes.astype(np.int32), d_flat[at]


def roster_entries(
    roster: Roster, sealer: Sealer, key: bytes, *, part_bytes: int | None = None
) -> dict[bytes, bytes]:
    """The state entries that hold ``roster`` at ``key``: its bytes in the entry itself or,
    above ``part_bytes`` (default :data:`PART_BYTES`), a head there and the bytes in parts of at
    most ``part_bytes``.

    The parts alternate between two slots and the head comes last, so a changelog write cut
    short leaves the previous head, whose parts are in the other slot, untouched; a head whose
    parts do not match is refused by :func:`read_roster`, never read as a roster.

    ``roster.generation`` becomes the one written, as :func:`read_roster` would read it back (a
    caller that keeps the roster writes its next parts to the other slot)."""
    body = roster.encode(sealer, key)
    entries, roster.generation = _body_entries(
        body,
        key,
        generation=roster.generation,
        counts=(int(sum(roster.active)), len(roster.keys)),
        part_bytes=PART_BYTES if part_bytes is None else part_bytes,
    )
    return entries


def _body_entries(
    body: bytes, key: bytes, *, generation: int, counts: tuple[int, int], part_bytes: int
) -> tuple[dict[bytes, bytes], int]:
    """A roster's encoded bytes as entries (see :func:`roster_entries`), and the generation
    written (0: whole); ``counts``: its live members and rows, the registry's counters."""
    if len(body) <= part_bytes:
        return {key: body}, 0
    generation += 1
    slot = generation % 2
    entries = {
        roster_part_key(key, slot, i): _encode({"gen": generation, "b": body[at : at + part_bytes]})
        for i, at in enumerate(range(0, len(body), part_bytes))
    }
    entries[key] = _encode(
        {
            "live": counts[0],  # the registry's counters, as in the whole entry
            "size": counts[1],
            "panel": 1,
            "parts": len(entries),
            "slot": slot,
            "gen": generation,
            "bytes": len(body),
            "sha256": hashlib.sha256(body).digest(),
        }
    )
    return entries, generation


def _parts_body(get_many: GetMany, key: bytes, doc: Any) -> bytes:
    """The encoded bytes of a roster written in parts, ``doc`` its decoded head (the parts
    checked against it)."""
    keys = [roster_part_key(key, int(doc["slot"]), i) for i in range(int(doc["parts"]))]
    found = get_many(keys)
    parts = [_decode(found[k]) for k in keys if k in found]
    body = b"".join(p["b"] for p in parts)
    if (
        len(parts) != len(keys)
        or any(p["gen"] != doc["gen"] for p in parts)
        or len(body) != doc["bytes"]
        or hashlib.sha256(body).digest() != doc["sha256"]
    ):
        raise StateDamagedError(
            f"the panel roster's parts do not match its head ({len(parts)} of {len(keys)} "
            "parts found): its state was cut short or altered, so no wave can be decided. "
            "Restore the state directory from a backup"
        )
    return body


def _whole_doc(get_many: GetMany, key: bytes, head: Any) -> Any:
    """The decoded roster whose entry at ``key`` decodes to ``head``: itself, or its parts'."""
    return _decode(_parts_body(get_many, key, head)) if "parts" in head else head


def roster_last_wave(get_many: GetMany, scope: int | None) -> int | None:
    """The newest wave the roster of ``scope`` decided (None: none); nothing sealed opened."""
    key = roster_key(scope)
    raw = get_many([key]).get(key)
    outs = None if raw is None else _whole_doc(get_many, key, _decode(raw)).get("outs")
    return int(outs[-1]["wave"]) if outs else None


def drop_roster_draws(
    get_many: GetMany,
    key: bytes,
    names: Sequence[str],
    *,
    part_bytes: int | None = None,
) -> tuple[dict[bytes, bytes], dict[str, int]]:
    """A policy upgrade that draws ``names`` afresh: the entries that rewrite the roster at
    ``key`` without their stored draws (none if it holds none), and how many each had. The
    carried values stay sealed: this needs no secret."""
    raw = get_many([key]).get(key)
    if raw is None or not names:
        return {}, {}
    doc = _decode(raw)
    generation = int(doc.get("gen", 0))
    doc = _whole_doc(get_many, key, doc)
    gone = drop_draws(doc, names)
    if not gone:
        return {}, {}
    entries, _ = _body_entries(
        _encode(doc),
        key,
        generation=generation,
        counts=(int(doc["live"]), int(doc["size"])),
        part_bytes=PART_BYTES if part_bytes is None else part_bytes,
    )
    return entries, gone


def read_roster(
    get_many: GetMany,
    key: bytes,
    sealer: Sealer,
    *,
    kept: tuple[bytes, Roster] | None = None,
) -> Roster:
    """The roster at ``key`` (an empty one if none is stored), whole or from its parts.

    ``kept``: a roster the caller wrote, with the entry it wrote at ``key``; it is the roster
    if the store still holds that entry (a head names its parts' hash and generation, a whole
    entry is the roster's bytes), and is read again otherwise."""
    raw = get_many([key]).get(key)
    if raw is None:
        return Roster()
    if kept is not None and kept[0] == raw:
        return kept[1]
    head = _decode(raw)
    roster = Roster.from_doc(_whole_doc(get_many, key, head), sealer, key)
    roster.generation = int(head.get("gen", 0))  # 0: stored whole
    return roster


class KeptRosters(KeptByKey[Roster]):
    """The rosters an engine wrote, each with the entry it was written as at its key: a roster
    the store still holds as written is not decoded again (0.3-0.4 s for 33,000 members), one
    another engine wrote since (a partition that moved away and back) is. A roster is taken out
    while a window works on it and kept again once its write is durable, so a window that fails
    after changing it leaves nothing stale."""

    __slots__ = ()

    def load(
        self,
        get_many: GetMany,
        key: bytes,
        sealer: Sealer,
    ) -> Roster:
        return read_roster(get_many, key, sealer, kept=self._kept.pop(key, None))

    def written(self, entries: Mapping[bytes, bytes], rosters: Mapping[bytes, Roster]) -> None:
        """``rosters`` (by key) were written as ``entries``, durably."""
        for key, roster in rosters.items():
            self._kept[key] = (entries[key], roster)
