"""Window protection: the one entry point the stream worker and the file workflow share.

``Engine.protect_window`` takes a batch of validated records (new ones plus those held from
earlier windows) and returns the protected records, the records still held, and a report.
With a keyring and a state store it is *sticky* (DESIGN.md §5): a respondent's published
values are drawn once per (respondent, attribute, true value) from keyed randomness, stored as
digests + published values, and republished unchanged; quasi-identifiers that did not change
keep their stored centroid, and only new or changed ones are microaggregated, among
themselves, once at least k of them are waiting.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress, repeat
from typing import Any, NamedTuple, cast

import numpy as np
import orjson
from numpy.typing import NDArray

from gateway.draw_derivation import META_NAME, DrawDerivation, DrawPin
from gateway.errors import PolicyError
from gateway.grouping.decision import QIDecision, published_column
from gateway.grouping.guarantees import republication_statement
from gateway.grouping.microaggregation import microaggregate
from gateway.grouping.mixed_microaggregation import (
    EditRule,
    QIKind,
    claim_columns,
    claim_inputs,
    mixed_centroids,
    mixed_microaggregate,
)
from gateway.grouping.parking import Parking
from gateway.grouping.registry import Group
from gateway.grouping.release import ReleaseClock, release_keys
from gateway.grouping.replay import Committed, recall, remember
from gateway.grouping.republish import Republisher
from gateway.grouping.scope import Diversifier, GroupingInputs, refuse_in_stream, same_stratum
from gateway.grouping.strata import stratum_texts
from gateway.grouping.window_work import WindowQI
from gateway.keyed import KeyedSource, Keyring
from gateway.measures import quality
from gateway.measures.attack import unique_combinations
from gateway.mechanisms import masking
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.mechanisms.rr_constructions import from_spec
from gateway.mechanisms.stamp import stamp_column
from gateway.policy import (
    MISSING_LABEL,
    ConsistencyMode,
    GroupingPool,
    HoldTimeout,
    Method,
    MicroaggAlgorithm,
    Policy,
    Pseudonym,
    RepublicationMode,
    Role,
)
from gateway.randomness import SeededSource, UniformSource, normals_from_uniforms
from gateway.routing import StatePartitions
from gateway.state_api import StateStore
from gateway.state_codec import decode_state, encode_state, registry_counts, registry_value
from gateway.state_keys import group_id, group_key, is_group_key, scoped_key

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


_QI_DIGEST_ATTR = "\x00quasi-identifiers"
_CATEGORIES_DIGEST_ATTR = "\x00categorical-quasi-identifiers"  # a tuple's categories alone
_STRATUM_DIGEST_ATTR = "\x00stratum"
_PUBLISHED_DIGEST_ATTR = "\x00published:"  # + attribute: a published value (l-diversity)
_PUBLISHED_DIGEST_BYTES = 8  # a group keeps its release's distinct values as these


def _state_partitions(
    records: Sequence[ValidRecord], partitions: StatePartitions | None
) -> list[int]:
    """Each record's state partition: its respondent key's (``partitions``), else the input
    partition it came from."""
    fallback = [r.source.partition if r.source is not None else 0 for r in records]
    if partitions is None:
        return fallback
    keys = [partitions.key_of(r.respondent_id, r.values) for r in records]
    return partitions.of_keys(keys, fallback)


@dataclass(frozen=True, slots=True)
class LiveCountAudit:
    """Each group's stored live-member count against the respondents whose current group it
    is (:func:`audit_live_counts`). Group ids are keyed digests of record ids, not data."""

    respondents: int
    groups: int
    drifted: Mapping[str, tuple[int, int]]  # group id -> (stored, actual)

    @property
    def consistent(self) -> bool:
        return not self.drifted

    sizes: Mapping[str, int] = field(default_factory=dict)  # formation sizes, where stored

    def repairs(self) -> dict[bytes, bytes]:
        """The registry entries that set every drifted count to its actual value."""
        return {
            group_key(gid): registry_value(actual, self.sizes.get(gid))
            for gid, (_, actual) in self.drifted.items()
        }


def audit_live_counts(entries: Iterable[tuple[bytes, bytes]]) -> LiveCountAudit:
    """Compare the stored live counts with the respondents' current groups, over every entry
    of a state store (a snapshot, taken with no worker writing). Counts drifted in versions
    before 2026-11-23 when a respondent left a group and was published suppressed, or joined
    two groups in one window."""
    stored: dict[str, int] = {}
    sizes: dict[str, int] = {}
    actual: dict[str, int] = {}
    respondents = 0
    for key, raw in entries:
        if is_group_key(key):
            gid = group_id(key)
            stored[gid], size = registry_counts(raw)
            if size is not None:
                sizes[gid] = size
            continue
        respondents += 1
        doc = decode_state(raw)
        current = doc.get("g") or doc.get("current")  # regroup/cohort, else deferred
        if current:
            actual[current[0]] = actual.get(current[0], 0) + 1
    groups = stored.keys() | actual.keys()
    drifted = {
        gid: (stored.get(gid, 0), actual.get(gid, 0))
        for gid in sorted(groups)
        if stored.get(gid, 0) != actual.get(gid, 0)
    }
    return LiveCountAudit(respondents=respondents, groups=len(groups), drifted=drifted, sizes=sizes)


@dataclass(slots=True)
class _StateView:
    """The window's decoded respondent states and which of them the window changed."""

    states: dict[bytes, dict[str, Any]]
    sticky: bool
    touched: set[bytes] = field(default_factory=set)
    # group id -> live members (respondents currently published with its centroid), loaded
    # only for the groups the window's respondents leave or join: an unchanged respondent's
    # group is never read
    live: dict[str, int] = field(default_factory=dict)
    live_touched: set[str] = field(default_factory=set)
    # group id -> distinct respondents it was formed with (new groups, and registry entries read)
    sizes: dict[str, int] = field(default_factory=dict)
    load_live: Callable[[Sequence[str]], dict[str, tuple[int, int | None]]] | None = None
    looked_up: set[str] = field(default_factory=set)

    def prefetch(self, group_ids: Iterable[str]) -> None:
        """Read the live counts (and formation sizes) of these groups from the store, in one
        batch."""
        missing = sorted({g for g in group_ids if g not in self.looked_up})
        self.looked_up.update(missing)
        if missing and self.load_live is not None:
            for gid, (live, size) in self.load_live(missing).items():
                self.live[gid] = live
                if size is not None:
                    self.sizes.setdefault(gid, size)

    def members(self, group_id: str, default: int) -> int:
        """Live members of a group (read once from the store; ``default`` if it has no
        registry entry)."""
        if group_id not in self.looked_up:
            self.prefetch((group_id,))
        return self.live.get(group_id, default)

    def leave(self, group_id: str) -> None:
        self.live[group_id] = self.members(group_id, 0) - 1
        self.live_touched.add(group_id)

    def join(self, group_id: str) -> None:
        self.live[group_id] = self.members(group_id, 0) + 1
        self.live_touched.add(group_id)


def _mechanism_version(mech: RRMechanism) -> str:
    return hashlib.sha256(orjson.dumps(mech.to_dict(), option=orjson.OPT_SORT_KEYS)).hexdigest()[
        :12
    ]


def _value_text(value: object) -> str:
    """Canonical text of a true value for digests (ints and floats of equal value agree)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _qi_text(values: tuple[float, ...]) -> str:
    """Canonical text of a quasi-identifier tuple (what its digest is taken of)."""
    return orjson.dumps([_value_text(v) for v in values]).decode()


_DIGEST_CACHE_LIMIT = 1 << 18  # entries per attribute; cleared, not evicted, when full


class _ValueDigests:
    """Keyed digests of true values, memoised per attribute.

    A value digest depends on (attribute, value) only, and a window repeats the same few
    categories (and the same quasi-identifier tuples of returning respondents) thousands of
    times, so most HMACs would be recomputed. The cache lives in the worker's memory, as the
    secret does; it is never stored.
    """

    __slots__ = ("_cache", "_keyring")

    def __init__(self, keyring: Keyring) -> None:
        self._keyring = keyring
        self._cache: dict[str, dict[Hashable, tuple[bytes, str]]] = {}

    def many(
        self,
        attribute: str,
        values: Sequence[Hashable],
        text: Callable[[Any], str] | None = None,
    ) -> list[tuple[bytes, str]]:
        """(16-byte digest, its hex) of every value; None is the missing label. ``text``
        gives the canonical text of a value (default: :func:`_value_text`)."""
        cache = self._cache.setdefault(attribute, {})
        # one look-up per value (a tuple of quasi-identifiers is hashed anew each time), and
        # the hits kept in hand: a cache cleared for the misses below must not lose them
        found: list[tuple[bytes, str] | None] = list(map(cache.get, values))
        misses = [i for i, f in enumerate(found) if f is None]
        if not misses:
            return found  # type: ignore[return-value]
        missing = list(dict.fromkeys([values[i] for i in misses]))
        if len(cache) + len(missing) > _DIGEST_CACHE_LIMIT:
            cache.clear()
        canonical = text or _value_text
        texts = [MISSING_LABEL if v is None else canonical(v) for v in missing]
        digests = self._keyring.value_digests(attribute, texts)
        computed = {v: (d, d.hex()) for v, d in zip(missing, digests, strict=True)}
        cache.update(computed)
        for i in misses:
            found[i] = computed[values[i]]
        return found  # type: ignore[return-value]


class WindowKeys(NamedTuple):
    """A window's keyed digests, one entry per record: what the engine derives from the
    secret before it reads any state (:class:`KeyedInputs`). The engine computes them itself
    unless the caller brings them; the engine process's parent computes them for records it
    packs while the engine protects the window before, because the engine's core is the
    gateway's bottleneck and the parent's has time to spare."""

    respondents: list[bytes | None]  # HMAC of the respondent id (None: the record has none)
    draws: list[bytes | None]  # what keyed draws are bound to: the respondent, else the record
    values: dict[str, list[tuple[bytes, str]]]  # value digests of the sticky RR / noise values
    quasi_identifiers: list[str]  # digest (hex) of the k-claim tuple; empty unless sticky


def _record_ids_at(records: Sequence[ValidRecord], positions: Sequence[int]) -> list[str]:
    """:func:`record_ids` of the records at ``positions`` (their positions in ``records``)."""
    out = []
    for i in positions:
        src = records[i].source
        out.append(src.record_id if src else f"row/{i}")
    return out


def record_ids(records: Sequence[ValidRecord]) -> list[str]:
    """Each record's id: its input position, or its index in the window without one."""
    return [r.source.record_id if r.source else f"row/{i}" for i, r in enumerate(records)]


class KeyedInputs:
    """Computes :class:`WindowKeys` for a policy and secret. Value digests are memoised (see
    :class:`_ValueDigests`), so one instance serves every window of a worker or engine."""

    __slots__ = ("_claim", "_digests", "_keyring", "_sticky_values", "_strata")

    def __init__(self, policy: Policy, keyring: Keyring) -> None:
        self._keyring = keyring
        self._digests = _ValueDigests(keyring)
        sticky = policy.consistency.mode is ConsistencyMode.STICKY
        claim = policy.k_claim if sticky else []
        self._claim = [(n, policy.attributes[n]) for n in claim]
        self._strata = list(policy.microaggregation.strata or [])
        self._sticky_values = [
            n
            for n, a in policy.attributes.items()
            if sticky and n not in claim and a.method in (Method.RANDOMIZED_RESPONSE, Method.NOISE)
        ]

    def of(
        self,
        records: Sequence[ValidRecord],
        *,
        rids: Sequence[str] | None = None,
        by_attribute: Mapping[str, Sequence[Any]] | None = None,
        claim: bool = True,
    ) -> WindowKeys:
        """The records' keys (``rids``: their :func:`record_ids`, when the caller has them).
        ``claim=False``: without the k-claim tuple digests, for a caller that computes the claim
        inputs anyway and digests them with :meth:`claim_digests` (the engine)."""
        kr = self._keyring
        names = [str(r.respondent_id) if r.respondent_id is not None else None for r in records]
        if None not in names:  # the usual window: every draw bound to its respondent
            respondents: list[bytes | None] = list(kr.respondent_keys(cast(list[str], names)))
            draws = respondents
        else:
            respondents = [None] * len(records)
            draws = [None] * len(records)
            with_id = [i for i, n in enumerate(names) if n is not None]
            for i, key in zip(
                with_id, kr.respondent_keys([names[i] or "" for i in with_id]), strict=True
            ):
                respondents[i] = draws[i] = key
            if rids is None:
                rids = record_ids(records)
            without = [i for i, n in enumerate(names) if n is None]
            anon = kr.respondent_keys(["\x00record:" + rids[i] for i in without])
            for i, key in zip(without, anon, strict=True):
                draws[i] = key
        digests = self._digests
        values = {
            name: digests.many(name, column)
            for name, column in zip(
                self._sticky_values,
                _attribute_values(records, by_attribute, self._sticky_values),
                strict=True,
            )
        }
        qi: list[str] = []
        if self._claim and claim:
            cols = [
                claim_inputs(attr, column)
                for (_, attr), column in zip(
                    self._claim,
                    _attribute_values(records, by_attribute, [n for n, _ in self._claim]),
                    strict=True,
                )
            ]
            qi = self.claim_digests(
                cols,
                [None not in row for row in zip(*cols, strict=True)],
                strata=strata_of(self._strata, records, by_attribute),
            )
        return WindowKeys(respondents, draws, values, qi)

    def claim_digests(
        self,
        cols: Sequence[Sequence[Any]],
        complete: Sequence[bool],
        attribute: str = _QI_DIGEST_ATTR,
        *,
        strata: Sequence[str] | None = None,
    ) -> list[str]:
        """The digest (hex) of each record's k-claim tuple, from the claim inputs (one list
        per claim attribute) and whether each record has all of them. ``attribute``: the
        digest's domain (another one for a part of the tuple). ``strata``: each record's
        stratum (:func:`strata_of`), digested with the tuple, so that a respondent who changes
        stratum has changed its tuple."""
        # one digest per distinct tuple of canonical texts (1.0 and 1 agree); a tuple with a
        # missing value cannot be grouped, and is digested as the empty one
        if strata is not None:
            cols = [*cols, strata]
        if not cols:
            return [""] * len(complete)
        rows = [
            row if ok else () for row, ok in zip(zip(*cols, strict=True), complete, strict=True)
        ]
        return [h for _, h in self._digests.many(attribute, rows, _qi_text)]

    def stratum_digests(self, strata: Sequence[str]) -> list[str]:
        """The keyed digest (hex, 8 bytes) of each record's stratum: what a group's registry
        entry keeps of its stratum (never the values)."""
        return [h[:16] for _, h in self._digests.many(_STRATUM_DIGEST_ATTR, strata)]

    def published_digests(self, name: str, values: Sequence[Hashable]) -> list[bytes]:
        """Keyed digests (8 bytes) of published values of ``name``: what a group's registry
        entry keeps of its release's distinct values for l-diversity."""
        found = self._digests.many(_PUBLISHED_DIGEST_ATTR + name, values)
        return [d[:_PUBLISHED_DIGEST_BYTES] for d, _ in found]


def strata_of(
    names: Sequence[str],
    records: Sequence[ValidRecord],
    by_attribute: Mapping[str, Sequence[Any]] | None,
) -> list[str] | None:
    """Each record's stratum as text (:func:`gateway.grouping.strata.stratum_texts`); None
    when the policy names no strata."""
    if not names:
        return None
    return stratum_texts(_attribute_values(records, by_attribute, names), len(records))


class Engine:
    """Protects windows of records according to a policy.

    Without a keyring the engine is stateless and draws from ``randomness`` (seeded runs on
    files). With a keyring it draws from keyed randomness; with a store it is also sticky.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        keyring: Keyring | None = None,
        store: StateStore | None = None,
        randomness: UniformSource | None = None,
        consistency_override: bool = False,
        frequencies: Mapping[str, Mapping[str, float]] | None = None,
        partition_scope: bool = False,
        measure_risk: bool = True,
        draws: DrawDerivation | None = None,
    ) -> None:
        """``draws``: how keyed draws derive from the secret (:mod:`gateway.draw_derivation`);
        None: the one the store records, else the default for new deployments. A deployment
        settles it before the first window (:meth:`use_draws`).

        ``partition_scope``: the state follows input partitions (scale-out with state that
        moves with its partition): every state key names its record's partition
        (:func:`gateway.state_keys.state_key_partition`) and microaggregation groups are formed
        within one partition, so a group's members and its registry entry always move together.

        ``measure_risk=False``: a risk-sampled window returns its microaggregated records
        (``WindowResult.aggregated``) without measuring them — a shard of a window
        (:mod:`gateway.shards`), measured once the shards' results are merged."""
        refuse_in_stream(policy)
        if policy.consistency.mode is ConsistencyMode.NONE and not consistency_override:
            raise PolicyError(
                "consistency.mode none gives every release fresh randomness, which an "
                "averaging adversary defeats; it needs the explicit --allow-inconsistent flag"
            )
        if store is not None and keyring is None:
            raise PolicyError(
                "a state store needs a keyring: set PRIVGW_SECRET or PRIVGW_SECRET_FILE"
            )
        if policy.output.pseudonym is Pseudonym.HMAC and keyring is None:
            raise PolicyError("output.pseudonym hmac needs a secret: set PRIVGW_SECRET")
        self.policy = policy
        self.version = policy.version
        self._keyring = keyring
        self._partition_scope = partition_scope
        # with partition_scope: each record's state partition, from its respondent's key (set
        # by the wiring once it knows the partition count); unset, the record's own partition
        self.state_partitions: StatePartitions | None = None
        self._parts: list[int] = []  # the window's state partitions (partition_scope)
        self._measure_risk = measure_risk
        self._inputs = KeyedInputs(policy, keyring) if keyring is not None else None
        self._consistent = policy.consistency.mode is ConsistencyMode.STICKY
        self._store = store if self._consistent else None
        self._pin = DrawPin(self._store, draws)
        if randomness is not None:
            self._rand: UniformSource = randomness
        elif keyring is not None and self._consistent:
            self._rand = KeyedSource(keyring, self._pin.derivation)
        else:
            self._rand = SeededSource()
        freqs = frequencies or {}
        self.mechanisms: dict[str, RRMechanism] = {
            a: from_spec(policy.attributes[a], freqs.get(a)) for a in policy.randomized
        }
        self._mech_versions = {a: _mechanism_version(m) for a, m in self.mechanisms.items()}
        self._codes = {
            a: {c: i for i, c in enumerate(m.categories)} for a, m in self.mechanisms.items()
        }
        # the k claim: every quasi-identifier microaggregated together (Domingo-Ferrer & Torra)
        self._qi_agg = policy.k_claim
        self._qi_columns = claim_columns(policy)
        self._qi_numeric = [c.kind is QIKind.NUMERIC for c in self._qi_columns]
        self._qi_numeric_pos = [j for j, numeric in enumerate(self._qi_numeric) if numeric]
        self._qi_all = [n for n, a in policy.attributes.items() if a.role is Role.QUASI_IDENTIFIER]
        self._sensitive_published = [
            n
            for n, a in policy.attributes.items()
            if a.role is Role.SENSITIVE and a.method is not Method.DROP
        ]
        self._published_attrs = [
            n for n, a in policy.attributes.items() if a.method is not Method.DROP
        ]
        self._windows = 0
        self._rules = [EditRule.of(rule) for rule in policy.microaggregation.edit_rules]
        # groups never cross a stratum; they hold l distinct published values of one attribute
        spec = policy.microaggregation
        self._strata = list(spec.strata or []) if self._qi_agg else []
        ldiv = spec.l_diversity if self._qi_agg else None
        self._ldiv = None if ldiv is None else ldiv.attribute
        self._diversify = (
            None if ldiv is None else Diversifier(self._qi_columns, spec.standardize, ldiv.l)
        )
        rep = policy.republication
        self._releases = ReleaseClock()
        pooled = (
            rep.pool is GroupingPool.RELEASE
            and rep.wave_attribute is not None
            and rep.mode is not RepublicationMode.DEFERRED
            and store is not None
        )
        self._parking = Parking(policy.window.max_hold_seconds) if pooled else None
        self._republisher = (
            Republisher(
                rep.mode,
                k=policy.microaggregation.k,
                slack=rep.slack,
                numeric=self._qi_numeric,
                partition=self._partition,
                centroids=self._centroids,
                on_timeout_suppress=policy.window.on_hold_timeout is HoldTimeout.SUPPRESS,
                pool_per_release=rep.pool is GroupingPool.RELEASE,
                ell=None if ldiv is None else ldiv.l,
                diversify=self._diversify,
            )
            if rep.mode is not RepublicationMode.DEFERRED and self._qi_agg and self._store
            else None
        )
        # group id -> formation size: never changes, so kept across windows (each window's
        # view writes into it), and a window of republished records reads no registry entry
        # for its measures again
        self._group_sizes: dict[str, int] = {}

    # ------------------------------------------------------------------ keyed draws
    @property
    def draws(self) -> DrawDerivation | None:
        """The derivation of the keyed draws (None: the draws are not keyed)."""
        return self._rand.derivation if isinstance(self._rand, KeyedSource) else None

    def draws_bound(self) -> DrawDerivation | None:
        """The derivation the state's entries were drawn with (None: a fresh state)."""
        return self._pin.bound if self.draws is not None else None

    def use_draws(self, derivation: DrawDerivation) -> None:
        """Draw with ``derivation`` (the deployment's, :func:`~gateway.draw_derivation.settle`):
        refused when the state is bound to another one."""
        if self.draws is None or derivation is self.draws:
            return
        self._pin.use(derivation)
        assert self._keyring is not None
        self._rand = KeyedSource(self._keyring, derivation)

    # ------------------------------------------------------------------ metadata
    def metadata(self) -> dict[str, object]:
        """Everything an analyst needs to reconstruct statistics (the meta topic's value)."""
        p = self.policy
        keyed = {} if self.draws is None else {META_NAME: self.draws.value}
        return {
            **keyed,
            "policy_version": self.version,
            "policy_name": p.name,
            "k": p.microaggregation.k,
            "microaggregation": p.microaggregation.algorithm.value,
            # groups never cross these strata; each publishes l distinct values of the attribute
            "strata": self._strata,
            "l_diversity": None
            if self._diversify is None
            else {"attribute": self._ldiv, "l": self._diversify.ell},
            "quasi_identifiers": self._qi_all,
            "microaggregated": self._qi_agg,
            # what the k claim covers: every published tuple of these is shared by >= k
            # respondents over the whole history; the unprotected ones are outside it
            "k_claim": self._qi_agg,
            "quasi_identifier_kinds": {c.name: c.kind.value for c in self._qi_columns},
            "unprotected_quasi_identifiers": p.unprotected_quasi_identifiers,
            "published_outside_k_claim": p.published_outside_claim,
            "methods": {n: a.method.value for n, a in p.attributes.items()},
            "consistency": p.consistency.mode.value,
            "republication": republication_statement(p),
            "edit_rules": p.microaggregation.edit_rules,
            "randomized_response": {
                a: {**m.to_dict(), "matrix_version": self._mech_versions[a]}
                for a, m in self.mechanisms.items()
            },
            "noise": {
                n: a.noise.model_dump(mode="json", exclude_none=True)
                for n, a in p.attributes.items()
                if a.noise is not None
            },
            "top_bottom_coding": {
                n: a.coding.model_dump(mode="json", exclude_none=True)
                for n, a in p.attributes.items()
                if a.coding is not None
            },
            # published as multiples of this step (a noised number: rounded after the noise,
            # which adds step²/12 to its error variance)
            "round_to": {n: a.round_to for n, a in p.attributes.items() if a.round_to is not None},
        }

    # ------------------------------------------------------------------ the window
    def protect_window(
        self,
        records: Sequence[ValidRecord],
        *,
        now: float,
        flush_all: bool = False,
        by_attribute: Mapping[str, Sequence[Any]] | None = None,
        encode: bool = True,
        keys: WindowKeys | None = None,
        committed: Committed | None = None,
    ) -> WindowResult:
        """Protect a window. ``by_attribute``: the records' values by attribute, aligned with
        ``records``, from a caller that holds the window as columns (the engine process); they
        are read instead of each record's ``values``, which must then agree with them.
        ``encode=False``: the published values come back as columns (``WindowResult.output``)
        for the caller to encode with :func:`encode_rows` (the engine process hands that work
        to the worker, whose core has time to spare).
        ``keys``: the records' :class:`WindowKeys`, from a :class:`KeyedInputs` of the same
        policy and secret (computed here when not given).
        ``committed``: the input offsets the caller has committed, (topic, partition) -> offset;
        what records below them published need not be kept for a replay
        (:mod:`gateway.grouping.replay`)."""
        if keys is not None and len(keys.respondents) != len(records):
            raise ValueError(
                f"keys for {len(keys.respondents)} records given with a window of "
                f"{len(records)}: they must be the window's own (KeyedInputs.of)"
            )
        parked = self._parked(records, by_attribute, now=now, flush_all=flush_all)
        if not parked:
            return self._protect_window(
                records,
                record_ids(records),
                now=now,
                flush_all=flush_all,
                by_attribute=by_attribute,
                encode=encode,
                keys=keys,
                committed=committed,
            )
        # records waiting for their wave to close are handed back held, undecided
        aside = set(parked)
        active = [i for i in range(len(records)) if i not in aside]
        res = self._protect_window(
            [records[i] for i in active],
            _record_ids_at(records, active),
            now=now,
            flush_all=flush_all,
            by_attribute=None
            if by_attribute is None
            else {n: [c[i] for i in active] for n, c in by_attribute.items()},
            encode=encode,
            keys=None if keys is None else _keys_at(keys, active),
            committed=committed,
        )
        report = replace(
            res.report,
            window_id=window_id(records),
            records_in=len(records),
            held=res.report.held + len(parked),
        )
        return replace(res, held=[*(records[i] for i in parked), *res.held], report=report)

    def _parked(
        self,
        records: Sequence[ValidRecord],
        by_attribute: Mapping[str, Sequence[Any]] | None,
        *,
        now: float,
        flush_all: bool,
    ) -> list[int]:
        """The records set aside unread in this window (:mod:`gateway.grouping.parking`)."""
        parking, wave = self._parking, self.policy.republication.wave_attribute
        if parking is None or wave is None or not records:
            return []
        column = by_attribute.get(wave) if by_attribute is not None else None

        def releases_at(positions: Sequence[int]) -> list[str]:
            if by_attribute is None:
                values = [records[i].values.get(wave) for i in positions]
            else:
                values = [None if column is None else column[i] for i in positions]
            return release_keys(values, str)  # no wave: a window release (never parked)

        return parking.split(
            records,
            lambda i: records[i].arrived_at,
            lambda positions: _record_ids_at(records, positions),
            releases_at,
            self._releases,
            now=now,
            flush_all=flush_all,
        )

    def _protect_window(
        self,
        records: Sequence[ValidRecord],
        rids: list[str],
        *,
        now: float,
        flush_all: bool,
        by_attribute: Mapping[str, Sequence[Any]] | None,
        encode: bool,
        keys: WindowKeys | None,
        committed: Committed | None,
    ) -> WindowResult:
        policy = self.policy
        self._windows += 1
        if self.draws is not None:
            self._pin.record_once()  # the state is bound to the derivation from now on

        kr = self._keyring
        sticky = self._consistent and kr is not None
        # the k-claim digests given with the keys; else taken below from the claim inputs the
        # quasi-identifier step computes anyway (None)
        given_qi = keys.quasi_identifiers if keys is not None and sticky else None
        # rkeys: respondent digests (state); dkeys: what keyed draws are bound to — the
        # respondent, or the record itself when it carries no respondent id
        rkeys: list[bytes | None]
        dkeys: Sequence[bytes | None]
        if self._partition_scope:
            self._parts = _state_partitions(records, self.state_partitions)
        if self._inputs is None:
            rkeys = [None] * len(records)
            dkeys = rkeys
        else:
            if keys is None:
                keys = self._inputs.of(records, rids=rids, by_attribute=by_attribute, claim=False)
            rkeys, dkeys = list(keys.respondents), keys.draws
            if self._partition_scope:  # draws stay bound to the respondent alone
                for i, r in enumerate(records):
                    if r.respondent_id is not None:
                        part = self._parts[i]
                        rkeys[i] = scoped_key(part, rkeys[i] or b"")
        states: dict[bytes, dict[str, Any]] = {}
        if self._store is not None:
            wanted = sorted({key for key in rkeys if key is not None})
            for key, raw in self._store.get_many(wanted).items():
                states[key] = decode_state(raw)
        if len(self._group_sizes) > _DIGEST_CACHE_LIMIT:
            self._group_sizes.clear()
        view = _StateView(
            states=states,
            sticky=sticky,
            sizes=self._group_sizes,
            load_live=self._load_live if self._store is not None else None,
        )

        # -- quasi-identifiers: sticky centroids, new groups, holds -----------------------
        value_digests = keys.values if keys is not None and sticky else {}
        # within strata; l-diverse on the published values of one attribute, taken first
        strata = strata_of(self._strata, records, by_attribute)
        early = self._early_column(
            records, by_attribute, rkeys=rkeys, dkeys=dkeys, view=view, value_digests=value_digests
        )
        grouping = GroupingInputs(
            strata,
            None
            if strata is None or self._inputs is None
            else self._inputs.stratum_digests(strata),
            None if early is None else early.out,
        )
        republish = self._republisher is not None and sticky
        decide = self._republish if republish else self._deferred_quasi_identifiers
        qi, regroups = decide(
            records,
            rids,
            rkeys,
            view,
            now=now,
            flush_all=flush_all,
            by_attribute=by_attribute,
            qi_digests=given_qi,
            grouping=grouping,
            committed=committed,
        )
        held_idx, suppressed_idx, sticky_hits = qi.held, qi.suppressed, qi.hits
        held_set = set(held_idx)
        pub_idx = [i for i in range(len(records)) if i not in held_set]
        suppressed_set = set(suppressed_idx)

        # the output is built column by column, then zipped into rows once (in C)
        col_names: list[str] = ["record_id", "policy_version"]
        columns: list[list[Any]] = [
            [rids[i] for i in pub_idx],
            [self.version] * len(pub_idx),
        ]
        out_keys: list[bytes | None] = [None] * len(pub_idx)  # the output records' keys
        if policy.output.pseudonym is Pseudonym.HMAC and kr is not None:
            pseudonyms = [
                kr.pseudonym(rid) if (rid := records[i].respondent_id) is not None else None
                for i in pub_idx
            ]
            col_names.append("pseudonym")
            columns.append(pseudonyms)
            out_keys = [p.encode() if p else None for p in pseudonyms]

        retention: dict[str, float] = {}
        randomized: dict[str, int] = {}
        touched = view.touched
        qi_columns: dict[str, list[Any]] = {}
        if self._qi_agg:  # the k claim's tuples, one column per attribute (None: not grouped)
            unset = (None,) * len(self._qi_agg)
            chosen = [qi.tuples.get(i, unset) for i in pub_idx]
            qi_columns = {n: [] for n in self._qi_agg}
            if chosen:
                by_name = map(list, zip(*chosen, strict=True))
                qi_columns = dict(zip(self._qi_agg, by_name, strict=True))
        dk = [dkeys[i] for i in pub_idx]
        rk = [rkeys[i] for i in pub_idx]
        stored = _StoredLookup(view.states, rk)
        for name, values in zip(
            self._published_attrs,
            _attribute_values(records, by_attribute, self._published_attrs, pub_idx),
            strict=True,
        ):
            attr = policy.attributes[name]
            ret: tuple[float, int] | None = None
            under: list[Any] | None = None  # randomized response: each value's matrix
            if name in qi_columns:
                out: list[Any] = qi_columns[name]
            elif early is not None and name == early.name:  # published before the grouping
                out = [early.out[i] for i in pub_idx]
                sticky_hits += sum(early.hit[i] for i in pub_idx)
                early.store(view, rk)
                if attr.method is Method.RANDOMIZED_RESPONSE:
                    ret = self._retention(name, values, out)
                under = None if early.under is None else [early.under[i] for i in pub_idx]
            else:
                out, hits, ret, under = self._column(
                    name,
                    values,
                    pub_idx,
                    dk=dk,
                    view=view,
                    stored=stored,
                    value_digests=value_digests,
                )
                sticky_hits += hits
            if ret is not None:
                retention[name], randomized[name] = ret
            if under is not None and self._store is not None:  # each value's matrix
                col_names.append(stamp_column(name))  # (gateway.mechanisms.stamp)
                columns.append(under)
            if suppressed_set and attr.role is Role.QUASI_IDENTIFIER:
                out = [
                    None if i in suppressed_set else o for o, i in zip(out, pub_idx, strict=True)
                ]
            col_names.append(name)
            columns.append(out)
        rows = _output_rows(col_names, columns) if encode else []

        # -- state first (durable), then the caller produces the outputs ----------------
        if self._store is not None:
            # Here a respondent's state is written only when it is new or its published values
            # change (the regroup and cohort modes also keep, per record, what it published
            # for a replay: gateway.grouping.replay).
            qi_digests, group_of, current_digest = qi.digests, qi.group_of, qi.current_digest
            stratum_digests = grouping.stratum_digests
            unchanged, replayed = qi.unchanged, qi.replayed
            waves = _attribute_values(records, by_attribute, ["wave"])[0]
            for i in pub_idx:
                rkey = rkeys[i]
                if rkey is None:
                    continue
                st = states.get(rkey)
                if st is None:
                    st = states[rkey] = {}
                    touched.add(rkey)
                wave = waves[i]
                if isinstance(wave, int | float) and math.isfinite(float(wave)):
                    w = int(wave)
                    if w < st.get("first_wave", math.inf):
                        st["first_wave"] = w
                        touched.add(rkey)
                if not republish and i not in replayed and i in qi_digests:
                    # what it published, for a replay: the claim digest its tuple is stored
                    # under (gateway.grouping.replay; the republisher keeps its own)
                    claim = qi_digests[i]
                    gid = None if i in suppressed_set else group_of.get(i)
                    outcome = None if gid is None else (gid, current_digest.get(i, claim))
                    remember(st, rids[i], claim, outcome, committed or {})
                    touched.add(rkey)
                if republish or i in unchanged:
                    continue  # stored by the republisher, or as they are
                digest = qi_digests.get(i)
                if digest is not None and i in group_of:
                    gid = group_of[i]
                    if i not in current_digest:  # a deferred move keeps its old mapping
                        known = st.setdefault("qi", {})
                        if digest not in known:
                            known[digest] = [gid, list(qi.tuples[i])]
                            touched.add(rkey)
                    current = [gid, current_digest.get(i, digest)]
                    if stratum_digests is not None:  # a deferred move never leaves it
                        current.append(stratum_digests[i])
                    if st.get("current") != current:
                        st["current"] = current
                        touched.add(rkey)
            for i in qi.departed:  # no longer a live member of the group it left
                rkey = rkeys[i]
                st = states.get(rkey) if rkey is not None else None
                if rkey is not None and st is not None and st.pop("current", None) is not None:
                    touched.add(rkey)
            entries = {key: encode_state(states[key]) for key in touched}
            for gid in view.live_touched:
                entries[group_key(gid)] = registry_value(view.live[gid], view.sizes.get(gid))
            for gid, grp in regroups.items():
                if grp.changed:
                    entries[group_key(gid)] = encode_state(grp.to_doc())
            if entries:
                self._store.put_many(entries)

        measures = dict(qi.measures)
        release_ldiv = measures.pop("release_ldiv_min", None)
        if qi.sampled and (self._qi_agg or self._sensitive_published):
            out_by_name = dict(zip(col_names, columns, strict=True))
            if self._qi_agg:
                measures.update(self._key_measures(out_by_name, pub_idx, qi, view, suppressed_set))
            if release_ldiv is not None and self._ldiv is not None:
                # every class published here, counted over its release so far
                name = f"ldiv_min:{self._ldiv}"
                measures[name] = min(measures.get(name, release_ldiv), release_ldiv)
            if self._sensitive_published:  # sticky values that could link releases
                sensitive = [out_by_name[n] for n in self._sensitive_published]
                measures["sensitive_records"] = float(len(pub_idx))
                measures["sensitive_uniques"] = float(unique_combinations(sensitive))
        published = list(
            map(
                PublishedRecord,
                columns[0],  # record ids
                out_keys,
                _encode(rows) if encode else [b""] * len(pub_idx),
                [records[i].source for i in pub_idx],
                [i in suppressed_set for i in pub_idx],
            )
        )
        sizes = [size for _, size in qi.groups]
        report = WindowReport(
            window_id=_window_digest(
                rid if r.source else str(i)
                for i, (rid, r) in enumerate(zip(rids, records, strict=True))
            ),
            records_in=len(records),
            published=len(published),
            held=len(held_idx),
            suppressed=len(suppressed_idx),
            min_group_size=min(sizes) if sizes else None,
            groups=len(qi.groups),
            sticky_hits=sticky_hits,
            deferred_moves=qi.deferred,
            risk_sampled=qi.sampled,
            measures=measures,
            retention=retention,
            randomized=randomized,
        )
        return WindowResult(
            published=published,
            held=[records[i] for i in held_idx],
            report=report,
            rows=rows,
            aggregated=qi.aggregated,
            output=None if encode else (col_names, columns),
        )

    # ------------------------------------------------------------------ helpers
    def _column(
        self,
        name: str,
        values: list[Any],
        positions: Sequence[int],
        *,
        dk: Sequence[bytes | None],
        view: _StateView,
        stored: _StoredLookup,
        value_digests: Mapping[str, list[tuple[bytes, str]]],
    ) -> tuple[list[Any], int, tuple[float, int] | None, list[Any] | None]:
        """The published values of ``name`` for the records at ``positions`` (``values``, draw
        keys ``dk`` and stored publications aligned with them), with the sticky hits and, for
        randomized response, (retention, records randomized) and each value's matrix
        version."""
        attr = self.policy.attributes[name]
        if attr.method is Method.RANDOMIZED_RESPONSE:
            vds = _at(value_digests.get(name), positions)
            return self._randomize(name, values, dk, view, stored, digests=vds)
        if attr.method is Method.NOISE:
            vds = _at(value_digests.get(name), positions)
            out, hits = self._noise(name, values, dk, view, stored, digests=vds)
            return out, hits, None, None
        if attr.method is Method.TOP_BOTTOM_CODE:
            assert attr.coding is not None
            arr = np.array(values, dtype=np.float64)  # None -> nan
            coded = masking.top_bottom_code(arr, attr.coding)
            out = [None if v is None else _num(c) for v, c in zip(values, coded, strict=True)]
        elif attr.method is Method.GENERALIZE:
            assert attr.hierarchy is not None
            out = masking.generalize(
                [None if v is None else str(v) for v in values], attr.hierarchy
            )
        elif attr.method is Method.COARSEN:
            assert attr.coarsen is not None
            out = masking.coarsen(
                [None if v is None else str(v) for v in values], attr.coarsen.unit
            )
        elif attr.round_to is not None:  # a weight, rounded as the policy says
            arr = np.array([np.nan if v is None else float(v) for v in values])
            out = [_num(v) for v in masking.round_to(arr, attr.round_to).tolist()]
        else:  # keep
            out = values
        return out, 0, None, None

    def _early_column(
        self,
        records: Sequence[ValidRecord],
        by_attribute: Mapping[str, Sequence[Any]] | None,
        *,
        rkeys: Sequence[bytes | None],
        dkeys: Sequence[bytes | None],
        view: _StateView,
        value_digests: Mapping[str, list[tuple[bytes, str]]],
    ) -> _EarlyColumn | None:
        """The l-diversity attribute's published values for every record of the window, taken
        before the grouping (which needs them) and reused for the records published. Sticky
        draws are keyed, so a held record's value now is the one it is published with later;
        fresh draws are kept aside and stored for the published records only."""
        if self._ldiv is None:
            return None
        name = self._ldiv
        everyone = range(len(records))
        values = _attribute_values(records, by_attribute, [name])[0]
        stored = _StoredLookup(view.states, rkeys)
        method = self.policy.attributes[name].method
        vds = value_digests.get(name)
        if view.sticky and vds is not None and method in (Method.RANDOMIZED_RESPONSE, Method.NOISE):
            maps = stored.maps("rr" if method is Method.RANDOMIZED_RESPONSE else "noise", name)
            hit = [m.get(h) is not None for m, (_, h) in zip(maps, vds, strict=True)]
        else:
            hit = [False] * len(records)
        aside = _StateView(states={}, sticky=view.sticky)
        out, _, _, under = self._column(
            name, values, everyone, dk=dkeys, view=aside, stored=stored, value_digests=value_digests
        )
        return _EarlyColumn(name, out, hit, aside.states, under)

    def _retention(
        self, name: str, values: Sequence[object], out: Sequence[Any]
    ) -> tuple[float, int] | None:
        """(Share published as its true category, records randomized) of an RR attribute."""
        codes_of = self._codes[name]
        missing_code = codes_of.get(MISSING_LABEL, -1)
        codes = np.array([missing_code if v is None else codes_of[str(v)] for v in values])
        return _kept_share(codes_of, codes.astype(np.int64), out)

    def _load_live(self, group_ids: Sequence[str]) -> dict[str, tuple[int, int | None]]:
        assert self._store is not None
        found = self._store.get_many([group_key(g) for g in group_ids])
        return {group_id(key): registry_counts(raw) for key, raw in found.items()}

    def _key_measures(
        self,
        published: Mapping[str, Sequence[Any]],
        pub_idx: Sequence[int],
        qi: QIDecision,
        view: _StateView,
        suppressed: set[int],
    ) -> dict[str, float]:
        """Risk over the whole key for a sampled window's published records (``published``:
        the published values by attribute, aligned with ``pub_idx``).

        A published tuple's class over the whole history is at least the largest formation
        size among the groups that publish it (a group's members keep its tuple; departures do
        not unpublish it), so ``key_smallest_class`` is a lower bound that holds over the
        history, not only within the window. Fully suppressed records carry no
        quasi-identifier value and are counted apart (``key_suppressed``). l-diversity is
        measured within the groups formed in this window, whose members are all here."""
        k = self.policy.microaggregation.k
        group_of = qi.group_of
        sizes = view.sizes  # the engine's, kept across windows
        gids = [group_of.get(i) for i in pub_idx]
        grouped = (
            [g is not None and i not in suppressed for g, i in zip(gids, pub_idx, strict=True)]
            if suppressed
            else [g is not None for g in gids]
        )
        view.prefetch({g for g in compress(gids, grouped) if g is not None and g not in sizes})
        tuples = zip(*(published[n] for n in self._qi_agg), strict=True)
        known = [g in sizes for g in gids]  # else formed before formation sizes were kept
        counted = [a and b for a, b in zip(grouped, known, strict=True)]
        # (published tuple, group) -> records: the tuple is read from what is published, so a
        # group whose members published different tuples would show, not be assumed away
        pairs = cast(
            "Counter[tuple[tuple[Any, ...], str]]",
            Counter(compress(zip(tuples, gids, strict=True), counted)),
        )
        n = sum(pairs.values())
        groups_of_tuple: dict[tuple[Any, ...], list[str]] = {}
        for t, gid in pairs:
            groups_of_tuple.setdefault(t, []).append(gid)
        # the largest group publishing a tuple: its members are distinct respondents (a sum
        # could count a respondent who was in two such groups twice)
        size_of = sizes.__getitem__
        bound = {t: max(map(size_of, gids)) for t, gids in groups_of_tuple.items()}
        out: dict[str, float] = {
            "key_records": float(n),
            "key_suppressed": float(len(suppressed)),
            "key_unknown_class": float(sum(grouped) - n),
        }
        if n:
            classes = [(bound[t], count) for (t, _), count in pairs.items()]
            out["key_smallest_class"] = float(min(c for c, _ in classes))
            out["key_share_below_k"] = sum(m for c, m in classes if c < k) / n
            out["key_uniques"] = float(sum(m for c, m in classes if c == 1))
            # sdcMicro's risk_ER without weights: Σ 1/fk over the release's records, fk the
            # tuple's class over the history (the bound above: a release may hold only some
            # of a class, whose other members an intruder with the history still sees)
            expected = sum(m / c for c, m in classes)
            out["key_expected_reidentifications"] = expected
            out["key_global_risk"] = expected / n
        formed = {gid for gid, _ in qi.groups}
        if formed:
            in_formed = [a and g in formed for a, g in zip(grouped, gids, strict=True)]
            for name in self._sensitive_published:
                # distinct (group, value) pairs, then distinct values per group
                distinct = Counter(
                    g for g, _ in set(compress(zip(gids, published[name], strict=True), in_formed))
                )
                if distinct:
                    out[f"ldiv_min:{name}"] = float(min(distinct.values()))
        return out

    def _quasi_identifiers(
        self,
        records: Sequence[ValidRecord],
        rids: Sequence[str],
        rkeys: Sequence[bytes | None],
        view: _StateView,
        *,
        now: float,
        flush_all: bool,
        by_attribute: Mapping[str, Sequence[Any]] | None = None,
        qi_digests: list[str] | None,
        grouping: GroupingInputs,
    ) -> QIDecision:
        """Decide each record's quasi-identifiers of the k claim (all of them together):
        stored group tuple, new group, held or suppressed. ``qi_digests``: each record's k-claim
        tuple digest (:class:`WindowKeys`) when the caller brought them (None: taken here)."""
        policy = self.policy
        k = policy.microaggregation.k
        names = self._qi_agg
        decision = QIDecision()
        decision.sampled = (self._windows - 1) % policy.risk.sample_every == 0
        tuples, digests = decision.tuples, decision.digests
        if not names:
            return decision
        states, sticky = view.states, view.sticky
        # the partition's inputs: floats, categories (generalized where the policy says so),
        # None where a value is missing and not a category of its own
        cols = [
            claim_inputs(policy.attributes[n], c)
            for n, c in zip(names, _attribute_values(records, by_attribute, names), strict=True)
        ]
        complete: list[bool] = [None not in row for row in zip(*cols, strict=True)]
        pending: list[int] = []
        # a respondent's second, different new QI tuple in one window waits for the next
        # one: two slots of one respondent could land in one group and count twice towards k
        deferred: list[int] = []
        pending_digest: dict[bytes, str] = {}
        suppressed = decision.suppressed
        seen: dict[bytes, int] = {}
        qi_hex: list[str] = []
        undecided: Sequence[int] = range(len(records))  # decided one by one below
        if sticky and self._inputs is not None:
            qi_hex = (
                qi_digests
                if qi_digests is not None
                else self._inputs.claim_digests(cols, complete, strata=grouping.strata)
            )
            replays = _deferred_replays(rids, rkeys, qi_hex, complete, states, decision=decision)
            kept = _keep_stored_tuples(
                rkeys, qi_hex, complete, states, decision=decision, replays=replays
            )
            undecided = [i for i in range(len(records)) if i not in kept]
            # the live counts a move needs, read in one batch rather than one by one: the
            # group left and, on a revert, the one rejoined
            moves: set[str] = set()
            for i in undecided:
                key, digest = rkeys[i], qi_hex[i]
                st = states.get(key) if key is not None else None
                now_in = st.get("current") if st is not None else None
                if st is not None and now_in is not None and now_in[1] != digest:
                    moves.add(now_in[0])
                    back = st.get("qi", {}).get(digest)
                    if back is not None:
                        moves.add(back[0])
            view.prefetch(moves)
        for i in undecided:
            if not complete[i]:
                suppressed.append(i)  # a missing quasi-identifier cannot be aggregated
                continue
            key = rkeys[i]
            if qi_hex and key is not None:
                digest = qi_hex[i]
                digests[i] = digest
                first = seen.get(key)
                if (
                    first is not None
                    and digests.get(first) == digest
                    and first in decision.group_of
                ):
                    # the same respondent twice in a window: one decision, counted once
                    tuples[i] = tuples[first]
                    decision.group_of[i] = decision.group_of[first]
                    if first in decision.current_digest:
                        decision.current_digest[i] = decision.current_digest[first]
                    continue
                waiting = pending_digest.get(key)
                if waiting is not None:
                    # same tuple: the same slot (and one departure); another one: next window
                    (pending if waiting == digest else deferred).append(i)
                    continue
                if first is not None:
                    # another tuple after one already decided here (kept or rejoined): also
                    # the next window's, which sees that decision as the respondent's current
                    deferred.append(i)
                    continue
                seen[key] = i
                st = states.get(key, {})
                current: list[str] | None = st.get("current")
                stored = st.get("qi", {}).get(digest)
                cur_gid = current[0] if current is not None else None
                moving = cur_gid is not None and (stored is None or stored[0] != cur_gid)
                if (
                    current is not None
                    and moving
                    and view.members(current[0], k + 1) - 1 < k
                    and same_stratum(current, grouping.stratum_digests, i)
                ):
                    # leaving would drop the current group below k live members: stay in it
                    stored = st["qi"][current[1]]
                    decision.current_digest[i] = current[1]
                    decision.deferred += 1
                elif stored is not None:
                    decision.hits += 1
                if cur_gid is not None and moving:
                    view.leave(cur_gid)  # reserved now; undone if the record is held
                if stored is not None:
                    tuples[i] = stored[1]
                    decision.group_of[i] = stored[0]
                    if moving or current is None:
                        view.join(stored[0])
                    continue
                pending_digest[key] = digest
            pending.append(i)

        # one slot per distinct (respondent, QI tuple): a respondent counts once in a group
        slot_of: dict[tuple[bytes | int, str | int], int] = {}
        slots: list[int] = []
        members: list[int] = []
        for i in pending:
            key = rkeys[i]
            ident: tuple[bytes | int, str | int] = (
                (key, digests[i]) if key is not None and i in digests else (i, i)
            )
            if ident not in slot_of:
                slot_of[ident] = len(slots)
                slots.append(i)
            members.append(slot_of[ident])

        # slots by scope: one per window, or one per input partition; and per stratum
        scopes: dict[tuple[int | None, str], list[int]] = {}
        strata, sensitive = grouping.strata, grouping.sensitive
        for s_index, i in enumerate(slots):
            scope = self._parts[i] if self._partition_scope else None
            stratum = strata[i] if strata is not None else ""
            scopes.setdefault((scope, stratum), []).append(s_index)
        gid_of_slot: dict[int, str] = {}
        masked_of_slot: dict[int, tuple[object, ...]] = {}
        originals: list[NDArray[np.float64]] = []
        maskeds: list[NDArray[np.float64]] = []
        for (scope, _), scope_slots in sorted(
            scopes.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1])
        ):
            if len(scope_slots) < k:
                continue  # these wait (below) for k new neighbours in their scope
            rec_idx = [slots[s_index] for s_index in scope_slots]  # record index per row
            sub = [[c[t] for t in rec_idx] for c in cols]
            published, label_rows = self._partition(sub)
            published_rows = list(
                zip(*map(published_column, published, self._qi_numeric), strict=True)
            )
            if sensitive is not None and self._diversify is not None:  # or all of them wait
                merged = self._diversify(sub, label_rows, [sensitive[t] for t in rec_idx])
                if merged is None:
                    continue
                if not np.array_equal(merged, label_rows):
                    label_rows = merged
                    centroids = self._centroids(sub, label_rows)
                    published_rows = [tuple(centroids[t]) for t in label_rows.tolist()]
                    published = [list(c) for c in zip(*published_rows, strict=True)]
            num = self._qi_numeric_pos
            if num:
                originals.append(np.array([sub[j] for j in num], dtype=np.float64).T)
                maskeds.append(np.array([published[j] for j in num], dtype=np.float64).T)
            prefix = f"{scope}." if scope is not None else ""
            # each group's rows, label by label, in one sort (a scan per label was quadratic:
            # ~1 s for the 33,000 groups of 100,000 rows at k = 3)
            order = np.argsort(label_rows, kind="stable")
            for idx in np.split(order, np.flatnonzero(np.diff(label_rows[order])) + 1):
                rows_of_group: list[int] = idx.tolist()
                ident_bytes = b"".join(sorted(rids[rec_idx[t]].encode() for t in rows_of_group))
                gid = prefix + hashlib.sha256(ident_bytes).hexdigest()[:16]
                decision.groups.append((gid, len(rows_of_group)))
                view.sizes[gid] = len(rows_of_group)  # slots: distinct respondents
                for t in rows_of_group:
                    gid_of_slot[scope_slots[t]] = gid
            for pos, s_index in enumerate(scope_slots):
                masked_of_slot[s_index] = published_rows[pos]
        view.prefetch(gid for gid, _ in decision.groups)  # a replayed window's groups exist
        joined: set[int] = set()
        first_of_slot = set(slots)  # a slot reserved one departure, not one per record
        for i, s_index in zip(pending, members, strict=True):
            slot_gid = gid_of_slot.get(s_index)
            if slot_gid is None:
                held = self._hold_or_suppress(records[i], i, decision, now=now, flush_all=flush_all)
                if i in first_of_slot:
                    if held:
                        self._undo_departure(records, rkeys, view, i)
                    else:  # published suppressed: it has left its group for good
                        decision.departed.append(i)
                continue
            tuples[i] = masked_of_slot[s_index]
            decision.group_of[i] = slot_gid
            if rkeys[i] is not None and s_index not in joined:
                joined.add(s_index)
                view.join(slot_gid)
        if decision.sampled and self._qi_numeric_pos:
            width = len(self._qi_numeric_pos)
            both = (
                np.vstack(originals) if originals else np.empty((0, width)),
                np.vstack(maskeds) if maskeds else np.empty((0, width)),
            )
            if self._measure_risk:
                decision.measures = window_measures(*both, policy.risk.interval_pct)
            else:  # a shard: its records, even none, so that the merge knows it was sampled
                decision.aggregated = both
        for i in deferred:  # no departure was reserved for these
            self._hold_or_suppress(records[i], i, decision, now=now, flush_all=flush_all)
        return decision

    def _partition(
        self, sub: list[list[object]], k: int | None = None
    ) -> tuple[list[list[object]], NDArray[np.int64]]:
        """Group the rows (one list per k-claim column) in groups of ``k`` (default: the
        policy's) or more and give each row's published values: MDAV over all columns
        together, or individual ranking on a single numeric one."""
        spec = self.policy.microaggregation
        size = spec.k if k is None else k
        if spec.algorithm is MicroaggAlgorithm.RANKING:  # the policy allows one numeric column
            masked, labels = microaggregate(
                np.array(sub, dtype=np.float64).T, size, algorithm="ranking"
            )
            return [masked[:, 0].tolist()], labels[:, 0]
        return mixed_microaggregate(
            self._qi_columns, sub, size, standardize=spec.standardize, rules=self._rules
        )

    def _centroids(self, rows: list[list[object]], labels: NDArray[np.int64]) -> list[list[Any]]:
        """The tuple each group of rows (one list per k-claim column; groups labelled 0..n-1)
        publishes."""
        values = mixed_centroids(self._qi_columns, rows, labels, self._rules)
        first = np.unique(labels, return_index=True)[1].tolist()  # a row of each group
        columns = [
            published_column([column[t] for t in first], numeric)
            for column, numeric in zip(values, self._qi_numeric, strict=True)
        ]
        return [list(t) for t in zip(*columns, strict=True)]

    def _deferred_quasi_identifiers(
        self, *args: Any, **kwargs: Any
    ) -> tuple[QIDecision, dict[str, Group]]:
        """The ``deferred`` mode and the file workflow: no group is re-formed. A respondent's
        state maps each claim digest it published to its tuple, so a replay needs no offsets."""
        kwargs.pop("committed", None)
        return self._quasi_identifiers(*args, **kwargs), {}

    def _republish(
        self,
        records: Sequence[ValidRecord],
        rids: Sequence[str],
        rkeys: Sequence[bytes | None],
        view: _StateView,
        *,
        now: float,
        flush_all: bool,
        by_attribute: Mapping[str, Sequence[Any]] | None,
        qi_digests: list[str] | None,
        grouping: GroupingInputs,
        committed: Committed | None,
    ) -> tuple[QIDecision, dict[str, Group]]:
        """The k claim's decision under the ``regroup`` and ``cohort`` modes
        (:mod:`gateway.grouping.republish`)."""
        assert self._republisher is not None and self._inputs is not None
        policy = self.policy
        names = self._qi_agg
        cols = [
            claim_inputs(policy.attributes[n], c)
            for n, c in zip(names, _attribute_values(records, by_attribute, names), strict=True)
        ]
        complete: list[bool] = [None not in row for row in zip(*cols, strict=True)]
        strata = grouping.strata
        digests = (
            qi_digests
            if qi_digests is not None
            else self._inputs.claim_digests(cols, complete, strata=strata)
        )
        categorical = [c for c, numeric in zip(cols, self._qi_numeric, strict=True) if not numeric]
        # a changed stratum counts as a changed category: the respondent moves
        categories = self._inputs.claim_digests(
            categorical, complete, _CATEGORIES_DIGEST_ATTR, strata=strata
        )
        wave = policy.republication.wave_attribute
        if wave is None:
            releases = ["w" + window_id(records)] * len(records)
        else:
            releases = release_keys(
                _attribute_values(records, by_attribute, [wave])[0], lambda: window_id(records)
            )
        self._releases.see(releases)
        max_hold = policy.window.max_hold_seconds
        scoped = self._partition_scope
        closed = {r: self._releases.closed(r) for r in set(releases)}
        window_qi = WindowQI(
            rids=rids,
            keys=rkeys,
            cols=cols,
            complete=complete,
            digests=digests,
            categories=categories,
            releases=releases,
            scopes=list(self._parts) if scoped else [None] * len(records),
            expired=[True] * len(records)
            if flush_all
            else [now - r.arrived_at >= max_hold for r in records],
            closed=[closed[r] for r in releases],
            strata=grouping.stratum_digests,
            sensitive=None
            if self._ldiv is None or grouping.sensitive is None
            else self._inputs.published_digests(self._ldiv, grouping.sensitive),
        )
        decision, groups = self._republisher.decide(
            window_qi,
            view.states,
            view.touched,
            self._load_groups,
            sampled=(self._windows - 1) % policy.risk.sample_every == 0,
            committed=committed,
        )
        for gid, grp in groups.items():
            view.sizes[gid] = grp.size
        if decision.sampled and decision.aggregated is not None and self._measure_risk:
            decision.measures.update(
                window_measures(*decision.aggregated, policy.risk.interval_pct)
            )
            decision.aggregated = None
        elif not decision.sampled:
            decision.aggregated = None
        return decision, groups

    def _load_groups(self, group_ids: Sequence[str]) -> dict[str, Group]:
        assert self._store is not None
        found = self._store.get_many([group_key(g) for g in group_ids])
        out: dict[str, Group] = {}
        for key, raw in found.items():
            grp = Group.from_doc(decode_state(raw))
            if grp is not None:
                out[group_id(key)] = grp
        return out

    def _hold_or_suppress(
        self, record: ValidRecord, i: int, decision: QIDecision, *, now: float, flush_all: bool
    ) -> bool:
        """A record that cannot be grouped now: held (True) or, once its hold time is over and
        the policy says so, published with its quasi-identifiers suppressed (False)."""
        window = self.policy.window
        expired = flush_all or now - record.arrived_at >= window.max_hold_seconds
        if expired and window.on_hold_timeout is HoldTimeout.SUPPRESS:
            decision.suppressed.append(i)
            return False
        decision.held.append(i)
        return True

    @staticmethod
    def _undo_departure(
        records: Sequence[ValidRecord], rkeys: Sequence[bytes | None], view: _StateView, i: int
    ) -> None:
        """A held record stays, for now, a live member of the group it was leaving."""
        key = rkeys[i]
        current = view.states.get(key, {}).get("current") if key is not None else None
        if current is not None:
            view.join(current[0])

    def _randomize(
        self,
        name: str,
        values: Sequence[object],
        draw_keys: Sequence[bytes | None],
        view: _StateView,
        stored: _StoredLookup,
        *,
        digests: list[tuple[bytes, str]] | None,
    ) -> tuple[list[Any], int, tuple[float, int] | None, list[str | None]]:
        """The published values, sticky hits, retention, and the matrix version each value
        was drawn under (a stored draw keeps the version it was drawn with)."""
        mech = self.mechanisms[name]
        current = self._mech_versions[name]
        codes_of = self._codes[name]
        missing_code = codes_of.get(MISSING_LABEL, -1)
        code_list = [missing_code if v is None else codes_of[str(v)] for v in values]
        codes = np.array(code_list, dtype=np.int64)
        out: list[Any]
        hits = 0
        if view.sticky and digests is not None:
            # one pass per step over the window rather than one loop with branches: the
            # respondent's stored publication of this value, else a fresh keyed draw
            vds = digests
            maps = stored.maps("rr", name)
            found = [
                m.get(hexed) if code >= 0 else None
                for m, (_, hexed), code in zip(maps, vds, code_list, strict=True)
            ]
            out = [None if f is None else f[0] for f in found]
            under: list[str | None] = [
                None if f is None else (f[1] if len(f) > 1 else None) for f in found
            ]
            fresh = [
                i
                for i, (f, code) in enumerate(zip(found, code_list, strict=True))
                if f is None and code >= 0
            ]
            hits = len(found) - found.count(None)
            fresh_keys = [(draw_keys[i] or b"") + vds[i][0] for i in fresh]
            u = self._rand.uniform(f"rr/{name}", len(fresh), fresh_keys) if fresh else np.empty(0)
        else:
            vds = []
            out = [None] * len(values)
            under = [None] * len(values)
            fresh = [i for i, code in enumerate(code_list) if code >= 0]
            u = self._rand.uniform(f"rr/{name}", len(fresh)) if fresh else np.empty(0)
        if fresh:
            categories = mech.categories
            labels = [categories[c] for c in mech.apply(codes[fresh], u).tolist()]
            drawn = [None if label == MISSING_LABEL else label for label in labels]
            for i, label in zip(fresh, drawn, strict=True):
                out[i] = label
                under[i] = current
            if self._store is not None and vds:
                self._store_drawn(
                    view,
                    "rr",
                    name,
                    keys=stored.keys,
                    digests=vds,
                    fresh=fresh,
                    drawn=drawn,
                    version=self._mech_versions[name],
                )
        return out, hits, _kept_share(codes_of, codes, out), under

    def _noise(
        self,
        name: str,
        values: Sequence[object],
        draw_keys: Sequence[bytes | None],
        view: _StateView,
        stored: _StoredLookup,
        *,
        digests: list[tuple[bytes, str]] | None,
    ) -> tuple[list[Any], int]:
        attr = self.policy.attributes[name]
        assert attr.noise is not None
        arr = np.array([np.nan if v is None else float(v) for v in values])  # type: ignore[arg-type]
        if attr.coding is not None:  # top/bottom coding first, then noise on the coded values
            arr = masking.top_bottom_code(arr, attr.coding)
        sd = masking.noise_sd(arr, attr.noise)
        if sd <= 0.0:
            # nothing to scale the noise by (one value, no noise.sd): publish nothing rather
            # than the true value
            return [None] * len(values), 0
        out: list[Any]
        hits = 0
        if view.sticky and digests is not None:
            vds = digests
            maps = stored.maps("noise", name)
            found = [
                m.get(hexed) if v is not None else None
                for m, (_, hexed), v in zip(maps, vds, values, strict=True)
            ]
            out = found
            fresh = [
                i
                for i, (f, v) in enumerate(zip(found, values, strict=True))
                if f is None and v is not None
            ]
            hits = len(found) - found.count(None)
            fresh_keys = [(draw_keys[i] or b"") + vds[i][0] for i in fresh]
            u1 = self._rand.uniform(f"noise/{name}/1", len(fresh), fresh_keys)
            u2 = self._rand.uniform(f"noise/{name}/2", len(fresh), fresh_keys)
        else:
            vds = []
            out = [None] * len(values)
            fresh = [i for i, v in enumerate(values) if v is not None]
            u1 = self._rand.uniform(f"noise/{name}/1", len(fresh))
            u2 = self._rand.uniform(f"noise/{name}/2", len(fresh))
        step = attr.round_to
        if step is not None and hits:  # stored before the policy rounded: idempotent
            kept = np.array([np.nan if v is None else v for v in out], dtype=np.float64)
            out = [_num(v) for v in masking.round_to(kept, step).tolist()]
        if fresh:
            noisy = masking.add_noise(arr[fresh], sd, normals_from_uniforms(u1, u2))
            if step is not None:  # after the noise: the stored value is the published one
                noisy = masking.round_to(noisy, step)
            drawn = [_num(v) for v in noisy.tolist()]
            for i, v in zip(fresh, drawn, strict=True):
                out[i] = v
            if self._store is not None and vds:
                self._store_drawn(
                    view, "noise", name, keys=stored.keys, digests=vds, fresh=fresh, drawn=drawn
                )
        return out, hits

    @staticmethod
    def _store_drawn(
        view: _StateView,
        kind: str,
        name: str,
        *,
        keys: Sequence[bytes | None],
        digests: Sequence[tuple[bytes, str]],
        fresh: Sequence[int],
        drawn: Sequence[Any],
        version: str | None = None,
    ) -> None:
        """Remember each respondent's fresh publication of a value (by its digest), so that
        the same value republishes it: ``[value, mechanism version]`` for randomized
        response, the value for noise."""
        states, touched = view.states, view.touched
        for i, value in zip(fresh, drawn, strict=True):
            key = keys[i]
            if key is not None:
                stored = value if version is None else [value, version]
                _stored_map(states, key, kind, name)[digests[i][1]] = stored
                touched.add(key)


_NOTHING: Mapping[str, Any] = {}  # the default of chained look-ups; never written to


class _EarlyColumn(NamedTuple):
    """An attribute's published values for every record of a window, taken before the grouping
    (:meth:`Engine._early_column`); ``hit``: the value was stored already."""

    name: str
    out: list[Any]
    hit: list[bool]
    drawn: dict[bytes, dict[str, Any]]  # fresh draws by respondent key, as a state holds them
    under: list[Any] | None = None  # randomized response: each value's matrix version

    def store(self, view: _StateView, keys: Iterable[bytes | None]) -> None:
        """Store the fresh draws of these respondents (the window's published ones)."""
        for key in keys:
            fresh = self.drawn.get(key) if key is not None else None
            if fresh is None or key is None:
                continue
            for kind, by_name in fresh.items():
                for name, values in by_name.items():
                    _stored_map(view.states, key, kind, name).update(values)
            view.touched.add(key)


def _kept_share(
    codes_of: Mapping[str, int], codes: NDArray[np.int64], out: Sequence[Any]
) -> tuple[float, int] | None:
    """Randomized response's retention: the share of the randomized records published as their
    true category (an unknown label: not kept), and how many were randomized."""
    published = np.array(
        [codes_of.get(MISSING_LABEL if o is None else o, -2) for o in out], dtype=np.int64
    )
    randomized = codes >= 0
    n = int(randomized.sum())
    return (float(np.mean(published[randomized] == codes[randomized])), n) if n else None


def _keys_at(keys: WindowKeys, positions: Sequence[int]) -> WindowKeys:
    """The keys of the records at ``positions`` (increasing)."""
    return WindowKeys(
        [keys.respondents[i] for i in positions],
        [keys.draws[i] for i in positions],
        {n: [v[i] for i in positions] for n, v in keys.values.items()},
        [keys.quasi_identifiers[i] for i in positions] if keys.quasi_identifiers else [],
    )


def _at(column: list[Any] | None, positions: Sequence[int]) -> list[Any] | None:
    """``column``'s entries at ``positions`` (None: no column)."""
    if column is None:
        return None
    if len(positions) == len(column):  # increasing and distinct: all of them
        return column
    return [column[i] for i in positions]


def _keep_stored_tuples(
    rkeys: Sequence[bytes | None],
    qi_hex: Sequence[str],
    complete: Sequence[bool],
    states: Mapping[bytes, Mapping[str, Any]],
    *,
    decision: QIDecision,
    replays: set[int],
) -> set[int]:
    """Decide the records whose respondent, here once in the window, brings a tuple stored for
    the group it is a live member of: it publishes that group's tuple again and nothing moves
    (most of a panel's returning respondents). The same outcome as the record-by-record
    decision, taken in a few passes over the window; returns those records' indices, with the
    ``replays`` already decided."""
    nothing = _NOTHING
    occurrences = Counter(rkeys)
    sts = [nothing if key is None else states.get(key, nothing) for key in rkeys]
    currents: list[Any] = [st.get("current") for st in sts]
    found: list[Any] = [
        None if current is None else st.get("qi", nothing).get(digest)
        for st, current, digest in zip(sts, currents, qi_hex, strict=True)
    ]
    kept = [
        i
        for i, (entry, current, ok, key) in enumerate(
            zip(found, currents, complete, rkeys, strict=True)
        )
        if entry is not None
        and ok
        and entry[0] == current[0]
        and occurrences[key] == 1
        and i not in replays
    ]
    decision.digests.update(zip(kept, [qi_hex[i] for i in kept], strict=True))
    decision.tuples.update(zip(kept, [found[i][1] for i in kept], strict=True))
    decision.group_of.update(zip(kept, [found[i][0] for i in kept], strict=True))
    decision.hits += len(kept)
    decision.unchanged = {i for i in kept if currents[i][1] == qi_hex[i]} | replays
    return set(kept) | replays


def _deferred_replays(
    rids: Sequence[str],
    rkeys: Sequence[bytes | None],
    qi_hex: Sequence[str],
    complete: Sequence[bool],
    states: Mapping[bytes, Mapping[str, Any]],
    *,
    decision: QIDecision,
) -> set[int]:
    """Under the deferred mode, the records decided before a crash (gateway.grouping.replay):
    each publishes the tuple stored under the claim digest it published then (its own, or the
    one of a move it deferred) and changes nothing. Returns their indices."""
    replays: set[int] = set()
    for i, key in enumerate(rkeys):
        st = states.get(key) if key is not None and complete[i] else None
        if st is None or "p" not in st:
            continue
        outcome = recall(st, rids[i], qi_hex[i])
        if outcome is False:
            continue
        if outcome is None:
            decision.suppressed.append(i)
        else:
            stored = st.get("qi", _NOTHING).get(outcome[1])
            if stored is None:  # not kept: decided again
                continue
            decision.tuples[i], decision.group_of[i] = stored[1], stored[0]
            decision.digests[i] = qi_hex[i]
            decision.hits += 1
        replays.add(i)
    decision.replayed = replays
    return replays


class _StoredLookup:
    """Each record's stored publications, by kind ("rr", "noise") and attribute (by value
    digest; empty: none stored): the respondents' states are looked up once per window and
    each kind once, not once per attribute."""

    __slots__ = ("_kinds", "_states", "keys")

    def __init__(
        self, states: Mapping[bytes, Mapping[str, Any]], keys: Sequence[bytes | None]
    ) -> None:
        self.keys = keys  # the records' respondent keys (None: no respondent id)
        nothing = _NOTHING
        self._states = [nothing if key is None else states.get(key, nothing) for key in keys]
        self._kinds: dict[str, list[Mapping[str, Any]]] = {}

    def maps(self, kind: str, name: str) -> list[Mapping[str, Any]]:
        nothing = _NOTHING
        of_kind = self._kinds.get(kind)
        if of_kind is None:
            of_kind = self._kinds[kind] = [state.get(kind, nothing) for state in self._states]
        return [by_name.get(name, nothing) for by_name in of_kind]


def _stored_map(
    states: dict[bytes, dict[str, Any]], key: bytes, kind: str, name: str
) -> dict[str, Any]:
    """The respondent's stored values of ``kind`` for ``name``, created if absent."""
    state = states.get(key)
    if state is None:
        state = states[key] = {}
    by_name = state.get(kind)
    if by_name is None:
        by_name = state[kind] = {}
    values = by_name.get(name)
    if values is None:
        values = by_name[name] = {}
    return values


def _columns(maps: Sequence[Mapping[str, object]], names: Sequence[str]) -> list[list[Any]]:
    """The values of ``names`` in every map, as one list per name (missing: None)."""
    try:  # validated records carry every policy attribute: plain indexing is cheapest
        return [[m[n] for m in maps] for n in names]
    except KeyError:  # some maps lack some names (file rows, optional fields)
        return [[m.get(n) for m in maps] for n in names]


def _attribute_values(
    records: Sequence[ValidRecord],
    columns: Mapping[str, Sequence[Any]] | None,
    names: Sequence[str],
    positions: Sequence[int] | None = None,
) -> list[list[Any]]:
    """The values of ``names`` for the records at ``positions`` (default: all, in order), one
    list per name: from ``columns`` when the caller gave them, else from each record."""
    n = len(records)
    if columns is None:
        if positions is None:
            return _columns([r.values for r in records], names)
        return _columns([records[i].values for i in positions], names)
    # positions are increasing and distinct, so as many as records means all of them
    every = positions is None or len(positions) == n
    out: list[list[Any]] = []
    for name in names:
        col = columns.get(name)
        if col is None:
            out.append([None] * (n if positions is None else len(positions)))
        elif every:
            out.append(list(col))
        else:
            assert positions is not None
            out.append([col[i] for i in positions])
    return out


def _num(v: float | np.floating[Any]) -> float | None:
    f = float(v)
    return f if math.isfinite(f) else None


def _output_rows(names: Sequence[str], columns: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The published records as mappings, members in ``names`` order (built by ``map``: a
    quarter less than a comprehension; each row has one value per name by construction)."""
    return list(map(dict, map(zip, repeat(names), zip(*columns, strict=True))))


def _encode(rows: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """The published records as the output topic carries them: one JSON object each."""
    return list(map(orjson.dumps, rows))


def encode_rows(names: Sequence[str], columns: Sequence[Sequence[Any]]) -> list[bytes]:
    """The published records' values (``WindowResult.output``) encoded as ``protect_window``
    encodes them itself unless told not to."""
    return _encode(_output_rows(names, columns))


def window_id(records: Sequence[ValidRecord]) -> str:
    """A window's id: a digest of its records' ids (positions for records without a source),
    the same for the same records whichever engine or shards protect them."""
    return _window_digest(r.source.record_id if r.source else str(i) for i, r in enumerate(records))


def _window_digest(ids: Iterable[str]) -> str:
    return hashlib.sha256("|".join(ids).encode()).hexdigest()[:16]


def window_measures(
    x: NDArray[np.float64], masked: NDArray[np.float64], p_pct: float
) -> dict[str, float]:
    """Utility and risk of the records microaggregated in a window (true and masked rows)."""
    if x.shape[0] < 2:
        return {}
    return {
        "sse_sst_pct": quality.sse_sst_pct(x, masked),
        "il1s": quality.il1s(x, masked),
        "dld": quality.dld(x, masked),
        "interval_disclosure": quality.interval_disclosure(x, masked, p_pct),
    }
