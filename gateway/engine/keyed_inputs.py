"""A window's keyed digests (:class:`WindowKeys`): what the engine derives from the secret before
it reads any state — respondent keys, what keyed draws are bound to, digests of sticky values and
of the k-claim tuple — computed by :class:`KeyedInputs` with the value digests memoised."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple, cast

import orjson

from gateway.engine.records import (
    Columns,
    ValidRecord,
    attribute_values,
    record_ids,
    window_columns,
)
from gateway.grouping.mixed_microaggregation import claim_inputs
from gateway.grouping.strata import stratum_texts
from gateway.keyed.keyed import Keyring
from gateway.policy import MISSING_LABEL, ConsistencyMode, Method, Policy, RepublicationMode

_QI_DIGEST_ATTR = "\x00quasi-identifiers"
CATEGORIES_DIGEST_ATTR = "\x00categorical-quasi-identifiers"  # a tuple's categories alone
RECODED_DIGEST_ATTR = "\x00recoded-quasi-identifiers"  # a recoded tuple (recode_suppress)
_STRATUM_DIGEST_ATTR = "\x00stratum"
_PUBLISHED_DIGEST_ATTR = "\x00published:"  # + attribute: a published value (l-diversity)
_PUBLISHED_DIGEST_BYTES = 8  # a group keeps its release's distinct values as these


def value_text(value: object) -> str:
    """Canonical text of a true value for digests (ints and floats of equal value agree)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _qi_text(values: tuple[float, ...]) -> str:
    """Canonical text of a quasi-identifier tuple (what its digest is taken of)."""
    return orjson.dumps([value_text(v) for v in values]).decode()


DIGEST_CACHE_LIMIT = 1 << 18  # entries per attribute; cleared, not evicted, when full


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
        gives the canonical text of a value (default: :func:`value_text`)."""
        cache = self._cache.setdefault(attribute, {})
        # one look-up per value (a tuple of quasi-identifiers is hashed anew each time), and
        # the hits kept in hand: a cache cleared for the misses below must not lose them
        found: list[tuple[bytes, str] | None] = list(map(cache.get, values))
        misses = [i for i, f in enumerate(found) if f is None]
        if not misses:
            return found  # type: ignore[return-value]
        missing = list(dict.fromkeys([values[i] for i in misses]))
        if len(cache) + len(missing) > DIGEST_CACHE_LIMIT:
            cache.clear()
        canonical = text or value_text
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


class KeyedInputs:
    """Computes :class:`WindowKeys` for a policy and secret. Value digests are memoised (see
    :class:`_ValueDigests`), so one instance serves every window of a worker or engine."""

    __slots__ = ("_claim", "_digests", "_keyring", "_sticky_values", "_strata")

    def __init__(self, policy: Policy, keyring: Keyring) -> None:
        self._keyring = keyring
        self._digests = _ValueDigests(keyring)
        sticky = policy.consistency.mode is ConsistencyMode.STICKY
        # a panel publishes its members' tuples from its roster and looks no claim tuple up:
        # its digests would cost the worker 2-4 µs a record for nothing
        panel = policy.republication.mode is RepublicationMode.PANEL
        claim = policy.k_claim if sticky else []
        self._claim = [] if panel else [(n, policy.attributes[n]) for n in claim]
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
        by_attribute: Columns | None = None,
        claim: bool = True,
    ) -> WindowKeys:
        """The records' keys (``rids``: their :func:`record_ids`, when the caller has them;
        ``by_attribute``: their values as columns, when the caller holds them so).
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
        columns = window_columns(records) if by_attribute is None else by_attribute
        digests = self._digests
        values = {
            name: digests.many(name, column)
            for name, column in zip(
                self._sticky_values,
                attribute_values(columns, len(records), self._sticky_values),
                strict=True,
            )
        }
        qi: list[str] = []
        if self._claim and claim:
            cols = [
                claim_inputs(attr, column)
                for (_, attr), column in zip(
                    self._claim,
                    attribute_values(columns, len(records), [n for n, _ in self._claim]),
                    strict=True,
                )
            ]
            qi = self.claim_digests(
                cols,
                [None not in row for row in zip(*cols, strict=True)],
                strata=strata_of(self._strata, columns, len(records)),
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


def strata_of(names: Sequence[str], columns: Columns, size: int) -> list[str] | None:
    """Each of the window's ``size`` records' stratum as text
    (:func:`gateway.grouping.strata.stratum_texts`); None when the policy names no strata."""
    if not names:
        return None
    return stratum_texts(attribute_values(columns, size, names), size)


def keys_at(keys: WindowKeys, positions: Sequence[int]) -> WindowKeys:
    """The keys of the records at ``positions`` (increasing)."""
    return WindowKeys(
        [keys.respondents[i] for i in positions],
        [keys.draws[i] for i in positions],
        {n: [v[i] for i in positions] for n, v in keys.values.items()},
        [keys.quasi_identifiers[i] for i in positions] if keys.quasi_identifiers else [],
    )
