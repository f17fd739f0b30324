"""Republication safety: the averaging and intersection adversaries against the real engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import orjson
import pytest

from gateway.attack import averaging_attack, intersection_attack
from gateway.engine import Engine, SourceRef, ValidRecord
from gateway.keyed import Keyring
from gateway.policy import policy_from_yaml

KEY = Keyring(b"attack-test-secret-0123456789")

RR_POLICY = """
input: {respondent_id: rid}
attributes:
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [a, b, c, d]
    rr: {mode: uniform, retention: 0.75}
"""

QI_POLICY = """
input: {respondent_id: rid}
window: {max_hold_seconds: 1000}
microaggregation: {k: 5}
attributes:
  age:   {role: quasi_identifier, type: numeric, method: microaggregation}
  hours: {role: quasi_identifier, type: numeric, method: microaggregation}
"""


class DictStore:
    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        return {k: self.data[k] for k in keys if k in self.data}

    def put_many(self, entries: Mapping[bytes, bytes]) -> None:
        self.data.update(entries)

    def count(self) -> int:
        return len(self.data)

    def close(self) -> None:
        pass


def test_attack_functions_on_hand_made_histories() -> None:
    truth = {"x": "a", "y": "b"}
    releases = [{"x": "a", "y": "c"}, {"x": "b", "y": "b"}, {"x": "a", "y": "b"}]
    pts = averaging_attack(releases, truth, [1, 3])
    assert [p.accuracy for p in pts] == [0.5, 1.0]
    qi = [{"x": (1,), "y": (1,), "z": (1,)}, {"x": (1,), "y": (1,), "z": (2,)}]
    res = intersection_attack(qi, k=2)
    assert res.smallest == [1, 2, 2] and res.below_k == 1


def _rr_history(
    waves: int, n: int, *, sticky: bool, seed: int
) -> tuple[list[dict[str, str]], dict[str, str]]:
    text = RR_POLICY if sticky else RR_POLICY + "consistency: {mode: none}\n"
    engine = Engine(
        policy_from_yaml(text), keyring=KEY, store=DictStore(), consistency_override=not sticky
    )
    rng = np.random.default_rng(seed)
    truth = {f"r{i}": "abcd"[int(c)] for i, c in enumerate(rng.integers(0, 4, n))}
    ids = list(truth)
    releases = []
    for wave in range(waves):
        recs = [
            ValidRecord(rid, {"occ": truth[rid]}, SourceRef("in", 0, wave * n + i), 0.0)
            for i, rid in enumerate(ids)
        ]
        res = engine.protect_window(recs, now=0.0)
        releases.append(
            {rid: orjson.loads(p.value)["occ"] for rid, p in zip(ids, res.published, strict=True)}
        )
    return releases, truth


@pytest.mark.slow
def test_averaging_gains_nothing_with_sticky_responses_and_everything_without() -> None:
    n = 10_000
    releases, truth = _rr_history(100, n, sticky=True, seed=1)
    points = averaging_attack(releases, truth, [1, 5, 20, 100])
    single = points[0]
    expected = 0.75  # retention = P[i][i], the probability of publishing the true value
    se = (expected * (1 - expected) / n) ** 0.5
    assert abs(single.accuracy - expected) < 4.5 * se
    for p in points[1:]:
        assert single.ci_low <= p.accuracy <= single.ci_high, p
    # negative control: fresh randomness per release; the plurality converges to the truth
    fresh, truth2 = _rr_history(20, n, sticky=False, seed=2)
    control = {p.releases: p.accuracy for p in averaging_attack(fresh, truth2, [1, 5, 20])}
    assert abs(control[1] - expected) < 4.5 * se
    assert control[5] > single.ci_high + 0.08  # ≈ 0.94 in theory
    assert control[20] > 0.99


@pytest.mark.slow
def test_intersection_attack_finds_no_candidate_set_below_k() -> None:
    n, waves, k = 10_000, 20, 5
    rng = np.random.default_rng(7)
    engine = Engine(policy_from_yaml(QI_POLICY), keyring=KEY, store=DictStore())
    age = rng.integers(18, 90, n)
    hours = rng.integers(1, 80, n)
    releases = []
    held: list[ValidRecord] = []
    for wave in range(waves):
        if wave:
            change = rng.random(n) < 0.05
            age[change] = rng.integers(18, 90, int(change.sum()))
        recs = [
            ValidRecord(
                f"r{i}",
                {"age": int(age[i]), "hours": int(hours[i])},
                SourceRef("in", 0, wave * n + i),
                float(wave),
            )
            for i in range(n)
        ]
        res = engine.protect_window([*held, *recs], now=float(wave))
        held = list(res.held)
        respondent = {r.source.record_id: r.respondent_id for r in [*held, *recs] if r.source}
        release: dict[str, tuple[float, float] | None] = {}
        for p in res.published:
            row = orjson.loads(p.value)
            release[str(respondent[p.record_id])] = (
                None if row["age"] is None else (row["age"], row["hours"])
            )
        releases.append(release)
        assert res.report.min_group_size is None or res.report.min_group_size >= k
    result = intersection_attack(releases, k)
    assert result.respondents == n
    assert result.below_k == 0, result.smallest
