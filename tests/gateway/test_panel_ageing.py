"""An absent member's answers outside the k claim move as the present members' did.

Carried forward unchanged, an imputed answer pulls its wave's estimate toward the previous wave
by (absent share) x (change rate), and no weight corrects it (the weights are raked on the
claim). Aged by the transitions of those present in both waves, the imputed answers of the
members who had a value change at the donors' rate, so under random attrition the wave's
published shares are the truth's within binomial error. And the donors of its ``other``
attributes do not depend on the order its wave's records arrived in."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import orjson
import pytest
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


def _two_waves(
    seed: int, n: int = 900, absent: float = 0.4, switch: float = 0.5, second: int = 2
) -> dict[str, Any]:
    """Wave 1 everyone; wave ``second`` a random ``absent`` share missing, and every member
    whose occupation was ``a`` (present or not) moved to ``b`` with probability ``switch``."""
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
        ValidRecord(f"p{i}", {**v, "wave": second}, SourceRef("in", 0, n + i), 200.0)
        for i, v in enumerate(now)
        if i not in gone
    ]
    # (a panel whose wave numbers skip says by how much)
    stepped = KEPT.replace("slack: 0,", f"slack: 0, max_wave_step: {second - 1},")
    engine = Engine(policy_from_yaml(stepped), keyring=KEY, store=MemoryStore())
    out = two_waves(engine, w1, w2)
    who = {KEY.respondent_key(f"p{i}"): i for i in range(n)}
    wave2 = {
        who[r.respondent]: row["occ"]
        for r in out
        if (row := orjson.loads(r.value))["wave"] == second
    }
    return {"before": people, "now": now, "gone": gone, "published": wave2}


@pytest.mark.parametrize("second", [2, 4])
def test_imputed_answers_change_at_the_rate_the_present_ones_did(second: int) -> None:
    """Also when the panel skips a wave number (wave 4 after 1): the moves were observed only
    from wave - 1, so none was, and every absent member was carried forward unchanged."""
    for seed in (1, 2, 3):
        run = _two_waves(seed, second=second)
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


def test_an_imputed_members_other_attributes_are_its_own_aged() -> None:
    """The ``other`` attributes published beside the claim were a random present respondent's:
    a member's stable region changed for 80 % of imputed records (11 % of present ones, in a
    probe), a habitual hour of answering was lost, and a timestamp published to the minute was
    always some present record's. Aged as answers are, a stable value stays the member's and a
    time moves by a donor's shift from a time near the member's own."""
    policy = policy_from_yaml(
        _text(3).replace(
            "  wave: {role: other",
            "  region: {role: other, type: categorical, method: keep, categories: [n, s, e, w]}\n"
            "  at: {role: other, type: timestamp, method: coarsen, coarsen: {unit: minute}}\n"
            "  wave: {role: other",
        )
    )
    rng = np.random.default_rng(11)
    n = 600
    habit = rng.uniform(0, 100_000, n)  # each member's own time into a wave, in seconds
    people = [
        {"age": int(rng.integers(18, 90)), "sex": "FM"[i % 2], "rel": "other", "occ": "abc"[i % 3],
         "region": "nsew"[int(rng.integers(4))]}
        for i in range(n)
    ]  # fmt: skip

    def at(wave: int, i: int) -> str:  # the member's habit, give or take ten minutes
        start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=7 * wave)
        return (start + timedelta(seconds=habit[i] + rng.uniform(-600, 600))).isoformat()

    gone = set(np.flatnonzero(rng.random(n) < 0.4).tolist())
    w1 = [ValidRecord(f"p{i}", {**v, "wave": 1, "at": at(1, i)}, None, 100.0)
          for i, v in enumerate(people)]  # fmt: skip
    w2 = [ValidRecord(f"p{i}", {**v, "wave": 2, "at": at(2, i)}, None, 200.0)
          for i, v in enumerate(people) if i not in gone]  # fmt: skip
    out = two_waves(Engine(policy, keyring=KEY, store=MemoryStore()), w1, w2)
    who = {KEY.respondent_key(f"p{i}"): i for i in range(n)}
    rows = {(who[r.respondent], row["wave"]): row for r in out if (row := orjson.loads(r.value))}
    absent = sorted(gone)
    assert len(absent) > 150 and all((i, 2) in rows for i in absent)
    # the region: nobody's changes, so no imputed one does
    assert all(rows[i, 2]["region"] == people[i]["region"] for i in absent)
    # the time: near the member's habit (its last time shifted by about a wave), as a present
    # member's is; a random respondent's time is off by a third of the spread on average
    start2 = datetime(2026, 1, 15, tzinfo=UTC)
    off = [
        abs((datetime.fromisoformat(rows[i, 2]["at"]) - start2).total_seconds() - habit[i])
        for i in absent
    ]
    assert np.median(off) < 3_000, np.median(off)
    # an imputed minute was always a present record's; now it is one as often as a present
    # record's minute is another present record's (within binomial error)
    minutes = Counter(rows[i, 2]["at"] for i in range(n) if i not in gone)
    present_rate = np.mean([minutes[rows[i, 2]["at"]] > 1 for i in range(n) if i not in gone])
    shared = sum(rows[i, 2]["at"] in minutes for i in absent)
    se = np.sqrt(len(absent) * present_rate * (1 - present_rate))
    assert abs(shared - present_rate * len(absent)) <= 4 * se, (shared, present_rate)


def test_imputed_answers_change_together_as_the_present_ones_did() -> None:
    """Answers that change together (a new job: occupation and income) were aged one at a
    time, so an imputed change came alone: a probe told imputed records from one wave by their
    change pattern (AUC 0.59). Aged as one donor's moves, the imputed members' joint pattern is
    the present members' within binomial error."""
    policy = policy_from_yaml(
        KEPT.replace(
            "  wave: {role: other",
            "  inc: {role: sensitive, type: numeric, method: noise, noise: {sd: 1}}\n"
            "  wave: {role: other",
        )
    )
    rng = np.random.default_rng(13)
    n = 1500
    people = [
        {"age": int(rng.integers(18, 90)), "sex": "FM"[i % 2], "rel": "other",
         "occ": "abc"[int(rng.integers(3))], "inc": int(rng.integers(1, 50)) * 1000}
        for i in range(n)
    ]  # fmt: skip
    event = rng.choice(4, n, p=[0.6, 0.25, 0.075, 0.075])  # none, both, occupation, income
    nxt = {"a": "b", "b": "c", "c": "a"}
    now = [
        {**v, "occ": nxt[v["occ"]] if e in (1, 2) else v["occ"],
         "inc": v["inc"] + 5000 if e in (1, 3) else v["inc"]}
        for v, e in zip(people, event, strict=True)
    ]  # fmt: skip
    gone = set(np.flatnonzero(rng.random(n) < 0.4).tolist())
    w1 = [ValidRecord(f"p{i}", {**v, "wave": 1}, None, 100.0) for i, v in enumerate(people)]
    w2 = [ValidRecord(f"p{i}", {**v, "wave": 2}, None, 200.0)
          for i, v in enumerate(now) if i not in gone]  # fmt: skip
    out = two_waves(Engine(policy, keyring=KEY, store=MemoryStore()), w1, w2)
    who = {KEY.respondent_key(f"p{i}"): i for i in range(n)}
    pub: dict[tuple[int, int], dict[str, Any]] = {
        (who[r.respondent], row["wave"]): row for r in out if (row := orjson.loads(r.value))
    }

    def pattern(i: int) -> tuple[bool, bool]:  # published changes: occupation, income
        return pub[i, 2]["occ"] != pub[i, 1]["occ"], pub[i, 2]["inc"] != pub[i, 1]["inc"]

    absent = sorted(gone)
    present = [i for i in range(n) if i not in gone]
    for cell in ((True, True), (True, False), (False, True), (False, False)):
        rate = np.mean([pattern(i) == cell for i in present])
        got = sum(pattern(i) == cell for i in absent)
        se = np.sqrt(len(absent) * rate * (1 - rate))
        assert abs(got - rate * len(absent)) <= 4 * se, (cell, got, rate * len(absent))
