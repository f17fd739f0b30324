"""An absent member's answers outside the k claim move as the present members' did.

Carried forward unchanged, an imputed answer pulls its wave's estimate toward the previous wave
by (absent share) x (change rate), and no weight corrects it (the weights are raked on the
claim). Aged by the transitions of those present in both waves, the imputed answers of the
members who had a value change at the donors' rate, so under random attrition the wave's
published shares are the truth's within binomial error. And the donors of its ``other``
attributes do not depend on the order its wave's records arrived in."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from test_panel import KEY, _text, two_waves

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.policy import policy_from_yaml
from state.memory_store import MemoryStore

# the occupation published as it is, so the imputed answers are seen without randomization
KEPT = _text(3).replace(
    "    method: randomized_response\n    categories: [a, b, c]\n"
    "    rr: {mode: uniform, retention: 0.6}",
    "    method: keep\n    categories: [a, b, c]",
)
assert "method: keep\n    categories: [a, b, c]" in KEPT


def _two_waves(seed: int, n: int = 900, absent: float = 0.4, switch: float = 0.5) -> dict[str, Any]:
    """Wave 1 everyone; wave 2 a random ``absent`` share missing, and every member whose
    occupation was ``a`` (present or not) moved to ``b`` with probability ``switch``."""
    rng = np.random.default_rng(seed)
    people = [
        {"age": int(rng.integers(18, 90)), "sex": "FM"[i % 2], "rel": "other",
         "occ": "abc"[int(rng.integers(3))]}
        for i in range(n)
    ]  # fmt: skip
    w1 = [
        ValidRecord(f"p{i}", {**v, "wave": 1}, SourceRef("in", 0, i), 100.0)
        for i, v in enumerate(people)
    ]
    now = [
        {**v, "occ": "b"} if v["occ"] == "a" and rng.random() < switch else dict(v) for v in people
    ]
    gone = set(np.flatnonzero(rng.random(n) < absent).tolist())
    w2 = [
        ValidRecord(f"p{i}", {**v, "wave": 2}, SourceRef("in", 0, n + i), 200.0)
        for i, v in enumerate(now)
        if i not in gone
    ]
    engine = Engine(policy_from_yaml(KEPT), keyring=KEY, store=MemoryStore())
    out = two_waves(engine, w1, w2)
    who = {KEY.respondent_key(f"p{i}"): i for i in range(n)}
    wave2 = {
        who[r.respondent]: row["occ"] for r in out if (row := orjson.loads(r.value))["wave"] == 2
    }
    return {"before": people, "now": now, "gone": gone, "published": wave2}


def test_imputed_answers_change_at_the_rate_the_present_ones_did() -> None:
    for seed in (1, 2, 3):
        run = _two_waves(seed)
        before, now, gone, pub = run["before"], run["now"], run["gone"], run["published"]
        assert len(pub) == len(before)  # every member in wave 2, the absent imputed
        present_a = [i for i in range(len(before)) if i not in gone and before[i]["occ"] == "a"]
        rate = np.mean([now[i]["occ"] == "b" for i in present_a])  # the donors' moves
        absent_a = [i for i in gone if before[i]["occ"] == "a"]
        moved = sum(pub[i] == "b" for i in absent_a)
        assert all(pub[i] in {"a", "b"} for i in absent_a)  # only moves somebody made
        se = np.sqrt(len(absent_a) * rate * (1 - rate))
        assert abs(moved - rate * len(absent_a)) <= 4 * se, (seed, moved, len(absent_a), rate)
        # nobody with b or c changed: their imputed answers are their last ones
        assert all(pub[i] == before[i]["occ"] for i in gone if before[i]["occ"] != "a")
        # so the wave's published share of b is the truth's, within the imputation's error
        true_b = sum(v["occ"] == "b" for v in now)
        shown_b = sum(v == "b" for v in pub.values())
        # (the absent's true moves and their imputed ones, independent binomials)
        both = np.sqrt(se**2 + len(absent_a) * 0.5 * 0.5)
        assert abs(shown_b - true_b) <= 4 * both, (seed, shown_b, true_b)


def test_an_imputed_members_other_attributes_do_not_depend_on_arrival_order() -> None:
    """The donor of an absent member's ``other`` attributes is drawn among those present by a
    keyed uniform; the pool was in arrival order, so the same answers read in another order
    (another run, several workers) published other values."""
    policy = policy_from_yaml(
        _text(3).replace(
            "  wave: {role: other",
            "  note: {role: other, type: categorical, method: keep, categories: [x, y, z]}\n"
            "  wave: {role: other",
        )
    )
    rng = np.random.default_rng(5)
    people = [
        {"age": int(rng.integers(18, 90)), "sex": "FM"[i % 2], "rel": "other", "occ": "abc"[i % 3],
         "note": "xyz"[int(rng.integers(3))]}
        for i in range(60)
    ]  # fmt: skip
    published = []
    for order in (1, -1):
        engine = Engine(policy, keyring=KEY, store=MemoryStore())
        w1 = [ValidRecord(f"p{i}", {**v, "wave": 1}, None, 100.0) for i, v in enumerate(people)]
        w2 = [
            ValidRecord(f"p{i}", {**v, "wave": 2, "note": "xyz"[i % 3]}, None, 200.0)
            for i, v in enumerate(people)
            if i % 4
        ][::order]
        out = two_waves(engine, w1, w2)
        absent = {KEY.respondent_key(f"p{i}") for i in range(0, 60, 4)}
        published.append(
            sorted(
                (r.record_id, orjson.loads(r.value)["note"]) for r in out if r.respondent in absent
            )
        )
    assert len(published[0]) == 30 and published[0] == published[1]


def test_imputed_numbers_change_as_the_present_ones_did() -> None:
    """A carried number (a noised amount) never changed for an absent member: a published
    amount that changed told a present answer, and the wave's mean lagged. Aged by a nearby
    donor's change, the imputed amounts change as often and by as much as the present ones."""
    policy = policy_from_yaml(
        KEPT.replace(
            "  wave: {role: other",
            "  inc: {role: sensitive, type: numeric, method: noise, noise: {sd: 1}}\n"
            "  wave: {role: other",
        )
    )
    rng = np.random.default_rng(9)
    n = 1200
    people = [
        {"age": int(rng.integers(18, 90)), "sex": "FM"[i % 2], "rel": "other", "occ": "a",
         "inc": 0 if rng.random() < 0.6 else int(rng.integers(1, 50)) * 1000}
        for i in range(n)
    ]  # fmt: skip
    raised = rng.random(n) < 0.3  # a raise of 5,000 for 30 % of everyone
    now = [{**v, "inc": v["inc"] + 5000 * int(r)} for v, r in zip(people, raised, strict=True)]
    gone = set(np.flatnonzero(rng.random(n) < 0.4).tolist())
    engine = Engine(policy, keyring=KEY, store=MemoryStore())
    w1 = [ValidRecord(f"p{i}", {**v, "wave": 1}, None, 100.0) for i, v in enumerate(people)]
    w2 = [
        ValidRecord(f"p{i}", {**v, "wave": 2}, None, 200.0)
        for i, v in enumerate(now)
        if i not in gone
    ]
    out = two_waves(engine, w1, w2)
    who = {KEY.respondent_key(f"p{i}"): i for i in range(n)}
    pub: dict[int, dict[int, float]] = {1: {}, 2: {}}
    for r in out:
        row = orjson.loads(r.value)
        pub[row["wave"]][who[r.respondent]] = row["inc"]
    absent = sorted(gone)
    # noise of sd 1, sticky per true value: a published amount changes iff the amount did
    changed = np.array([pub[2][i] != pub[1][i] for i in absent])
    rate = np.mean([raised[i] for i in range(n) if i not in gone])
    se = np.sqrt(rate * (1 - rate) / len(absent))
    assert abs(changed.mean() - rate) <= 4 * se, (changed.mean(), rate)
    change = np.array([pub[2][i] - pub[1][i] for i in absent])
    mean_se = change.std(ddof=1) / np.sqrt(len(absent))
    assert abs(change.mean() - 5000 * rate) <= 4 * mean_se, change.mean()
