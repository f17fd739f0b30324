"""State values as MessagePack, and state written as JSON by earlier versions.

A state file written before MessagePack (every value a JSON document, as ``orjson.dumps`` with
sorted keys wrote respondents and without options wrote group entries) must keep working:
the next window republishes exactly what the same window republishes from a MessagePack file
of the same contents, sticky values unchanged, and rewrites only the values it changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.keyed.draw_derivation import DrawDerivation
from gateway.keyed.keyed import Keyring
from gateway.policy import Policy, policy_from_yaml
from gateway.state_store.live_counts import audit_live_counts
from gateway.state_store.state_codec import decode_state, encode_state
from state.sqlite_store import SQLiteStore

POLICY = """
input: {respondent_id: rid}
window: {max_records: 1000, max_seconds: 1, max_hold_seconds: 3600, on_hold_timeout: hold}
microaggregation: {k: 3}
attributes:
  age:    {role: quasi_identifier, type: numeric, method: microaggregation}
  sex:    {role: quasi_identifier, type: categorical, method: microaggregation, categories: [F, M]}
  job:
    role: quasi_identifier
    type: categorical
    method: microaggregation
    missing: category
    categories: [a, b, c, d]
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [x, y, z]
    rr: {mode: uniform, retention: 0.6}
  pay:
    role: sensitive
    type: numeric
    method: noise
    noise: {ratio: 0.1, sd: 50}
  wave:   {role: other, type: numeric, method: keep}
"""
KEY = Keyring(b"s" * 32)


def _policy() -> Policy:
    # state written before MessagePack is the deferred mode's (regroup and cohort came later)
    return policy_from_yaml(POLICY + "republication: {mode: deferred}\n")


def _truth(rng: np.random.Generator, n: int, start: int = 0) -> dict[str, dict[str, Any]]:
    return {
        f"r{i}": {
            "age": int(rng.integers(18, 80)),
            "sex": str(rng.choice(["F", "M"])),
            "job": None if rng.random() < 0.1 else str(rng.choice(list("abcd"))),
            "occ": str(rng.choice(["x", "y", "z"])),
            "pay": round(float(rng.uniform(1000, 90000)), 2),
        }
        for i in range(start, start + n)
    }


def _window(truth: dict[str, dict[str, Any]], wave: int, offset: int) -> list[ValidRecord]:
    return [
        ValidRecord(rid, {**values, "wave": wave}, SourceRef("in", 0, offset + i), 0.0)
        for i, (rid, values) in enumerate(truth.items())
    ]


def _old_format(key: bytes, raw: bytes) -> bytes:
    """The value as versions before MessagePack wrote it."""
    doc = decode_state(raw)
    if key.startswith(b"group:"):  # _live_entry: orjson.dumps, live first
        return orjson.dumps(
            {"live": doc["live"], **({"size": doc["size"]} if "size" in doc else {})}
        )
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def test_json_state_of_earlier_versions_republishes_identically(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    truth = _truth(rng, 60)
    with SQLiteStore(tmp_path / "new.db") as store:
        # states of those versions drew with HMAC (they record no derivation: the copy below)
        first = Engine(
            _policy(), keyring=KEY, store=store, draws=DrawDerivation.HMAC_SHA256
        ).protect_window(_window(truth, 1, 0), now=0.0, flush_all=True)
        written = dict(store.items())
    assert written and all(raw[:1] != b"{" for raw in written.values())  # MessagePack
    with SQLiteStore(tmp_path / "old.db") as old:
        old.put_many({k: _old_format(k, v) for k, v in written.items()})
    with SQLiteStore(tmp_path / "old.db") as old:
        assert all(raw[:1] == b"{" for _, raw in old.items())
        assert audit_live_counts(old.items()).consistent  # JSON registry entries read

    # wave 2: most respondents unchanged, some changed, some new
    second = {rid: dict(v) for rid, v in truth.items()}
    for rid in list(second)[:12]:
        second[rid]["age"] = int(rng.integers(18, 80))
        second[rid]["occ"] = str(rng.choice(["x", "y", "z"]))
    second.update(_truth(rng, 9, start=60))
    results = {}
    for name in ("new.db", "old.db"):
        with SQLiteStore(tmp_path / name) as store:
            res = Engine(_policy(), keyring=KEY, store=store).protect_window(
                _window(second, 2, 1000), now=0.0, flush_all=True
            )
            results[name] = (res, dict(store.items()))
    new, new_state = results["new.db"]
    old, old_state = results["old.db"]
    assert [p.value for p in old.published] == [p.value for p in new.published]
    assert [p.record_id for p in old.published] == [p.record_id for p in new.published]
    assert old.report.sticky_hits == new.report.sticky_hits > 0
    # the same documents, whichever format each value is in now
    assert old_state.keys() == new_state.keys()
    assert {k: decode_state(v) for k, v in old_state.items()} == {
        k: decode_state(v) for k, v in new_state.items()
    }
    # what changed was rewritten as MessagePack; what did not stays JSON until it does
    rewritten = {k for k, v in old_state.items() if v[:1] != b"{"}
    assert rewritten and rewritten < old_state.keys()
    assert all(old_state[k] == new_state[k] for k in rewritten)

    # sticky: an unchanged respondent republishes its wave-1 values from the JSON state
    def published(res: Any) -> dict[str, dict[str, Any]]:
        out = {}
        for p in res.published:
            row = orjson.loads(p.value)
            out[row["record_id"]] = {a: row[a] for a in ("age", "sex", "job", "occ", "pay")}
        return out

    before, after = published(first), published(old)
    unchanged = list(truth)[12:]
    rid_of = {rid: i for i, rid in enumerate(second)}
    same = [
        (before.get(f"in/0/{i}"), after.get(f"in/0/{1000 + rid_of[rid]}"))
        for i, rid in enumerate(truth)
        if rid in unchanged
    ]
    compared = [(b, a) for b, a in same if b is not None and a is not None]
    assert len(compared) >= 40
    assert all(b == a for b, a in compared)


_leaf = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8)
_leaf |= st.floats(allow_nan=False, allow_infinity=False)
_doc = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        _leaf,
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
        max_leaves=12,
    ),
    max_size=6,
)


@given(_doc)
def test_both_formats_decode_to_the_same_document(doc: dict[str, Any]) -> None:
    packed = encode_state(doc)
    assert packed[:1] != b"{"  # a MessagePack map never starts like a JSON object
    for raw in (packed, orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)):
        back = decode_state(raw)
        assert back == doc
        # floats stay floats (a stored centroid 40.0 republishes as 40.0, not 40)
        assert orjson.dumps(back, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
            doc, option=orjson.OPT_SORT_KEYS
        )
    # the same document gives the same bytes whatever order its keys were set in
    assert encode_state(dict(reversed(list(doc.items())))) == packed
