"""The policy's msgspec Struct in front of the general validator: it takes the usual record in
one pass and never decides otherwise than the general validator would."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.policy import MAX_WAVE, load_policy
from gateway.validation import Rejection, _compile
from gateway.validation_struct import struct_first
from tests.gateway.test_validation import ADULT, GOOD, POLICY, _adult_records

ADULT_POLICY = load_policy(ADULT)
ADULT_RECORD: dict[str, Any] = orjson.loads(_adult_records(ADULT_POLICY, 1)[0])


def _both(policy: Any) -> tuple[Any, Any]:
    general = _compile(policy, 4096, 8)
    return general, struct_first(policy, general, 4096, 8)


def test_the_usual_record_never_reaches_the_general_validator() -> None:
    calls: list[bytes] = []
    general = _compile(ADULT_POLICY, 4096, 8)

    def counting(raw: Any, key: Any) -> Any:
        calls.append(raw)
        return general(raw, key)

    fast = struct_first(ADULT_POLICY, counting, 4096, 8)
    raw = orjson.dumps({**ADULT_RECORD, "workclass": "?", "native_country": ""})
    rid, values = fast(raw, b"r0")
    assert calls == []
    assert (rid, values) == general(raw, b"r0")
    assert values["workclass"] is None and values["native_country"] is None
    assert list(values) == list(ADULT_POLICY.attributes)
    # a category comes back as the policy's own object: a window's column repeats it
    assert values["sex"] is fast(raw.replace(b'"r0"', b'"r1"'), b"r1")[1]["sex"]


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "?", "F", "M", "low", "Male", "White", "x", 'a"b', "a\\b", "\ud7ff"]),
    st.sampled_from(
        ["2024-05-01T10:00:00+00:00", "2024-13-01T10:00:00", "0001-01-01T00:00:00+01:00"]
    ),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


def _mutations(base: dict[str, Any]) -> st.SearchStrategy[bytes]:
    names = [*base, "extra"]
    change = st.dictionaries(st.sampled_from(names), _VALUES, max_size=3)
    drop = st.lists(st.sampled_from(list(base)), max_size=2)
    dup = st.one_of(st.none(), st.sampled_from(list(base)))

    def build(changes: dict[str, Any], dropped: list[str], repeated: str | None) -> bytes:
        rec = {k: v for k, v in {**base, **changes}.items() if k not in dropped}
        raw = json.dumps(rec, separators=(",", ":"), ensure_ascii=False).encode()  # big ints too
        if repeated is not None:
            raw = raw.replace(b"{", b"{" + orjson.dumps({repeated: base[repeated]})[1:-1] + b",", 1)
        return raw

    return st.builds(build, change, drop, dup)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(raw=_mutations(GOOD), key=st.sampled_from([b"r1", b"", None]))
def test_the_struct_decides_as_the_general_validator(raw: bytes, key: bytes | None) -> None:
    general, fast = _both(POLICY)
    assert fast(raw, key) == general(raw, key)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(raw=_mutations(ADULT_RECORD))
def test_on_the_adult_policy_too(raw: bytes) -> None:
    general, fast = _both(ADULT_POLICY)
    got, want = fast(raw, b"r0"), general(raw, b"r0")
    assert got == want
    if isinstance(want, Rejection):
        assert got is want or (got.reason, got.field) == (want.reason, want.field)


@settings(max_examples=300, deadline=None)
@given(
    wave=st.one_of(
        st.integers(-(2**40), 2**40),
        st.integers(2**31 - 3, 2**31 + 3),
        st.floats(-(2.0**40), 2.0**40, allow_nan=False, allow_infinity=False),
    )
)
def test_a_wave_is_a_whole_number_in_0_to_max_wave(wave: float) -> None:
    """A wave of 2^31 failed every window that held it (the roster stores waves as int32), on
    every worker that read it again; 1.5 was published as wave 1. Both validators take a wave
    exactly when it is a whole number in [0, MAX_WAVE], and say why not."""
    general, fast = _both(ADULT_POLICY)
    raw = orjson.dumps({**ADULT_RECORD, "wave": wave})
    got, want = fast(raw, b"r0"), general(raw, b"r0")
    whole = float(wave).is_integer()
    if whole and 0 <= wave <= MAX_WAVE:
        assert not isinstance(want, Rejection) and want[1]["wave"] == wave
        assert got == want
    else:
        assert isinstance(got, Rejection) and isinstance(want, Rejection)
        expected = "out_of_range" if whole else "wrong_type"  # 1.5 is no wave, whatever its range
        assert (got.reason, got.field) == (want.reason, want.field) == (expected, "wave")
