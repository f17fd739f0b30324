"""Decode and validate one input record against the policy (the stream worker's hot path).

Pure: no Kafka, no I/O. A record is either accepted — ``(respondent_id, values)`` with one
typed value per policy attribute (missing = ``None``) — or rejected with a :class:`Rejection`
whose reason comes from the closed set :class:`DLQReason`. A rejection names at most a policy
attribute, never a value: it travels in DLQ headers, logs and metric labels.

``Validator(policy)`` precomputes per-attribute lookup tables once; ``decode_and_validate``
then costs a few microseconds per record. Rare failure paths (undecodable bytes, non-finite
literals, very large integers, deep nesting) are classified on a slow path that only runs for
bad input.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import orjson

from gateway.mechanisms.masking import TimestampFault, parse_timestamp, timestamp_fault
from gateway.policy import AttrType, ExtraFields, Policy
from gateway.validation_struct import struct_first


class DLQReason(StrEnum):
    """Why a record went to the dead-letter topic (a closed set; a metric label)."""

    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    EMPTY_MESSAGE = "empty_message"
    TOO_LARGE = "too_large"
    TOO_DEEP = "too_deep"
    MISSING_FIELD = "missing_field"
    EXTRA_FIELD = "extra_field"
    WRONG_TYPE = "wrong_type"
    UNKNOWN_CATEGORY = "unknown_category"
    OUT_OF_RANGE = "out_of_range"
    NON_FINITE = "non_finite"
    INTEGER_TOO_LARGE = "integer_too_large"
    MISSING_KEY = "missing_key"
    DUPLICATE_KEY = "duplicate_key"  # a JSON object names a field twice: which one is meant?
    KEY_MISMATCH = "key_mismatch"  # the Kafka key is not the record's respondent id
    # on a partition its key does not pick (partitioned state: a producer with another
    # partitioner than Kafka's default murmur2, and no input.key_field to re-route it)
    WRONG_PARTITION = "wrong_partition"
    # an operator's control record (``privgw wave close``) the worker cannot read
    BAD_CONTROL = "bad_control"


@dataclass(frozen=True, slots=True)
class Rejection:
    """A rejected record: the reason, the policy attribute concerned (if any) and the class
    of error (a Python exception class name). Never carries a value."""

    reason: DLQReason
    field: str | None
    error_class: str


#: Largest integer magnitude every JSON consumer represents exactly (IEEE double).
MAX_SAFE_INTEGER: Final = 2**53
DEFAULT_MAX_BYTES: Final = 1_048_576
DEFAULT_MAX_DEPTH: Final = 64

_R = DLQReason
_ERROR_CLASS: Final[dict[DLQReason, str]] = {
    _R.INVALID_UTF8: "UnicodeDecodeError",
    _R.INVALID_JSON: "JSONDecodeError",
    _R.NOT_AN_OBJECT: "TypeError",
    _R.EMPTY_MESSAGE: "ValueError",
    _R.TOO_LARGE: "ValueError",
    _R.TOO_DEEP: "RecursionError",
    _R.MISSING_FIELD: "KeyError",
    _R.EXTRA_FIELD: "KeyError",
    _R.WRONG_TYPE: "TypeError",
    _R.UNKNOWN_CATEGORY: "ValueError",
    _R.OUT_OF_RANGE: "ValueError",
    _R.NON_FINITE: "ValueError",
    _R.INTEGER_TOO_LARGE: "OverflowError",
    _R.MISSING_KEY: "KeyError",
    _R.DUPLICATE_KEY: "ValueError",
    _R.KEY_MISMATCH: "ValueError",
    _R.WRONG_PARTITION: "ValueError",
    _R.BAD_CONTROL: "ValueError",
}


def rejection(reason: DLQReason, field: str | None = None) -> Rejection:
    return Rejection(reason, field, _ERROR_CLASS[reason])


# An integer literal with 16 or more digits (≥ 10^15; the exact bound is checked on the value).
_LONG_INT = re.compile(rb"(?<![\d.eE+\-])-?\d{16,}(?![\d.eE])")
_NUMERIC: Final = 0
_CATEGORICAL: Final = 1
_ABSENT: Final = object()


class _NonFiniteError(ValueError):
    pass


def _reject_constant(_name: str) -> float:
    raise _NonFiniteError


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFiniteError
    return value


def _depth_exceeds(obj: object, limit: int) -> bool:
    """True when containers nest more than ``limit`` levels (iterative; stops early)."""
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, dict | list))
    return False


class _DuplicateKeyError(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKeyError
    return obj


def has_duplicate_key(raw: bytes, obj: dict[str, object]) -> bool:
    """Whether any object in ``raw`` (valid JSON, decoded as ``obj``) names a key twice: orjson
    keeps the last one silently, so ``{"age": 500, "age": 39}`` would pass as 39.

    Every top-level key and string value of ``obj`` brings two quote characters, and a key
    given twice brings two more: exactly that many quotes means no repeated key (nested
    objects and escaped quotes only add quotes, and go to the exact check)."""
    strings = sum(1 for v in obj.values() if v.__class__ is str)
    if raw.count(b'"') == 2 * (len(obj) + strings):
        return False
    try:
        json.loads(raw, object_pairs_hook=_unique_pairs)
    except _DuplicateKeyError:
        return True
    except (ValueError, RecursionError):
        return False  # orjson accepted it; anything json refuses is not a duplicate
    return False


def _has_long_integer_literal(raw: bytes) -> bool:
    return any(abs(int(match.group())) > MAX_SAFE_INTEGER for match in _LONG_INT.finditer(raw))


# name, required, categories, range (low, high), whole numbers only
_Spec = tuple[str, bool, frozenset[str] | None, float | None, float | None, bool]
_Result = tuple[str | None, dict[str, object]] | Rejection


class Validator:
    """Validates raw Kafka records against one policy; build once, call per record.

    The per-record check is generated once per policy as straight-line Python (one block per
    attribute, names and bounds inlined as literals): a loop over a field table costs about
    three times as much on CPython. Uncommon cases (missing, wrong type, floats near 2^53)
    go to the general helpers below.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> None:
        self.policy = policy
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        general = _compile(policy, max_bytes, max_depth)
        # the policy's msgspec Struct first: it only accepts; anything else goes to ``general``
        self.decode_and_validate: Callable[[bytes | None, bytes | None], _Result] = struct_first(
            policy, general, max_bytes, max_depth
        )
        self.expected_key = _expected_key(policy)


def _expected_key(policy: Policy) -> Callable[[str | None, dict[str, object]], bytes | None] | None:
    """The Kafka key an accepted record must carry, from its respondent id and values (a record
    keyed otherwise is refused, reason key_mismatch, or re-keyed under ``input.key_field``):
    the key picks the partition, and so where the respondent's state lives. ``None`` when the
    policy names no identifying field."""
    ident = policy.input.key_field or policy.input.respondent_id
    if ident is None:
        return None
    if ident == policy.input.respondent_id:
        return lambda rid, _values: None if rid is None else rid.encode()
    return lambda _rid, values: None if (v := values.get(ident)) is None else str(v).encode()


def _compile(
    policy: Policy, max_bytes: int, max_depth: int
) -> Callable[[bytes | None, bytes | None], _Result]:
    """The policy's validator, generated as one straight-line function: a fast path per
    attribute for the usual value, the slow checks only when it does not apply."""
    missing = frozenset(policy.input.missing_tokens)
    rid_field = policy.input.respondent_id
    known = set(policy.attributes) | ({rid_field} if rid_field is not None else set())
    ns = _namespace(missing, known)
    src = _prologue(policy, max_bytes, max_depth)
    for i, name in enumerate(policy.attributes):
        src += _attribute_lines(i, name, policy, missing, ns)
    src += _epilogue(policy, known, rid_field)
    code = compile("\n".join(src), f"<validator for policy {policy.version}>", "exec")
    exec(code, ns)
    fn = ns["decode_and_validate"]
    return fn  # type: ignore[return-value]


def _namespace(missing: frozenset[str], known: set[str]) -> dict[str, object]:
    """What the generated validator refers to."""
    return {
        "loads": orjson.loads,
        "JSONDecodeError": orjson.JSONDecodeError,
        "classify": _classify_undecodable,
        "depth_exceeds": _depth_exceeds,
        "has_duplicate_key": has_duplicate_key,
        "Rejection": Rejection,
        "ABSENT": _ABSENT,
        "MISSING": missing,
        "KNOWN": frozenset(known),
        "slow_numeric": _slow_numeric,
        "slow_categorical": _slow_categorical,
        "slow_timestamp": _slow_timestamp,
        "is_time": _is_timestamp,
        "slow_rid": _slow_rid,
        **{
            f"R_{r.reason.name}": r
            for r in (
                _EMPTY,
                _TOO_LARGE,
                _MISSING_KEY,
                _TOO_DEEP,
                _NOT_AN_OBJECT,
                _EXTRA_FIELD,
                _DUPLICATE_KEY,
            )
        },
    }


def _prologue(policy: Policy, max_bytes: int, max_depth: int) -> list[str]:
    """The message as a whole: present, not too large, keyed, JSON, not too deep, an object."""
    src = [
        "def decode_and_validate(raw, key):",
        "    if not raw:",
        "        return R_EMPTY_MESSAGE",
        f"    if len(raw) > {max_bytes}:",
        "        return R_TOO_LARGE",
    ]
    if policy.input.key_field is None:
        src += ["    if not key:", "        return R_MISSING_KEY"]
    return [
        *src,
        "    try:",
        "        obj = loads(raw)",
        "    except JSONDecodeError:",
        "        return classify(raw)",
        f"    if raw.count(b'[') + raw.count(b'{{') > {max_depth}"
        f" and depth_exceeds(obj, {max_depth}):",
        "        return R_TOO_DEEP",
        "    if obj.__class__ is not dict:",
        "        return R_NOT_AN_OBJECT",
        "    g = obj.get",
        "    absent = False",
        "    slow = False",
    ]


def _attribute_lines(
    i: int, name: str, policy: Policy, missing: frozenset[str], ns: dict[str, object]
) -> list[str]:
    """Attribute ``i``: its fast check, else its slow one (which may reject the record)."""
    attr = policy.attributes[name]
    v, lit = f"v{i}", repr(name)
    lo, hi = policy.numeric_range(name)
    cats = frozenset(attr.categories) - missing if attr.categories is not None else None
    ns[f"S{i}"] = (name, attr.required, cats, lo, hi, policy.whole_number(name))
    src = [f"    {v} = g({lit}, ABSENT)"]
    if attr.type is AttrType.NUMERIC:
        fast_lo = -MAX_SAFE_INTEGER if lo is None else max(lo, -MAX_SAFE_INTEGER)
        fast_hi = MAX_SAFE_INTEGER if hi is None else min(hi, MAX_SAFE_INTEGER)
        src.append(f"    if {v}.__class__ is not int or not {fast_lo!r} <= {v} <= {fast_hi!r}:")
        src.append(f"        {v} = slow_numeric({v}, S{i}, raw, MISSING)")
    elif attr.type is AttrType.TIMESTAMP:
        src.append(f"    if {v}.__class__ is not str or {v} in MISSING or not is_time({v}):")
        src.append(f"        {v} = slow_timestamp({v}, S{i}, MISSING)")
    elif cats is not None:
        ns[f"C{i}"] = cats
        src.append(f"    if {v}.__class__ is not str or {v} not in C{i}:")
        src.append(f"        {v} = slow_categorical({v}, S{i}, MISSING)")
    else:
        src.append(f"    if {v}.__class__ is not str or {v} in MISSING:")
        src.append(f"        {v} = slow_categorical({v}, S{i}, MISSING)")
    return [
        *src,
        "        slow = True",
        f"        if {v}.__class__ is Rejection:",
        f"            return {v}",
        f"        if {lit} not in obj:",
        "            absent = True",
    ]


def _epilogue(policy: Policy, known: set[str], rid_field: str | None) -> list[str]:
    """The respondent id, repeated keys, extra fields, and the decoded record."""
    src: list[str] = []
    if rid_field is not None:
        src += [
            f"    rid = g({rid_field!r})",
            "    if rid.__class__ is not str or not rid:",
            f"        rid = slow_rid(rid, {rid_field!r}, raw)",
            "        slow = True",
            "        if rid.__class__ is Rejection:",
            "            return rid",
        ]
    else:
        src.append("    rid = None")
    # A repeated key (orjson keeps the last): when every value took its fast path (categories,
    # timestamps and ids are strings, numbers are ints) and only the policy's fields are there,
    # the quotes are exactly two per key and per string value; anything else is counted.
    n_strings = sum(a.type is not AttrType.NUMERIC for a in policy.attributes.values())
    quotes = 2 * (len(known) + n_strings + (rid_field is not None))
    src += [
        f"    if (slow or len(obj) != {len(known)} or raw.count(b'\"') != {quotes})"
        " and has_duplicate_key(raw, obj):",
        "        return R_DUPLICATE_KEY",
    ]
    if policy.input.extra_fields is ExtraFields.ERROR:
        # the extra field's name is input data, not a policy name: never reported
        src += [
            f"    if (absent or len(obj) != {len(known)}) and not KNOWN.issuperset(obj):",
            "        return R_EXTRA_FIELD",
        ]
    items = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(policy.attributes))
    src.append(f"    return rid, {{{items}}}")
    return src


def _slow_numeric(v: object, spec: _Spec, raw: bytes, missing: frozenset[str]) -> object:
    """A numeric attribute that is not a plain in-range int: float, missing, bad type."""
    name, required, _, lo, hi, whole = spec
    if v is _ABSENT or v is None or (type(v) is str and v in missing):
        return Rejection(_R.MISSING_FIELD, name, "KeyError") if required else None
    if type(v) is int:
        if v > MAX_SAFE_INTEGER or v < -MAX_SAFE_INTEGER:
            return Rejection(_R.INTEGER_TOO_LARGE, name, "OverflowError")
    elif type(v) is float:
        if not -MAX_SAFE_INTEGER < v < MAX_SAFE_INTEGER:
            # orjson turns integer literals beyond 64 bits into floats silently
            if _has_long_integer_literal(raw):
                return Rejection(_R.INTEGER_TOO_LARGE, name, "OverflowError")
            if not math.isfinite(v):
                return Rejection(_R.NON_FINITE, name, "ValueError")
        if whole and not v.is_integer():  # a wave 1.5 is no wave
            return Rejection(_R.WRONG_TYPE, name, "TypeError")
    else:
        return Rejection(_R.WRONG_TYPE, name, "TypeError")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        return Rejection(_R.OUT_OF_RANGE, name, "ValueError")
    return v


def _slow_categorical(v: object, spec: _Spec, missing: frozenset[str]) -> object:
    """A categorical attribute that is not a plain known category: missing, unknown, bad type."""
    name, required, cats, _, _, _ = spec
    if v is _ABSENT:
        return Rejection(_R.MISSING_FIELD, name, "KeyError") if required else None
    if v is None:
        return None  # a declared missing value; the policy's `missing` setting decides
    if type(v) is not str:
        return Rejection(_R.WRONG_TYPE, name, "TypeError")
    if v in missing:
        return None
    if cats is not None and v not in cats:
        return Rejection(_R.UNKNOWN_CATEGORY, name, "ValueError")
    return v


def _is_timestamp(text: str) -> bool:
    return parse_timestamp(text) is not None


def _slow_timestamp(v: object, spec: _Spec, missing: frozenset[str]) -> object:
    """A timestamp that is not accepted ISO 8601 text: missing, the wrong type, or a valid
    local time whose instant falls outside what UTC represents (coarsening would overflow)."""
    checked = _slow_categorical(v, spec, missing)
    if checked.__class__ is str:
        fault = timestamp_fault(checked)
        if fault is TimestampFault.OUT_OF_RANGE:
            return Rejection(_R.OUT_OF_RANGE, spec[0], "OverflowError")
        if fault is not None:
            return Rejection(_R.WRONG_TYPE, spec[0], "TypeError")
    return checked


def _slow_rid(r: object, name: str, raw: bytes) -> str | Rejection:
    """The respondent id when it is not a non-empty string: an int, missing, bad type."""
    if type(r) is int:
        if r > MAX_SAFE_INTEGER or r < -MAX_SAFE_INTEGER:
            return Rejection(_R.INTEGER_TOO_LARGE, name, "OverflowError")
        return str(r)
    if r is None or r == "":
        return Rejection(_R.MISSING_FIELD, name, "KeyError")
    if type(r) is float and _has_long_integer_literal(raw):
        return Rejection(_R.INTEGER_TOO_LARGE, name, "OverflowError")
    return Rejection(_R.WRONG_TYPE, name, "TypeError")


def decode_and_validate(
    raw: bytes | None,
    key: bytes | None,
    policy: Policy,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> tuple[str | None, dict[str, object]] | Rejection:
    """One-off convenience; build a :class:`Validator` once for a stream of records."""
    return Validator(policy, max_bytes=max_bytes, max_depth=max_depth).decode_and_validate(raw, key)


def _classify_undecodable(raw: bytes) -> Rejection:
    """Slow path: why orjson refused the bytes (bad UTF-8, NaN/Infinity, 1e999, junk)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return _INVALID_UTF8
    if not text.strip():
        return _EMPTY
    try:
        json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except _NonFiniteError:
        return _NON_FINITE
    except RecursionError:
        return _TOO_DEEP
    except (ValueError, TypeError):
        pass
    return _INVALID_JSON


_EMPTY: Final = rejection(_R.EMPTY_MESSAGE)
_TOO_LARGE: Final = rejection(_R.TOO_LARGE)
_TOO_DEEP: Final = rejection(_R.TOO_DEEP)
_MISSING_KEY: Final = rejection(_R.MISSING_KEY)
_NOT_AN_OBJECT: Final = rejection(_R.NOT_AN_OBJECT)
_EXTRA_FIELD: Final = rejection(_R.EXTRA_FIELD)
_DUPLICATE_KEY: Final = rejection(_R.DUPLICATE_KEY)
_INVALID_UTF8: Final = rejection(_R.INVALID_UTF8)
_INVALID_JSON: Final = rejection(_R.INVALID_JSON)
_NON_FINITE: Final = rejection(_R.NON_FINITE)
