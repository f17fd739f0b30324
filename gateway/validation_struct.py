"""Decode and validate in one pass: a msgspec Struct built from the policy, in front of the
general validator (:mod:`gateway.validation`).

The Struct's fields are the policy's attributes (and the respondent id), each typed so that
msgspec accepts exactly what the general validator's fast path accepts: an in-range integer
or finite float below 2^53 for a numeric attribute, a known category or a missing token for a
categorical one, non-empty text for the id; unknown fields are refused. msgspec parses and
checks a record in C. Whatever it refuses — and whatever might hide a repeated key or an
escape — goes to the general validator, which decides the reason exactly as before: the
Struct only ever accepts, so the dead-letter reasons have one source.

A record is taken only when it has no backslash (no escapes: msgspec and orjson may differ on
escaped surrogates) and exactly two quotes per key and per text value (no key given twice:
msgspec, like orjson, keeps the last one silently). Category values come back as the
policy's own string objects, so a window's columns repeat one object per category.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec

from gateway.mechanisms.masking import parse_timestamp
from gateway.policy import AttrType, Policy

_SAFE = 2**53  # gateway.validation.MAX_SAFE_INTEGER (not imported: it imports this module)
Result = Any  # gateway.validation._Result


def _numeric(lo: float | None, hi: float | None, *, whole: bool = False) -> Any | None:
    """An int in [lo, hi] within ±2^53, or a float in it strictly within ±2^53 (the general
    validator's own bounds); None when no integer fits (the general validator decides).
    ``whole``: ints only (a float, whole or not, is the general validator's to decide)."""
    int_lo = -_SAFE if lo is None else max(math.ceil(lo), -_SAFE)
    int_hi = _SAFE if hi is None else min(math.floor(hi), _SAFE)
    low: dict[str, float] = {"gt": -_SAFE} if lo is None or lo <= -_SAFE else {"ge": lo}
    high: dict[str, float] = {"lt": _SAFE} if hi is None or hi >= _SAFE else {"le": hi}
    as_float = Annotated[float, msgspec.Meta(**low, **high)]
    if int_lo > int_hi:  # (never for a wave: the policy refuses a range without one)
        return as_float
    as_int = Annotated[int, msgspec.Meta(ge=int_lo, le=int_hi)]
    return as_int if whole else as_int | as_float


def struct_first(
    policy: Policy, general: Callable[[Any, Any], Result], max_bytes: int, max_depth: int
) -> Callable[[Any, Any], Result]:
    """``general`` with the policy's Struct in front of it, or ``general`` itself where the
    policy's shape does not suit one (an id that is also an attribute, no nesting allowed)."""
    rid = policy.input.respondent_id
    if max_depth < 1 or (rid is not None and rid in policy.attributes):
        return general
    missing = frozenset(policy.input.missing_tokens)
    fields: list[tuple[str, Any]] = []
    rename: dict[str, str] = {}
    ns: dict[str, Any] = {"MISSING": missing, "is_time": parse_timestamp}
    items: list[str] = []
    checks: list[str] = []
    strings = 0
    for i, (name, attr) in enumerate(policy.attributes.items()):
        f = f"f{i}"
        rename[f] = name
        if attr.type is AttrType.NUMERIC:
            lo, hi = policy.numeric_range(name)
            fields.append((f, _numeric(lo, hi, whole=policy.whole_number(name))))
            items.append(f"{name!r}: s.{f}")
            continue
        strings += 1
        if attr.type is AttrType.TIMESTAMP:
            fields.append((f, str))
            checks.append(f"    if s.{f} in MISSING or is_time(s.{f}) is None:")
            checks.append("        return general(raw, key)")
            items.append(f"{name!r}: s.{f}")
        elif attr.categories is not None:
            # the policy's objects; a missing token reads as None, as the general path has it
            table: dict[str, str | None] = {c: c for c in attr.categories if c.__class__ is str}
            table |= dict.fromkeys(missing)
            if not table:
                return general
            ns[f"C{i}"] = table
            fields.append((f, Literal[tuple(table)]))
            items.append(f"{name!r}: C{i}[s.{f}]")
        else:
            fields.append((f, str))
            items.append(f"{name!r}: (None if (v := s.{f}) in MISSING else v)")
    if rid is not None:
        fields.append(("rid", Annotated[str, msgspec.Meta(min_length=1)]))
        rename["rid"] = rid
    keys = len(policy.attributes) + (rid is not None)
    quotes = 2 * (keys + strings + (rid is not None))
    try:
        struct = msgspec.defstruct(
            "Record", fields, forbid_unknown_fields=True, rename=rename, gc=False
        )  # gc=False: scalar fields only, no cycle to find; never tracked by the collector
    except ValueError:  # a field name JSON writes with escapes: the general validator's
        return general
    ns |= {"decode": msgspec.json.Decoder(struct).decode, "general": general}
    ns["Refused"] = (msgspec.DecodeError, ValueError)  # ValueError: undecodable UTF-8
    keyed = "" if policy.input.key_field is not None else "key and "
    src = [
        "def decode_and_validate(raw, key):",
        f"    if not ({keyed}raw and len(raw) <= {max_bytes} and raw.count(b'\"') == {quotes}"
        " and b'\\\\' not in raw):",
        "        return general(raw, key)",
        "    try:",
        "        s = decode(raw)",
        "    except Refused:",
        "        return general(raw, key)",
        *checks,
        f"    return {'s.rid' if rid is not None else 'None'}, {{{', '.join(items)}}}",
    ]
    exec(compile("\n".join(src), f"<struct validator for policy {policy.version}>", "exec"), ns)
    fn: Callable[[Any, Any], Result] = ns["decode_and_validate"]
    return fn
