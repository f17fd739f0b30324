"""Published values that link releases by themselves (issue 29, item 4): the value-linkage
measure, and noised amounts rounded to a reporting step without breaking stickiness."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping
from itertools import pairwise

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.engine.shards import ShardedEngine, route
from gateway.errors import PolicyError
from gateway.keyed.keyed import Keyring
from gateway.measures.attack import unique_combinations, value_keys, value_linkage
from gateway.mechanisms.masking import round_to
from gateway.policy import Policy, policy_from_yaml

KEY = Keyring(b"value-linkage-test-secret-012345")


class DictStore:
    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        return {k: self.data[k] for k in keys if k in self.data}

    def put_many(self, entries: Mapping[bytes, bytes]) -> None:
        self.data.update(entries)

    def count(self) -> int:
        return len(self.data)

    def close(self) -> None:
        pass


# -- the measure ---------------------------------------------------------------------------


def test_value_linkage_on_hand_made_histories() -> None:
    # a's value is unique in both releases (linked, right); b and c share 2 in release 0
    # (not unique); d's 4 is unique in release 0 but published twice in release 1; e is
    # absent from release 1 and its unique 5 meets f's 5 there (linked, wrong)
    r0 = {"a": (1,), "b": (2,), "c": (2,), "d": (4,), "e": (5,)}
    r1 = {"a": (1,), "b": (2,), "c": (3,), "d": (4,), "g": (4,), "f": (5,)}
    pair = value_linkage([r0, r1]).pairs[0]
    assert (pair.records, pair.later_records, pair.unique) == (5, 6, 3)
    assert (pair.linked, pair.correct) == (2, 1)
    assert pair.share == 2 / 5 and pair.share_of_later == 2 / 6 and pair.precision == 0.5
    # None is a value like any other; three releases give two pairs and their totals
    r2 = {"a": (None,), "c": (3,)}
    res = value_linkage([r0, r1, r2])
    assert [p.linked for p in res.pairs] == [2, 1] and [p.correct for p in res.pairs] == [1, 1]
    assert (res.records, res.linked, res.correct) == (11, 3, 2)
    assert res.share == 3 / 11 and res.precision == 2 / 3
    # nothing to link: no pair, or no unique combination
    assert value_linkage([r0]).pairs == () and value_linkage([]).share == 0.0
    assert math.isnan(value_linkage([{"a": 1, "b": 1}, {"a": 1, "b": 1}]).precision)


def test_value_keys_take_the_named_attributes_in_order() -> None:
    release = {"a": {"x": 1.0, "y": "p", "z": 9}, "b": {"x": None, "y": "q"}}
    assert value_keys(release, ["y", "x"]) == {"a": ("p", 1.0), "b": ("q", None)}
    assert value_keys(release, ["z"]) == {"a": (9,), "b": (None,)}


def _reference(releases: list[dict[str, Hashable]]) -> list[tuple[int, int, int]]:
    """(unique, linked, correct) per pair, the slow way: count every match by hand."""
    out = []
    for here, there in pairwise(releases):
        unique = linked = correct = 0
        for rid, key in here.items():
            if sum(1 for k in here.values() if k == key) != 1:
                continue
            unique += 1
            matches = [r for r, k in there.items() if k == key]
            if len(matches) == 1:
                linked += 1
                correct += matches[0] == rid
        out.append((unique, linked, correct))
    return out


histories = st.lists(
    st.dictionaries(
        st.sampled_from([f"r{i}" for i in range(12)]),
        st.tuples(st.integers(0, 5), st.one_of(st.none(), st.sampled_from("ab"))),
        max_size=12,
    ),
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(releases=histories, perm_seed=st.integers(0, 2**16))
def test_value_linkage_agrees_with_counting_by_hand(
    releases: list[dict[str, Hashable]], perm_seed: int
) -> None:
    res = value_linkage(releases)
    assert [(p.unique, p.linked, p.correct) for p in res.pairs] == _reference(releases)
    for p in res.pairs:
        assert 0 <= p.correct <= p.linked <= p.unique <= p.records
        assert p.linked <= p.later_records
    # a combination once in each release: the same links read backwards
    backwards = value_linkage(releases[::-1])
    assert [p.linked for p in backwards.pairs] == [p.linked for p in res.pairs][::-1]
    # the adversary does not see who is who: renaming respondents changes nothing
    names = [f"r{i}" for i in range(12)]
    renamed = dict(zip(names, np.random.default_rng(perm_seed).permutation(names), strict=True))
    again = value_linkage([{renamed[r]: k for r, k in rel.items()} for rel in releases])
    assert again == res
    # a coarser publication never makes more records unique in a release
    coarse = value_linkage([{r: (k[0] // 2, k[1]) for r, k in rel.items()} for rel in releases])
    assert all(c.unique <= p.unique for c, p in zip(coarse.pairs, res.pairs, strict=True))


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 4), st.sampled_from("ab")), max_size=30))
def test_unique_combinations_counts_the_records_alone(rows: list[tuple[int, str]]) -> None:
    columns = [[r[0] for r in rows], [r[1] for r in rows]]
    assert unique_combinations(columns) == sum(1 for r in rows if rows.count(r) == 1)


# -- rounding ------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    x=st.floats(-1e9, 1e9, allow_nan=False),
    step=st.sampled_from([0.01, 0.1, 0.25, 1.0, 3.0, 100.0, 200.0, 1000.0, 1 / 3]),
)
def test_round_to_is_the_nearest_multiple_and_idempotent(x: float, step: float) -> None:
    r = float(round_to(np.array([x]), step)[0])
    assert abs(r - x) <= step / 2 * (1 + 1e-9) + 1e-6
    multiple = r / step
    assert abs(multiple - round(multiple)) <= 1e-12 * max(1.0, abs(multiple))
    assert float(round_to(np.array([r]), step)[0]) == r  # a stored value republishes as is
    assert math.copysign(1.0, r) == 1.0 or r < 0  # never -0.0
    assert repr(float(round_to(np.array([0.30000000000000004]), 0.1)[0])) == "0.3"


ROUNDED = """
input: {respondent_id: rid}
attributes:
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [a, b, c, d]
    rr: {mode: uniform, retention: 0.75}
  pay: {role: sensitive, type: numeric, method: noise, noise: {sd: 100}%s}
"""


def _policy(step: float | None) -> Policy:
    return policy_from_yaml(ROUNDED % ("" if step is None else f", round_to: {step}"))


def _window(n: int, wave: int, rng: np.random.Generator) -> list[ValidRecord]:
    """n respondents; pay mostly 0, as capital gains are, else spread over 0..5000."""
    pay = np.where(rng.random(n) < 0.8, 0.0, rng.uniform(0, 5000, n).round())
    return [
        ValidRecord(
            f"r{i}",
            {"occ": "abcd"[i % 4], "pay": float(pay[i]), "wave": wave},
            SourceRef("in", 0, wave * 100_000 + i),
            0.0,
        )
        for i in range(n)
    ]


def _published(engine: Engine, records: list[ValidRecord]) -> dict[str, dict[str, object]]:
    res = engine.protect_window(records, now=0.0, flush_all=True)
    return {
        str(r.respondent_id): orjson.loads(p.value)
        for r, p in zip(records, res.published, strict=True)
    }


def test_rounding_follows_the_noise_keeps_stickiness_and_replays_byte_identically() -> None:
    records = _window(400, 1, np.random.default_rng(3))
    plain = _published(Engine(_policy(None), keyring=KEY, store=DictStore()), records)
    store = DictStore()
    engine = Engine(_policy(200.0), keyring=KEY, store=store)
    first = _published(engine, records)
    # the same keyed draw, then rounded: rounding is the last step, deterministic
    for rid, row in first.items():
        assert row["pay"] == round_to(np.array([plain[rid]["pay"]]), 200.0)[0]
        assert row["pay"] % 200 == 0 and row["occ"] == plain[rid]["occ"]
    # a later release with unchanged values republishes the same bytes; so does a replay
    # that lost the state (keyed draws)
    later = [r._replace(source=SourceRef("in", 0, 500_000 + i)) for i, r in enumerate(records)]
    again = engine.protect_window(later, now=0.0, flush_all=True)
    assert again.report.sticky_hits == 2 * len(records)
    fresh = Engine(_policy(200.0), keyring=KEY, store=DictStore())
    replay = fresh.protect_window(later, now=0.0, flush_all=True)
    assert [p.value for p in again.published] == [p.value for p in replay.published]
    for r, p in zip(later, again.published, strict=True):
        row, want = orjson.loads(p.value), first[str(r.respondent_id)]
        assert (row["occ"], row["pay"]) == (want["occ"], want["pay"])


def test_a_value_stored_unrounded_republishes_rounded_under_a_rounding_policy() -> None:
    records = _window(50, 1, np.random.default_rng(4))
    store = DictStore()
    before = _published(Engine(_policy(None), keyring=KEY, store=store), records)
    after = _published(Engine(_policy(200.0), keyring=KEY, store=store), records)
    for rid, row in before.items():
        assert after[rid]["pay"] == round_to(np.array([row["pay"]]), 200.0)[0]


def test_rounding_cuts_the_records_linkable_by_their_sensitive_values() -> None:
    rng = np.random.default_rng(5)
    w1 = _window(2000, 1, rng)
    w2 = [r._replace(source=SourceRef("in", 0, 900_000 + i)) for i, r in enumerate(w1)]
    shares = {}
    for step in (None, 200.0):
        engine = Engine(_policy(step), keyring=KEY, store=DictStore())
        releases = [value_keys(_published(engine, w), ["occ", "pay"]) for w in (w1, w2)]
        shares[step] = value_linkage(releases).pairs[0]
    # unrounded, the sticky noised amount is unique: every record links, and rightly
    assert shares[None].share == 1.0 and shares[None].precision == 1.0
    # rounded to 2 sd, the 80 % zeros pool into a few (occ, pay) cells and the spread amounts
    # into 25 steps (measured 0.35 %; the bound leaves room for another secret's draws)
    assert shares[200.0].share < 0.05


@pytest.mark.parametrize(
    ("pay", "message"),
    [
        ("noise: {sd: 100}, round_to: 201", r"round_to \(201\) must be at most 2 × noise.sd"),
        ("noise: {ratio: 0.1}, round_to: 10", r"noise.sd.*not given"),
        ("noise: {sd: 100}, round_to: 0", "round_to must be a number > 0"),
        ("noise: {sd: 100}, round_to: -5", "round_to must be a number > 0"),
        ("noise: {sd: 100}, round_to: .inf", "round_to: must be a finite number"),
        ("noise: {sd: 100}, round_to: .nan", "round_to: must be a finite number"),
        ("noise: {sd: 100}, round_to: '100'", "written without quotes"),
    ],
)
def test_bad_round_to_is_one_clear_error(pay: str, message: str) -> None:
    text = ROUNDED.replace("noise: {sd: 100}%s", pay)
    with pytest.raises(PolicyError, match=message):
        policy_from_yaml(text)


def test_round_to_is_refused_on_other_methods_and_reaches_the_metadata() -> None:
    on_rr = (
        ROUNDED.replace(
            "rr: {mode: uniform, retention: 0.75}",
            "round_to: 1\n    rr: {mode: uniform, retention: 0.75}",
        )
        % ""
    )
    with pytest.raises(PolicyError, match="round_to only applies"):
        policy_from_yaml(on_rr)
    policy = _policy(200.0)
    assert policy.attributes["pay"].round_to == 200.0
    meta = Engine(policy, keyring=KEY).metadata()
    assert meta["round_to"] == {"pay": 200.0}
    assert Engine(_policy(None), keyring=KEY).metadata()["round_to"] == {}


def test_the_analyst_adds_a_uniform_step_to_the_noise_variance() -> None:
    """Rounded to h ≤ 2 sd, the published error is the noise plus an error uniform on ±h/2,
    independent of the value: mean 0 and variance sd² + h²/12, within 4 standard errors."""
    n, sd, h = 20_000, 100.0, 200.0
    rng = np.random.default_rng(7)
    values = rng.uniform(0, 50_000, n).round(2)  # spread over many steps
    records = [
        ValidRecord(f"s{i}", {"occ": "a", "pay": float(v)}, SourceRef("in", 0, i), 0.0)
        for i, v in enumerate(values)
    ]
    engine = Engine(_policy(h), keyring=KEY, store=DictStore())
    published = np.array(
        [orjson.loads(p.value)["pay"] for p in engine.protect_window(records, now=0.0).published]
    )
    err = published - values
    var = sd**2 + h**2 / 12
    assert abs(err.mean()) < 4 * math.sqrt(var / n)
    # the sample variance's SE under normality, 2σ⁴/(n−1): conservative here, since the
    # uniform part has lighter tails than a normal
    assert abs(err.var(ddof=1) - var) < 4 * var * math.sqrt(2 / (n - 1))
    # without the step the variance would be sd² alone: the test tells the two apart
    assert abs(err.var(ddof=1) - sd**2) > 4 * var * math.sqrt(2 / (n - 1))


# -- the live proxy ------------------------------------------------------------------------


def test_the_window_reports_its_unique_sensitive_combinations_even_over_shards() -> None:
    records = _window(300, 1, np.random.default_rng(6))
    engine = Engine(_policy(200.0), keyring=KEY, store=DictStore())
    res = engine.protect_window(records, now=0.0, flush_all=True)
    rows = [orjson.loads(p.value) for p in res.published]
    combos = Counter((r["occ"], r["pay"]) for r in rows)
    assert res.report.measures["sensitive_records"] == 300
    assert res.report.measures["sensitive_uniques"] == sum(1 for c in combos.values() if c == 1)
    # over 3 shards: each shard's uniques, summed — never below the window's own count
    shards = ShardedEngine(
        [Engine(_policy(200.0), keyring=KEY, store=DictStore(), measure_risk=False) for _ in "abc"]
    )
    merged = shards.protect_window(records, now=0.0, flush_all=True).report.measures
    shard_rows = [orjson.loads(p.value) for p in shards.protect_window(records, now=0.0).published]
    assert shard_rows == rows  # the same keyed draws
    keys = [(r["occ"], r["pay"]) for r in rows]
    per_shard = [Counter(keys[i] for i in part) for part in route(records, 3)]
    want = sum(1 for counts in per_shard for c in counts.values() if c == 1)
    assert merged["sensitive_uniques"] == want > res.report.measures["sensitive_uniques"]
