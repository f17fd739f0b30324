"""Each protection method as an object built once from the policy (gateway.mechanisms): its
column applied, its sticky draws looked up and stored, its privacy cost and what the metadata
publishes of it; and the registry as the one place that maps a method to its object."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.errors import PolicyError
from gateway.grouping.live_view import StateView
from gateway.keyed.keyed import KeyedSource, Keyring
from gateway.keyed.randomness import SeededSource, UniformSource
from gateway.mechanisms import registry
from gateway.mechanisms.noise_protection import Noise
from gateway.mechanisms.protection import Draws, Protection, Published
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.mechanisms.recodings import Coarsen, Generalize, Keep, RoundTo, TopBottomCode
from gateway.mechanisms.rr_protection import RandomizedResponse
from gateway.mechanisms.sticky import StoredLookup
from gateway.policy import Method, NoiseSpec, Policy, policy_from_yaml

POLICY = """
input: {respondent_id: rid}
microaggregation: {k: 3}
attributes:
  age: {role: quasi_identifier, type: numeric, method: microaggregation}
  hours:
    role: quasi_identifier
    type: numeric
    method: top_bottom_code
    unprotected: true
    coding: {bottom: 20, top: 60}
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [a, b, c, d]
    rr: {mode: uniform, retention: 0.5}
  pay: {role: sensitive, type: numeric, method: noise, noise: {sd: 500}, round_to: 100}
  region:
    role: sensitive
    type: categorical
    method: generalize
    categories: [n1, n2, s1]
    hierarchy: {levels: [{n1: north, n2: north, s1: south}]}
  seen: {role: other, type: timestamp, method: coarsen, coarsen: {unit: week}}
  note: {role: other, type: categorical, method: keep}
  wt: {role: weight, type: numeric, method: keep, round_to: 10}
  email: {role: identifier, type: categorical, method: drop}
"""
RING = Keyring(b"p" * 32)


def _policy() -> Policy:
    return policy_from_yaml(POLICY)


def _built() -> dict[str, Protection]:
    return registry.protections(_policy())


def _draws(
    n: int,
    *,
    rand: UniformSource | None = None,
    states: dict[bytes, dict[str, Any]] | None = None,
    digests: dict[str, list[tuple[bytes, str]]] | None = None,
    keys: Sequence[bytes | None] | None = None,
) -> Draws:
    """Draws for a column of ``n`` values; sticky when value digests are given."""
    keys = list(keys) if keys is not None else [f"k{i}".encode() for i in range(n)]
    view = StateView(states={} if states is None else states, sticky=digests is not None)
    return Draws(
        rand or SeededSource(0),
        keys,
        StoredLookup(view.states, keys),
        view,
        True,
        range(n),
        digests or {},
    )


def _digests(values: Sequence[object]) -> list[tuple[bytes, str]]:
    """Stand-ins for keyed value digests: distinct per value, as the engine's are."""
    return [(str(v).encode(), f"h{v}") for v in values]


def test_the_registry_builds_every_published_attribute_outside_the_k_claim_once() -> None:
    built = _built()
    assert list(built) == ["hours", "occ", "pay", "region", "seen", "note", "wt"]
    kinds = {n: type(p) for n, p in built.items()}
    assert kinds == {
        "hours": TopBottomCode,
        "occ": RandomizedResponse,
        "pay": Noise,
        "region": Generalize,
        "seen": Coarsen,
        "note": Keep,
        "wt": RoundTo,  # a weight kept with round_to
    }
    # the engine's randomized-response mechanisms are read from its protections
    engine = Engine(_policy(), randomness=SeededSource(1))
    assert list(engine.mechanisms) == ["occ"] == list(registry.randomized(built))
    assert engine.mechanisms["occ"].to_dict() == registry.randomized(built)["occ"].to_dict()


def test_every_method_published_outside_the_k_claim_has_a_mechanism() -> None:
    # drop publishes nothing; microaggregation is only for the k claim's quasi-identifiers,
    # published as their groups' centroids by the grouping
    outside = set(Method) - {Method.DROP, Method.MICROAGGREGATION}
    assert set(registry.BUILDERS) == outside


def test_randomized_response_carries_its_matrix_gamma_and_epsilon() -> None:
    rr = _built()["occ"]
    assert isinstance(rr, RandomizedResponse) and rr.kind == "rr"
    cost = rr.cost
    assert isinstance(cost, RRMechanism) and cost is rr.mechanism
    # retention 0.5 over 4 categories: 0.5 on the diagonal, the rest spread: 1/6 off it
    assert cost.matrix[0, 0] == pytest.approx(0.5) and cost.matrix[1, 0] == pytest.approx(1 / 6)
    assert cost.gamma == pytest.approx(3.0) and cost.epsilon == pytest.approx(math.log(3.0))
    meta = rr.release()["randomized_response"]
    assert isinstance(meta, dict) and meta["matrix_version"] == rr.version
    assert meta["epsilon"] == pytest.approx(math.log(3.0))


def test_randomized_response_draws_from_its_matrix() -> None:
    rr = _built()["occ"]
    n = 4000
    values = ["a"] * n
    got = rr.apply(values, _draws(n))
    assert set(got.values) <= set("abcd") and got.hits == 0
    kept = sum(v == "a" for v in got.values)
    p = 0.5  # P[a | a]
    assert abs(kept / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    assert got.retention == (kept / n, n)
    assert got.under == [rr.version] * n  # every value stamped with the matrix drawn under
    assert rr.retention(values, got.values) == got.retention


def test_randomized_response_republishes_a_stored_draw_and_stores_a_fresh_one() -> None:
    rr = _built()["occ"]
    states: dict[bytes, dict[str, Any]] = {b"k0": {"rr": {"occ": {"ha": ["d", "old-matrix"]}}}}
    values = ["a", "b"]
    draws = _draws(2, rand=KeyedSource(RING), states=states, digests={"occ": _digests(values)})
    got = rr.apply(values, draws)
    assert got.hits == 1
    assert got.values[0] == "d" and got.under == ["old-matrix", rr.version]
    assert states[b"k1"]["rr"]["occ"] == {"hb": [got.values[1], rr.version]}
    assert draws.view.touched == {b"k1"}
    # keyed: the same respondent and value draw the same again, in any engine
    again = rr.apply(
        ["b"], _draws(1, rand=KeyedSource(RING), keys=[b"k1"], digests={"occ": [(b"b", "hb")]})
    )
    assert again.values == [got.values[1]]


def test_noise_codes_then_adds_noise_of_its_scale_then_rounds() -> None:
    pay = _built()["pay"]
    assert isinstance(pay, Noise) and pay.kind == "noise"
    assert pay.cost == pay.spec and pay.cost.sd == 500.0
    assert pay.release() == {"noise": {"sd": 500.0}, "round_to": 100.0}
    n = 3000
    values: list[Any] = [10_000.0] * n
    got = pay.apply(values, _draws(n))
    published = np.array(got.values, dtype=np.float64)
    assert np.all(published % 100 == 0)  # rounded to its step after the noise
    z = (published - 10_000.0) / 500.0  # sd 500 (one repeated value: S = 0, the floor rules)
    # rounding to 100 adds 100²/12 to the variance: sd of z is √(1 + 1/300)
    assert abs(z.mean()) < 4 / math.sqrt(n)
    assert abs(z.std(ddof=1) - math.sqrt(1 + 1 / 300)) < 4 / math.sqrt(2 * n)


def test_noise_publishes_nothing_without_a_scale_and_keeps_missing_values_missing() -> None:
    bare = Noise("x", NoiseSpec(ratio=0.1))
    assert bare.apply([5.0], _draws(1)).values == [None]  # one value: S = 0, no floor
    got = _built()["pay"].apply([None, 3.0, 4.0], _draws(3))
    assert got.values[0] is None and None not in got.values[1:]


def test_noise_republishes_a_stored_draw_rounded_to_the_step() -> None:
    pay = _built()["pay"]
    states: dict[bytes, dict[str, Any]] = {b"k0": {"noise": {"pay": {"h1000.0": 1234.0}}}}
    values: list[Any] = [1000.0, 2000.0]
    draws = _draws(2, rand=KeyedSource(RING), states=states, digests={"pay": _digests(values)})
    got = pay.apply(values, draws)
    assert got.hits == 1 and got.values[0] == 1200.0  # stored before the policy rounded
    assert states[b"k1"]["noise"]["pay"] == {"h2000.0": got.values[1]}


def test_the_deterministic_recodings() -> None:
    built = _built()
    none = _draws(0)
    assert built["hours"].apply([5, 50, 100, None], none) == Published([20.0, 50.0, 60.0, None])
    assert built["hours"].release() == {"top_bottom_coding": {"bottom": 20.0, "top": 60.0}}
    assert built["region"].apply(["n2", None, "s1"], none).values == ["north", None, "south"]
    with pytest.raises(KeyError):
        built["region"].apply(["elsewhere"], none)
    seen = built["seen"].apply(["2024-03-14T10:00:00", "not a time", None], none)
    assert seen.values == ["2024-03-11", None, None]  # the Monday of its week
    assert built["wt"].apply([123.4, None, -0.04], none).values == [120.0, None, 0.0]
    assert built["wt"].release() == {"round_to": 10.0}
    assert built["note"].apply(["p", None], none).values == ["p", None]
    for name in ("hours", "region", "seen", "wt", "note"):
        assert built[name].cost is None and built[name].kind is None
        assert built[name].retention(["p"], ["p"]) is None


@dataclass(frozen=True)
class Reversed(Protection):
    """A toy mechanism for the test below: text published backwards, described as such."""

    name: str

    def apply(self, values: list[Any], draws: Draws) -> Published:
        return Published([None if v is None else str(v)[::-1] for v in values])

    def release(self) -> dict[str, object]:
        return {"reversed": {"how": "backwards"}}


def test_a_mechanism_registered_outside_the_engine_is_applied_by_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(registry.BUILDERS, Method.KEEP, lambda name, attr, _: Reversed(name))
    engine = Engine(_policy(), keyring=RING)
    records = [
        ValidRecord(
            f"r{i}",
            {
                "age": 30 + i,
                "hours": 40,
                "occ": "a",
                "pay": 1000.0,
                "region": "n1",
                "seen": "2024-03-14T10:00:00",
                "note": f"note{i}",
                "wt": 100.0,
                "email": "x@example.org",
            },
            SourceRef("in", 0, i),
            0.0,
        )
        for i in range(4)
    ]
    got = engine.protect_window(records, now=0.0, flush_all=True)
    notes = sorted(orjson.loads(p.value)["note"] for p in got.published)
    assert notes == ["0eton", "1eton", "2eton", "3eton"]
    assert engine.metadata()["reversed"] == {
        "note": {"how": "backwards"},
        "wt": {"how": "backwards"},
    }


def test_a_method_without_a_mechanism_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(registry.BUILDERS, Method.COARSEN)
    with pytest.raises(PolicyError, match="'seen': method coarsen has no mechanism"):
        Engine(_policy(), randomness=SeededSource(1))
