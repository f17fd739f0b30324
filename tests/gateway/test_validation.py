"""Decode + validate: every DLQ reason, the accepted shapes, and no value in any rejection."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway import validation
from gateway.policy import Policy, load_policy, parse_policy
from gateway.policy.model import MAX_WEIGHT
from gateway.validation import (
    MAX_SAFE_INTEGER,
    DLQReason,
    Rejection,
    Validator,
    decode_and_validate,
    rejection,
)

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "deploy" / "policies" / "adult.yaml"

POLICY = parse_policy(
    {
        "input": {"respondent_id": "rid", "missing_tokens": ["?", ""]},
        "attributes": {
            "age": {
                "role": "quasi_identifier",
                "type": "numeric",
                "method": "microaggregation",
                "range": [0, 130],
            },
            "hours": {"role": "quasi_identifier", "type": "numeric", "method": "microaggregation"},
            "sex": {
                "role": "quasi_identifier",
                "type": "categorical",
                "method": "keep",
                "unprotected": True,
                "categories": ["F", "M"],
            },
            "city": {"role": "other", "type": "categorical", "method": "keep"},
            "income": {
                "role": "sensitive",
                "type": "categorical",
                "method": "randomized_response",
                "categories": ["low", "high"],
                "rr": {"mode": "uniform", "retention": 0.5},
            },
            "wave": {"role": "other", "type": "numeric", "method": "keep", "required": False},
        },
    }
)

GOOD: dict[str, Any] = {
    "rid": "r1",
    "age": 40,
    "hours": 38.5,
    "sex": "F",
    "city": "Tarragona",
    "income": "low",
    "wave": 2,
}


def enc(obj: object) -> bytes:
    return orjson.dumps(obj)


def with_(**changes: object) -> bytes:
    rec = dict(GOOD)
    for k, v in changes.items():
        if v is _DROP:
            rec.pop(k)
        else:
            rec[k] = v
    return enc(rec)


_DROP = object()
V = Validator(POLICY)


def check(raw: bytes | None, reason: DLQReason, field: str | None = None, key: Any = b"r1") -> None:
    res = V.decode_and_validate(raw, key)
    assert isinstance(res, Rejection), res
    assert res.reason is reason
    assert res.field == field
    assert res.error_class.isidentifier()


def test_accepts_a_good_record() -> None:
    rid, values = V.decode_and_validate(enc(GOOD), b"r1")  # type: ignore[misc]
    assert rid == "r1"
    assert values == {k: v for k, v in GOOD.items() if k != "rid"}


def test_missing_tokens_and_null() -> None:
    res = V.decode_and_validate(with_(city="?", income=None, sex="", wave=_DROP), b"k")
    assert not isinstance(res, Rejection)
    assert res[1]["city"] is None
    assert res[1]["income"] is None
    assert res[1]["sex"] is None
    assert res[1]["wave"] is None
    res = V.decode_and_validate(with_(wave=None), b"k")
    assert not isinstance(res, Rejection) and res[1]["wave"] is None
    res = V.decode_and_validate(with_(wave="?"), b"k")
    assert not isinstance(res, Rejection) and res[1]["wave"] is None


def test_integer_respondent_id_becomes_a_string() -> None:
    res = V.decode_and_validate(with_(rid=12345), b"k")
    assert not isinstance(res, Rejection) and res[0] == "12345"


def test_float_values_and_range_bounds() -> None:
    for age in (0, 130, 0.0, 129.5):
        res = V.decode_and_validate(with_(age=age), b"k")
        assert not isinstance(res, Rejection), age
        assert res[1]["age"] == age
    res = V.decode_and_validate(with_(hours=1e300), b"k")  # finite, no range: accepted
    assert not isinstance(res, Rejection)


def test_empty_message() -> None:
    check(None, DLQReason.EMPTY_MESSAGE)
    check(b"", DLQReason.EMPTY_MESSAGE)
    check(b"   \n", DLQReason.EMPTY_MESSAGE)


def test_too_large() -> None:
    raw = with_(city="x" * 1_100_000)
    check(raw, DLQReason.TOO_LARGE)
    assert isinstance(
        Validator(POLICY, max_bytes=50).decode_and_validate(enc(GOOD), b"k"), Rejection
    )


def test_missing_key() -> None:
    check(enc(GOOD), DLQReason.MISSING_KEY, key=None)
    check(enc(GOOD), DLQReason.MISSING_KEY, key=b"")
    keyed = parse_policy(
        {**POLICY.model_dump(mode="json"), "input": {"respondent_id": "rid", "key_field": "rid"}}
    )
    assert not isinstance(Validator(keyed).decode_and_validate(enc(GOOD), None), Rejection)


def test_invalid_utf8() -> None:
    check(b'{"rid": "r1", "city": "\xff\xfe"}', DLQReason.INVALID_UTF8)
    check(b'{"rid": "\xed\xa0\x80"}', DLQReason.INVALID_UTF8)  # encoded surrogate


def test_invalid_json() -> None:
    for raw in (b"{", b'{"a": 1,}', b"{} x", b"\xef\xbb\xbf{}", b"nul", b'{"a": nan}'):
        check(raw, DLQReason.INVALID_JSON)


def test_not_an_object() -> None:
    for raw in (b"[1, 2]", b"42", b'"text"', b"null", b"true"):
        check(raw, DLQReason.NOT_AN_OBJECT)


def test_too_deep() -> None:
    deep = {"rid": "r1", "x": 0}
    for _ in range(70):
        deep = {"x": deep}
    check(enc(deep), DLQReason.TOO_DEEP)
    check(b"[" * 70 + b"]" * 70, DLQReason.TOO_DEEP)
    check(b"[" * 5000 + b"]" * 5000, DLQReason.TOO_DEEP)  # beyond orjson's own limit
    # many brackets but shallow: not too deep
    check(with_(city=_DROP, sex="[[[[" * 40), DLQReason.UNKNOWN_CATEGORY, "sex")


def test_missing_field() -> None:
    check(with_(age=_DROP), DLQReason.MISSING_FIELD, "age")
    check(with_(age=None), DLQReason.MISSING_FIELD, "age")  # required numeric
    check(with_(age="?"), DLQReason.MISSING_FIELD, "age")
    check(with_(city=_DROP), DLQReason.MISSING_FIELD, "city")
    check(with_(rid=_DROP), DLQReason.MISSING_FIELD, "rid")
    check(with_(rid=""), DLQReason.MISSING_FIELD, "rid")


def test_extra_field_never_names_it() -> None:
    check(with_(email="someone@example.org"), DLQReason.EXTRA_FIELD, None)
    # same number of keys as the policy: an absent optional field and an extra one
    check(with_(wave=_DROP, email="x"), DLQReason.EXTRA_FIELD, None)
    lenient = parse_policy(
        {
            **POLICY.model_dump(mode="json"),
            "input": {"respondent_id": "rid", "extra_fields": "ignore"},
        }
    )
    res = Validator(lenient).decode_and_validate(with_(email="x"), b"k")
    assert not isinstance(res, Rejection) and "email" not in res[1]


def test_wrong_type() -> None:
    check(with_(age="40"), DLQReason.WRONG_TYPE, "age")
    check(with_(age=True), DLQReason.WRONG_TYPE, "age")
    check(with_(age=[40]), DLQReason.WRONG_TYPE, "age")
    check(with_(sex=1), DLQReason.WRONG_TYPE, "sex")
    check(with_(sex=["F"]), DLQReason.WRONG_TYPE, "sex")
    check(with_(city={"a": 1}), DLQReason.WRONG_TYPE, "city")
    check(with_(rid=1.5), DLQReason.WRONG_TYPE, "rid")
    check(with_(rid=True), DLQReason.WRONG_TYPE, "rid")
    check(with_(rid=["r"]), DLQReason.WRONG_TYPE, "rid")


def test_unknown_category() -> None:
    check(with_(sex="X"), DLQReason.UNKNOWN_CATEGORY, "sex")
    check(with_(income="<missing>"), DLQReason.UNKNOWN_CATEGORY, "income")


def test_out_of_range() -> None:
    check(with_(age=131), DLQReason.OUT_OF_RANGE, "age")
    check(with_(age=-1), DLQReason.OUT_OF_RANGE, "age")
    check(with_(age=130.01), DLQReason.OUT_OF_RANGE, "age")


def test_non_finite() -> None:
    check(b'{"rid": "r1", "age": NaN}', DLQReason.NON_FINITE)
    check(b'{"rid": "r1", "age": Infinity}', DLQReason.NON_FINITE)
    check(b'{"rid": "r1", "age": -Infinity}', DLQReason.NON_FINITE)
    check(b'{"rid": "r1", "age": 1e400}', DLQReason.NON_FINITE)


def test_integer_too_large() -> None:
    check(with_(hours=MAX_SAFE_INTEGER + 1), DLQReason.INTEGER_TOO_LARGE, "hours")
    check(with_(hours=-(2**63)), DLQReason.INTEGER_TOO_LARGE, "hours")
    big = enc(GOOD).replace(b'"hours":38.5', b'"hours":' + str(2**70).encode())
    check(big, DLQReason.INTEGER_TOO_LARGE, "hours")
    check(with_(rid=2**60), DLQReason.INTEGER_TOO_LARGE, "rid")
    big_rid = enc(GOOD).replace(b'"rid":"r1"', b'"rid":' + str(2**70).encode())
    check(big_rid, DLQReason.INTEGER_TOO_LARGE, "rid")
    # a float literal beyond 2^53 is a float, not an integer
    res = V.decode_and_validate(with_(hours=1.5e17), b"k")
    assert not isinstance(res, Rejection)


def test_wrong_partition_is_the_workers_reason() -> None:
    """DLQReason.WRONG_PARTITION is given by the worker, not the validator: a record on a
    partition its key does not pick, with nowhere to re-route it
    (tests/stream_jobs/test_state_routing.py sends one)."""
    rej = rejection(DLQReason.WRONG_PARTITION)
    assert rej.field is None and rej.error_class == "ValueError"


def test_bad_control_is_the_workers_reason() -> None:
    """DLQReason.BAD_CONTROL is given by the worker: an operator's control record it cannot
    read (tests/stream_jobs/test_panel_stream.py sends one)."""
    rej = rejection(DLQReason.BAD_CONTROL)
    assert rej.field is None and rej.error_class == "ValueError"


def test_every_reason_is_exercised() -> None:
    """Guard: a new reason needs a test above."""
    src = Path(__file__).read_text()
    for reason in DLQReason:
        assert f"DLQReason.{reason.name}" in src


def test_rejections_never_carry_values() -> None:
    canary = "CANARY-7f3a"
    raws = [
        with_(sex=canary),
        with_(age=canary),
        with_(**{canary: 1}),
        b'{"' + canary.encode() + b'": NaN}',
        canary.encode(),
    ]
    for raw in raws:
        res = V.decode_and_validate(raw, b"k")
        assert isinstance(res, Rejection)
        assert canary not in repr(res)


def test_module_function_matches_validator() -> None:
    assert decode_and_validate(enc(GOOD), b"k", POLICY) == V.decode_and_validate(enc(GOOD), b"k")


def test_policy_names_are_code_safe() -> None:
    # quotes, a backslash and a parenthesis (a control character is refused by the policy)
    name = "a'\"\\)é"
    odd = parse_policy(
        {
            "attributes": {
                name: {"role": "other", "type": "numeric", "method": "keep"},
                "b": {"role": "other", "type": "categorical", "method": "keep"},
            }
        }
    )
    res = Validator(odd).decode_and_validate(enc({name: 1, "b": "x"}), b"k")
    assert res == (None, {name: 1, "b": "x"})


def _adult_records(policy: Policy, n: int) -> list[bytes]:
    base = {
        "respondent_id": "r",
        "age": 39,
        "workclass": "State-gov",
        "fnlwgt": 77516,
        "education": "Bachelors",
        "education_num": 13,
        "marital_status": "Never-married",
        "occupation": "Adm-clerical",
        "relationship": "Not-in-family",
        "race": "White",
        "sex": "Male",
        "capital_gain": 2174,
        "capital_loss": 0,
        "hours_per_week": 40,
        "native_country": "United-States",
        "income": "<=50K",
        "wave": 1,
        "submitted_at": "2024-05-01T10:00:00+00:00",
    }
    return [enc({**base, "respondent_id": f"r{i}", "age": 20 + i % 50}) for i in range(n)]


def test_adult_policy_is_fast() -> None:
    policy = load_policy(ADULT)
    validator = Validator(policy)
    raws = _adult_records(policy, 2000)
    for raw in raws:
        assert not isinstance(validator.decode_and_validate(raw, b"k"), Rejection)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for raw in raws:
            validator.decode_and_validate(raw, b"k")
        best = min(best, (time.perf_counter() - t) / len(raws))
    # target < 5 µs on an idle core; generous bound against noisy CI machines
    assert best < 25e-6, f"{best * 1e6:.1f} µs per record"


def test_a_key_given_twice_is_refused_whatever_the_layout() -> None:
    good = enc(GOOD)
    dup_age = good.replace(b"{", b'{"age":100,', 1)  # orjson alone would publish the 40
    check(dup_age, DLQReason.DUPLICATE_KEY)
    check(good.replace(b"{", b'{"rid":"r2",', 1), DLQReason.DUPLICATE_KEY)
    check(good.replace(b"{", b'{"age" :\t100 ,', 1), DLQReason.DUPLICATE_KEY)  # spaced out
    check(good.replace(b"{", b'{\n  "sex": "M",\n', 1), DLQReason.DUPLICATE_KEY)
    check(with_(city='say "hi"').replace(b"{", b'{"age":1,', 1), DLQReason.DUPLICATE_KEY)
    check(with_(city="?").replace(b"{", b'{"age":1,', 1), DLQReason.DUPLICATE_KEY)  # slow path
    # the rejection names no field and carries no value
    res = V.decode_and_validate(dup_age, b"r1")
    assert isinstance(res, Rejection) and res.field is None and "100" not in repr(res)


def test_with_a_timestamp_a_repeated_key_is_refused_and_a_plain_record_is_not_reparsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Timestamps are strings on the fast path: their quotes count, so a record whose quotes
    add up skips the exact duplicate check, and any repeated field still adds quotes."""
    exact_checks: list[bytes] = []
    exact = validation.has_duplicate_key

    def counting(raw: bytes, obj: dict[str, object]) -> bool:
        exact_checks.append(raw)
        return exact(raw, obj)

    monkeypatch.setattr(validation, "has_duplicate_key", counting)
    policy = load_policy(ADULT)
    validator = Validator(policy)
    good = _adult_records(policy, 1)[0]
    assert not isinstance(validator.decode_and_validate(good, b"r0"), Rejection)
    assert exact_checks == []
    record = orjson.loads(good)
    for name in ("age", "education", "submitted_at", "respondent_id"):
        first = orjson.dumps({name: record[name]})[1:-1] + b","
        res = validator.decode_and_validate(good.replace(b"{", b"{" + first, 1), b"r0")
        assert isinstance(res, Rejection) and res.reason is DLQReason.DUPLICATE_KEY, name


def test_repeated_text_inside_values_is_not_a_repeated_key() -> None:
    for raw in (
        with_(city='a "b": "c", "age": 1'),  # quotes and colons inside a string
        with_(city="12:30:00"),
        with_(city="?", income=None),
        enc({**GOOD}).replace(b":", b" : "),
    ):
        res = V.decode_and_validate(raw, b"r1")
        assert not isinstance(res, Rejection), raw
    lax = parse_policy(
        {
            **POLICY.model_dump(mode="json"),
            "input": {"respondent_id": "rid", "extra_fields": "ignore"},
        }
    )
    nested = with_(extra={"a": 1, "b": [{"a": 2}]})
    assert not isinstance(Validator(lax).decode_and_validate(nested, b"r1"), Rejection)
    res = Validator(lax).decode_and_validate(with_(extra={"a": 1, "a ": 2}), b"r1")
    assert not isinstance(res, Rejection)
    res = Validator(lax).decode_and_validate(
        enc(GOOD).replace(b"{", b'{"x":{"a":1,"a":2},', 1), b"r1"
    )
    assert isinstance(res, Rejection) and res.reason is DLQReason.DUPLICATE_KEY


def test_the_key_a_record_must_carry_is_its_respondent_id() -> None:
    """The worker refuses (DLQReason.KEY_MISMATCH) a record keyed otherwise; see
    tests/stream_jobs/test_key_mismatch.py for the topics."""
    assert V.expected_key is not None
    rid, values = V.decode_and_validate(enc(GOOD), b"r1")  # type: ignore[misc]
    assert V.expected_key(rid, values) == b"r1"
    res = V.decode_and_validate(with_(rid=12345), b"12345")
    assert not isinstance(res, Rejection) and V.expected_key(*res) == b"12345"
    by_city = parse_policy(
        {**POLICY.model_dump(mode="json"), "input": {"respondent_id": "rid", "key_field": "city"}}
    )
    v = Validator(by_city)
    assert v.expected_key is not None and v.expected_key("r1", {"city": "Reus"}) == b"Reus"
    assert v.expected_key("r1", {"city": None}) is None
    anonymous = parse_policy({**POLICY.model_dump(mode="json"), "input": {}})
    assert Validator(anonymous).expected_key is None  # nothing to compare a key with
    assert DLQReason.KEY_MISMATCH.value == "key_mismatch"


def test_a_timestamp_must_be_iso_8601_text() -> None:
    policy = load_policy(ADULT)
    validator = Validator(policy)
    good = orjson.loads(_adult_records(policy, 1)[0])
    for bad, reason in (("yesterday", DLQReason.WRONG_TYPE), (1714557600, DLQReason.WRONG_TYPE)):
        res = validator.decode_and_validate(enc({**good, "submitted_at": bad}), b"r0")
        assert isinstance(res, Rejection) and res.reason is reason
        assert res.field == "submitted_at" and "yesterday" not in repr(res)
    for ok in ("2024-05-01", "2024-05-01T10:00:00Z", "?"):
        res = validator.decode_and_validate(enc({**good, "submitted_at": ok}), b"r0")
        assert not isinstance(res, Rejection)


@pytest.mark.parametrize("declared", [None, [0, 1e15]])
def test_a_sampling_weight_is_bounded_whatever_its_range(declared: list[float] | None) -> None:
    """1e308, a valid JSON number, overflowed the panel's raking: the engine failed on the
    wave in a loop, and two such weights nulled every weight of it."""
    weight: dict[str, Any] = {"role": "weight", "type": "numeric", "method": "keep"}
    if declared is not None:
        weight["range"] = declared
    spec = POLICY.model_dump(mode="json", exclude_defaults=True)
    policy = parse_policy({**spec, "attributes": {**spec["attributes"], "w": weight}})
    validator = Validator(policy)
    below = (-MAX_WEIGHT,) if declared is None else ()  # else below the declared 0
    for value in (MAX_WEIGHT, 0, 1.5, *below):
        accepted = validator.decode_and_validate(enc({**GOOD, "w": value}), b"r1")
        assert not isinstance(accepted, Rejection), (value, accepted)
    for value in (1e308, -1e308, MAX_WEIGHT * 1.000001, 10**13):
        res = validator.decode_and_validate(enc({**GOOD, "w": value}), b"r1")
        assert isinstance(res, Rejection) and res.reason is DLQReason.OUT_OF_RANGE, (value, res)
        assert res.field == "w"
