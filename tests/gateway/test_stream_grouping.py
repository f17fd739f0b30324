"""Strata and l-diversity in the stream engine (issue 31 on top of issue 29's republication).

Random panels of respondents that change their quasi-identifiers, their stratum (a region that
is not in the k claim) and their sensitive answer, skip waves and arrive in any order, through
windows of any size, under every republication mode. What must hold:

* no group crosses a stratum: every record published with a group's tuple, in any release,
  is in the group's stratum (the group a record published with is its respondent's current
  group in the state store once the window is decided);
* k per release (``regroup``, ``cohort``) and over the history (every mode), even with the
  stratum published beside the tuple: the (tuple, stratum) classes hold k respondents;
* with l-diversity on the published answer: every (tuple, stratum) class of every release
  (``regroup``, ``cohort``; over the history for ``deferred``, which has no per-release quorum)
  publishes at least l distinct answers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord, WindowResult
from gateway.engine.shards import ShardedEngine
from gateway.errors import PolicyError
from gateway.keyed.keyed import Keyring
from gateway.policy import Policy, policy_from_yaml
from gateway.state_store.state_codec import decode_state
from state.memory_store import MemoryStore

KEY = Keyring(b"stream-strata-and-l-diversity-01")
POLICY = """
input: {respondent_id: rid}
window: {max_records: 1000, max_seconds: 1, max_hold_seconds: 1000000, on_hold_timeout: suppress}
microaggregation: {k: K, strata: [region], small_strata: suppress LDIV}
republication: {mode: MODE, wave_attribute: wave, pool: POOL, slack: SLACK}
attributes:
  age:    {role: quasi_identifier, type: numeric, method: microaggregation}
  sex:    {role: quasi_identifier, type: categorical, method: microaggregation, categories: [F, M]}
  region: {role: other, type: categorical, method: keep, categories: [north, south, east]}
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [a, b, c]
    rr: {mode: uniform, retention: 0.6}
  wave:   {role: other, type: numeric, method: keep}
"""
CLAIM = ("age", "sex")
REGIONS = ("north", "south", "east")


def _policy(
    mode: str = "regroup",
    *,
    k: int = 3,
    ell: int | None = None,
    pool: str = "window",
    slack: int = 0,
    strata: bool = True,
) -> Policy:
    text = (
        POLICY.replace("MODE", mode)
        .replace("POOL", pool)
        .replace("SLACK", str(slack))
        .replace("K", str(k))
        .replace("LDIV", "" if ell is None else f", l_diversity: {{attribute: occ, l: {ell}}}")
    )
    if not strata:
        text = text.replace("strata: [region], small_strata: suppress", "standardize: true")
    return policy_from_yaml(text)


@st.composite
def panels(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "mode": draw(st.sampled_from(["regroup", "cohort", "deferred"])),
        "pool": draw(st.sampled_from(["window", "release"])),
        "slack": draw(st.integers(0, 2)),
        "k": draw(st.integers(2, 4)),
        "ell": draw(st.sampled_from([None, 2, 3])),
        "regions": draw(st.integers(1, 3)),
        "n": draw(st.integers(12, 60)),
        "waves": draw(st.integers(2, 4)),
        "skip": draw(st.sampled_from([0.0, 0.2])),
        "change": draw(st.sampled_from([0.0, 0.3])),
        "window": draw(st.integers(3, 80)),
        "seed": draw(st.integers(0, 2**31)),
    }


def _truth(rng: np.random.Generator, n: int, regions: int) -> list[dict[str, Any]]:
    return [
        {
            "age": round(float(rng.uniform(18, 90)), 6),
            "sex": str(rng.choice(["F", "M"])),
            "region": REGIONS[int(rng.integers(regions))],
            "occ": "abc"[int(rng.integers(3))],
        }
        for _ in range(n)
    ]


def _change(rng: np.random.Generator, v: dict[str, Any], regions: int) -> None:
    what = int(rng.integers(4))
    if what == 0:
        v["age"] = round(float(np.clip(v["age"] + rng.normal(0, 4), 18, 90)), 6)
    elif what == 1:
        v["sex"] = "F" if v["sex"] == "M" else "M"
    elif what == 2:
        v["region"] = REGIONS[int(rng.integers(regions))]
    else:
        v["occ"] = "abc"[int(rng.integers(3))]


GroupOf = Callable[[str, SourceRef], "str | None"]


def _group_reader(stores: list[MemoryStore], *, scoped: bool = False) -> GroupOf:
    """The current group of a respondent (``g`` under regroup and cohort, ``current`` under
    deferred), read from whichever store holds it."""

    def group_of(rid: str, source: SourceRef) -> str | None:
        key = KEY.respondent_keys([rid])[0]
        if scoped:
            key = source.partition.to_bytes(2, "big") + key
        for store in stores:
            raw = store.get_many([key]).get(key)
            if raw is not None:
                state = decode_state(raw)
                current = state.get("g") or state.get("current")
                return None if current is None else str(current[0])
        return None

    return group_of


def _run_panel(
    engine: Any, p: dict[str, Any], group_of: GroupOf | None = None
) -> tuple[list[list[dict[str, Any]]], int]:
    """Every wave's published rows (with the respondent and, given ``group_of``, the group it
    published with), and how many records were sent."""
    rng = np.random.default_rng(p["seed"])
    truth = _truth(rng, p["n"], p["regions"])
    releases: list[list[dict[str, Any]]] = [[] for _ in range(p["waves"])]
    owner: dict[str, tuple[str, SourceRef]] = {}
    held: list[ValidRecord] = []
    sent = 0
    for w in range(1, p["waves"] + 1):
        if w > 1:
            for v in truth:
                if rng.random() < p["change"]:
                    _change(rng, v, p["regions"])
        present = [i for i in range(p["n"]) if rng.random() >= p["skip"]]
        records = []
        for i in rng.permutation(present).tolist():
            source = SourceRef("in", int(rng.integers(2)), sent)
            sent += 1
            owner[source.record_id] = (f"r{i}", source)
            records.append(ValidRecord(f"r{i}", {**truth[i], "wave": w}, source, 0.0))
        batches = [records[s : s + p["window"]] for s in range(0, len(records), p["window"])]
        for j, batch in enumerate(batches):
            last = w == p["waves"] and j == len(batches) - 1
            res = engine.protect_window(held + batch, now=0.0, flush_all=last)
            held = list(res.held)
            if p["mode"] != "deferred":  # what the window reports of its releases' classes
                measures = res.report.measures
                assert measures.get("release_smallest_class", p["k"]) >= p["k"]
                if p["ell"] is not None:
                    assert measures.get("ldiv_min:occ", p["ell"]) >= p["ell"]
            for rec in res.published:
                row = orjson.loads(rec.value)
                rid, source = owner[rec.record_id]
                group = group_of(rid, source) if group_of and row["age"] is not None else None
                releases[row["wave"] - 1].append({**row, "rid": rid, "group": group})
    assert not held  # the last flush decides every record
    return releases, sent


def _classes(
    rows: list[dict[str, Any]], by: tuple[str, ...] = CLAIM
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["age"] is not None:  # suppressed: no class
            out[tuple(row[c] for c in by)].append(row)
    return out


def _check(releases: list[list[dict[str, Any]]], p: dict[str, Any]) -> int:
    """The module docstring's invariants; returns how many records were published in a class."""
    k, ell, per_release = p["k"], p["ell"], p["mode"] != "deferred"
    history: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    strata_of_group: dict[str, set[str]] = defaultdict(set)
    grouped = 0
    for rows in releases:
        for row in rows:
            if row["group"] is not None:
                strata_of_group[row["group"]].add(row["region"])
        for qi, members in _classes(rows, (*CLAIM, "region")).items():
            grouped += len(members)
            history[qi].extend(members)
            if per_release:
                assert len({m["rid"] for m in members}) >= k, "a class below k in a release"
                if ell is not None:
                    assert len({m["occ"] for m in members}) >= ell, "a class below l"
    crossing = [g for g, strata in strata_of_group.items() if len(strata) > 1]
    assert not crossing, "a group crosses a stratum"
    for members in history.values():
        assert len({m["rid"] for m in members}) >= k, "a class below k over the history"
        if ell is not None:
            assert len({m["occ"] for m in members}) >= ell, "a class below l over the history"
    return grouped


@given(panels())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_panels_keep_strata_k_and_l(p: dict[str, Any]) -> None:
    policy = _policy(p["mode"], k=p["k"], ell=p["ell"], pool=p["pool"], slack=p["slack"])
    store = MemoryStore()
    engine = Engine(policy, keyring=KEY, store=store)
    releases, sent = _run_panel(engine, p, _group_reader([store]))
    assert sum(map(len, releases)) == sent
    grouped = _check(releases, p)
    # not vacuous: a first wave of 4k·regions·(l or 1) respondents with no skips forms groups
    if p["skip"] == 0 and p["n"] >= 4 * p["k"] * p["regions"] * (p["ell"] or 1):
        assert grouped > 0


@given(panels())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_partition_scope_and_shards_keep_strata_k_and_l(p: dict[str, Any]) -> None:
    """Groups are formed per (partition, stratum) in partition scope and within each shard."""
    policy = _policy(p["mode"], k=p["k"], ell=p["ell"], pool=p["pool"], slack=p["slack"])
    store = MemoryStore()
    scoped = Engine(policy, keyring=KEY, store=store, partition_scope=True)
    _check(_run_panel(scoped, p, _group_reader([store], scoped=True))[0], p)
    stores = [MemoryStore(), MemoryStore()]
    shards = ShardedEngine(
        [Engine(policy, keyring=KEY, store=s, measure_risk=False) for s in stores]
    )
    _check(_run_panel(shards, p, _group_reader(stores))[0], p)


def _wave(rows: list[dict[str, Any]], wave: int, start: int = 0) -> list[ValidRecord]:
    return [
        ValidRecord(r["rid"], {**r, "wave": wave}, SourceRef("in", 0, start + i), 0.0)
        for i, r in enumerate(rows)
    ]


def _rows(result: WindowResult) -> list[dict[str, Any]]:
    return [orjson.loads(p.value) for p in result.published]


def _people(n: int, region: str, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "rid": f"{region}{i}",
            "age": round(float(rng.uniform(18, 90)), 3),
            "sex": "FM"[i % 2],
            "region": region,
            "occ": "abc"[i % 3],
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("mode", ["regroup", "cohort", "deferred"])
def test_a_stratum_below_k_waits_then_follows_the_hold_policy(mode: str) -> None:
    engine = Engine(_policy(mode, k=3), keyring=KEY, store=MemoryStore())
    north, south = _people(7, "north"), _people(2, "south")
    first = engine.protect_window(_wave(north + south, 1), now=0.0)
    assert {r.values["region"] for r in first.held} == {"south"}  # 2 < k: they wait
    assert {r["region"] for r in _rows(first)} == {"north"}
    assert all(r["age"] is not None for r in _rows(first))
    # without strata the two would have joined the north's groups at once
    plain = Engine(_policy(mode, k=3, strata=False), keyring=KEY, store=MemoryStore())
    assert not plain.protect_window(_wave(north + south, 1), now=0.0).held
    last = engine.protect_window(list(first.held), now=0.0, flush_all=True)
    assert [r["age"] for r in _rows(last)] == [None, None]  # hold over: suppressed
    # a third south respondent makes k: grouped among the south alone
    more = _people(3, "south", seed=1)
    grouped = _rows(engine.protect_window(_wave(more, 1, 100), now=0.0))
    assert len({(r["age"], r["sex"]) for r in grouped}) == 1 and grouped[0]["age"] is not None


def test_small_strata_merge_is_refused_by_the_stream_engine() -> None:
    text = POLICY.replace("small_strata: suppress LDIV", "small_strata: merge")
    text = text.replace("MODE", "regroup").replace("POOL", "window").replace("SLACK", "0")
    policy = policy_from_yaml(text.replace("K", "3"))
    with pytest.raises(PolicyError, match=r"small_strata merge .* set small_strata: suppress"):
        Engine(policy, keyring=KEY, store=MemoryStore())
    # the default is merge: strata alone are refused the same way, naming the fix
    default = policy_from_yaml(text.replace("K", "3").replace(", small_strata: merge", ""))
    with pytest.raises(PolicyError, match="small_strata: suppress"):
        Engine(default, keyring=KEY, store=MemoryStore())


@pytest.mark.parametrize("mode", ["regroup", "deferred"])
def test_respondents_who_change_stratum_are_grouped_in_the_new_one(mode: str) -> None:
    """Even where leaving drops their old group below k live members (the deferred mode keeps a
    changed respondent in its group then: not across a stratum)."""
    engine = Engine(_policy(mode, k=3), keyring=KEY, store=MemoryStore())
    north, south = _people(6, "north"), _people(6, "south")
    first = _rows(engine.protect_window(_wave(north + south, 1), now=0.0))
    assert all(r["age"] is not None for r in first)
    north_tuples = {(r["age"], r["sex"]) for r in first if r["region"] == "north"}
    # same age and sex: only the stratum changed
    moved = [{**person, "region": "south"} for person in north[:3]]
    second = engine.protect_window(_wave([*moved, *south], 2, 100), now=0.0, flush_all=True)
    rows = _rows(second)
    movers = [r for r in rows if int(r["record_id"].split("/")[-1]) < 103]
    assert all(r["age"] is not None for r in movers)
    assert not {(r["age"], r["sex"]) for r in movers} & north_tuples  # left the north groups
    for r in movers:  # into a class of k in the south
        shared = [o for o in rows if (o["age"], o["sex"]) == (r["age"], r["sex"])]
        assert len(shared) >= 3 and {o["region"] for o in shared} == {"south"}


def test_a_cohort_member_who_changes_stratum_is_suppressed_not_regrouped() -> None:
    engine = Engine(_policy("cohort", k=3), keyring=KEY, store=MemoryStore())
    north, south = _people(6, "north"), _people(6, "south")
    first = _rows(engine.protect_window(_wave(north + south, 1), now=0.0))
    everyone = north + south
    cohort_of = {
        everyone[int(r["record_id"].split("/")[-1])]["rid"]: (r["age"], r["sex"]) for r in first
    }
    moved = {**north[0], "region": "south"}
    res = engine.protect_window(_wave([moved, *north[1:], *south], 2, 100), now=0.0)
    by_id = {r["record_id"]: r for r in _rows(res)}
    assert by_id["in/0/100"]["age"] is None  # at once: its cohort is in the north
    # the others publish their cohorts' tuples, or wait for the quorum the mover leaves short
    for i, person in enumerate([*north[1:], *south], start=101):
        row = by_id.get(f"in/0/{i}")
        if row is None:
            assert cohort_of[person["rid"]] == cohort_of[north[0]["rid"]]
            continue
        assert (row["age"], row["sex"]) == cohort_of[person["rid"]]
    assert len(res.held) <= 2  # its cohort-mates (k = 3: a cohort of 3 to 5)


@pytest.mark.parametrize("mode", ["regroup", "cohort", "deferred"])
def test_l_diversity_merges_groups_and_reports_the_release_minimum(mode: str) -> None:
    engine = Engine(_policy(mode, k=2, ell=3), keyring=KEY, store=MemoryStore())
    people = _people(30, "north", seed=3)
    res = engine.protect_window(_wave(people, 1), now=0.0, flush_all=True)
    classes = _classes(_rows(res))
    assert classes and all(len({m["occ"] for m in c}) >= 3 for c in classes.values())
    # k = 2 makes groups of 2-3: at least some had to be merged to reach 3 distinct answers
    assert min(len(c) for c in classes.values()) >= 3
    assert res.report.measures["ldiv_min:occ"] >= 3
    # the metadata topic says so, for the analyst
    meta = engine.metadata()
    assert meta["strata"] == ["region"] and meta["l_diversity"] == {"attribute": "occ", "l": 3}


def test_a_pool_with_fewer_than_l_distinct_published_values_waits() -> None:
    people = _people(60, "east", seed=4)
    probe = Engine(_policy("regroup", k=2, ell=3), keyring=KEY, store=MemoryStore())
    answers = {  # what each publishes: sticky keyed draws, the same in any engine
        p["rid"]: orjson.loads(
            probe.protect_window(_wave([p], 1), now=0.0, flush_all=True).published[0].value
        )["occ"]
        for p in people
    }
    two = [p for p in people if answers[p["rid"]] in {"a", "b"}][:6]
    assert {answers[p["rid"]] for p in two} == {"a", "b"}
    store = MemoryStore()
    engine = Engine(_policy("regroup", k=2, ell=3), keyring=KEY, store=store)
    res = engine.protect_window(_wave(two, 1), now=0.0)
    assert len(res.held) == len(two)  # two distinct published answers among six: they wait
    # their answers were drawn to decide, but a held record's state is not written
    assert not store.get_many(KEY.respondent_keys([p["rid"] for p in two]))
    third = next(p for p in people if answers[p["rid"]] == "c")
    grouped = engine.protect_window([*res.held, *_wave([third], 1, 500)], now=0.0)
    assert not grouped.held  # a third answer arrives: grouped, l-diverse
    classes = _classes(_rows(grouped))
    assert classes and all(len({m["occ"] for m in c}) >= 3 for c in classes.values())
    assert {r["occ"] for r in _rows(grouped)} == {"a", "b", "c"}  # as drawn when deciding
    stored = store.get_many(KEY.respondent_keys([p["rid"] for p in [*two, third]]))
    assert len(stored) == len(two) + 1 and all("rr" in decode_state(v) for v in stored.values())
    # and without one the pool is suppressed when its hold is over
    other = Engine(_policy("regroup", k=2, ell=3), keyring=KEY, store=MemoryStore())
    flushed = other.protect_window(_wave(two, 1), now=0.0, flush_all=True)
    assert all(r["age"] is None for r in _rows(flushed))


def test_group_ids_and_outputs_are_deterministic_with_strata_and_l() -> None:
    p = {
        "mode": "regroup",
        "pool": "window",
        "slack": 1,
        "k": 3,
        "ell": 2,
        "regions": 3,
        "n": 60,
        "waves": 3,
        "skip": 0.2,
        "change": 0.3,
        "window": 25,
        "seed": 7,
    }
    outputs = []
    for _ in range(2):
        engine = Engine(_policy("regroup", k=3, ell=2, slack=1), keyring=KEY, store=MemoryStore())
        outputs.append(_run_panel(engine, p)[0])
    assert outputs[0] == outputs[1]
    _check(outputs[0], p)
