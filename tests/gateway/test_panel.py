"""The ``panel`` republication mode over random panels (issue 43): respondents that change,
skip waves, join late and retire, windows of any size, and crashes that replay a decided wave.

Every active member is published once in every release, present or imputed; every published
tuple is shared by at least k respondents within its release and over the history; every
respondent's linked candidate set, followed across releases by its published values, stays at
k or more (the intruder who knows who took part learns nothing from imputed records, which
are in every release like present ones); a class shares one weight; a replay republishes the
same bytes under the same ids; randomized answers of an unchanged value never change."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_republication import CLAIM
from test_republication import POLICY as REPUBLICATION_POLICY

import gateway.panel.roster as roster_module
from gateway.engine.engine import Engine
from gateway.engine.records import (
    InputMarks,
    PublishedRecord,
    SourceRef,
    ValidRecord,
    WindowResult,
)
from gateway.errors import PolicyError
from gateway.keyed.draw_derivation import META_NAME
from gateway.keyed.keyed import Keyring
from gateway.measures.attack import linked_sets
from gateway.panel.draws import DrawTable
from gateway.panel.roster import Sealer, read_roster, roster_entries, roster_key
from gateway.panel.step import CARRY_SALT
from gateway.policy import policy_from_yaml
from gateway.state_store.state_codec import encode_state
from state.memory_store import MemoryStore

KEY = Keyring(b"panel-mode-property-secret-01234")
# the random panels' policy of test_republication, as a panel: a short hold time (which must
# not decide a panel wave), retirement and the close grace
POLICY = REPUBLICATION_POLICY.replace("max_hold_seconds: 1000000", "max_hold_seconds: 5").replace(
    "republication: {mode: MODE, wave_attribute: wave, pool: POOL, slack: SLACK}",
    "republication: {mode: panel, wave_attribute: wave, slack: SLACK,\n"
    "                retire_after_waves: RETIRE, close_grace_seconds: 10}",
)
assert "panel" in POLICY and "max_hold_seconds: 5" in POLICY
GRACE = 10.0


def _text(k: int, slack: int = 0, retire: int = 2) -> str:
    text = POLICY.replace("SLACK", str(slack)).replace("RETIRE", str(retire))
    return text.replace("K", str(k))


def _policy(k: int, slack: int = 0, retire: int = 2) -> Any:
    return policy_from_yaml(_text(k, slack, retire))


@st.composite
def panels(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "slack": draw(st.integers(0, 2)),
        "k": draw(st.integers(2, 4)),
        "n": draw(st.integers(8, 50)),
        "late": draw(st.integers(0, 12)),  # respondents who join after wave 1
        "waves": draw(st.integers(2, 5)),
        "skip": draw(st.sampled_from([0.0, 0.2, 0.4, 0.7])),
        "change": draw(st.sampled_from([0.0, 0.3])),
        "retire": draw(st.integers(1, 3)),
        "window": draw(st.integers(2, 60)),
        "crash": draw(st.one_of(st.none(), st.integers(1, 4))),
        "repeat": draw(st.sampled_from([0.0, 0.0, 0.2])),  # members answering a wave twice
        "seed": draw(st.integers(0, 2**31)),
    }


def _waves(p: dict[str, Any]) -> list[list[ValidRecord]]:
    rng = np.random.default_rng(p["seed"])
    total = p["n"] + p["late"]
    truth = []
    for _ in range(total):
        sex = str(rng.choice(["F", "M"]))
        rel = str(rng.choice(["other", "husband" if sex == "M" else "wife"]))
        truth.append({"age": int(rng.integers(18, 90)), "sex": sex, "rel": rel, "occ": "abc"[0]})
    joins = {p["n"] + j: int(rng.integers(2, p["waves"] + 1)) for j in range(p["late"])}
    out, sent = [], 0
    for w in range(1, p["waves"] + 1):
        for v in truth:
            if w > 1 and rng.random() < p["change"]:
                v["age"] = int(np.clip(v["age"] + rng.integers(-9, 10), 18, 90))
                v["occ"] = "abc"[int(rng.integers(3))]
        here = [i for i in range(total) if joins.get(i, 1) <= w and (rng.random() >= p["skip"])]
        answers = rng.permutation(here).tolist()
        for i in here:  # a repeat later in the wave, the same answers or a corrected occupation
            if rng.random() < p.get("repeat", 0.0):
                answers.insert(int(rng.integers(answers.index(i), len(answers))) + 1, ~i)
        records = []
        for a in answers:
            i, values = (a, truth[a]) if a >= 0 else (~a, {**truth[~a], "occ": "abc"[a % 3]})
            at = 100.0 * w
            records.append(
                ValidRecord(f"r{i}", {**values, "wave": w}, SourceRef("in", 0, sent), at)
            )
            sent += 1
        out.append(records)
    return out


class Run:
    """Feeds waves the way the worker does: windows, held records back first, a wave closing
    once the next one has been arriving for the grace."""

    def __init__(self, p: dict[str, Any], store: MemoryStore) -> None:
        self.p, self.store = p, store
        self.engine = Engine(_policy(p["k"], p["slack"], p["retire"]), keyring=KEY, store=store)
        self.held: list[ValidRecord] = []
        self.out: list[PublishedRecord] = []
        self.results: list[WindowResult] = []  # each window's, in order

    def feed(self, records: list[ValidRecord], now: float, flush: bool = False) -> None:
        size = self.p["window"]
        batches = [records[s : s + size] for s in range(0, len(records), size)] or [[]]
        for batch in batches:
            res = self.engine.protect_window(self.held + batch, now=now, flush_all=flush)
            self.held = list(res.held)
            self.out.extend(res.published)
            self.results.append(res)

    def crash(self) -> None:
        """The worker dies before committing: a new engine, the same state, the records held
        (uncommitted) read again."""
        self.engine = Engine(
            _policy(self.p["k"], self.p["slack"], self.p["retire"]), keyring=KEY, store=self.store
        )


@given(panels())
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_panels_keep_every_member_and_every_linked_set(p: dict[str, Any]) -> None:
    k = p["k"]
    waves = _waves(p)
    run = Run(p, MemoryStore())
    opened = 0  # records of the current wave already fed (the one that closed the last)
    for w, records in enumerate(waves, start=1):
        run.feed(records[opened:], 100.0 * w)
        opened = 0
        if p["crash"] == w and w < len(waves) and waves[w]:
            # the next wave's first record arrives and, after the grace, closes this wave; then
            # the worker dies before committing and reads both again: the wave's outcome is
            # republished, imputed records too, byte for byte (checked by _check)
            run.feed([], 100.0 * (w + 1) + GRACE)  # nothing due yet: no later wave seen
            run.feed(waves[w][:1], 100.0 * (w + 1))
            run.feed([], 100.0 * (w + 1) + GRACE)
            run.crash()
            run.held = []
            # the commits lagged: the wave before is read again too (a backlog decides
            # several waves in one window, and a crash loses all their outputs)
            earlier = waves[w - 2] if w >= 2 else []
            run.feed([*earlier, *records, *waves[w][:1]], 100.0 * (w + 1))
            run.feed([], 100.0 * (w + 1) + GRACE)
            opened = 1
    run.feed([], 1e9, flush=True)
    assert not run.held
    _check(run.out, waves, k)
    _check_order(run.results)


def _check_order(results: list[WindowResult]) -> None:
    """A window publishes each wave's records in the order of their keyed ids, whatever came
    from a present member and whatever was imputed or re-sent: an order the engine built
    (arrivals, then the roster's absentees) would tell an intruder reading offsets which record
    of a class is imputed."""
    for res in results:
        by_wave: dict[int, list[str]] = defaultdict(list)
        for rec in res.published:
            by_wave[int(orjson.loads(rec.value)["wave"])].append(rec.record_id)
        assert list(by_wave) == sorted(by_wave), "waves out of order"
        assert all(ids == sorted(ids) for ids in by_wave.values()), "not in the order of ids"


def _taking_turns(
    p: dict[str, Any], waves: list[list[ValidRecord]], engines: int, *, part_bytes: int | None
) -> tuple[list[tuple[str, bytes]], dict[bytes, bytes]]:
    """The panel fed window by window to ``engines`` engines over one store, in turn (an input
    partition that moves between workers and back); what they published and stored."""
    store = MemoryStore()
    policy = _policy(p["k"], p["slack"], p["retire"])
    pool = [Engine(policy, keyring=KEY, store=store) for _ in range(engines)]
    held: list[ValidRecord] = []
    out: list[tuple[str, bytes]] = []
    turn = 0
    size = p["window"]
    with pytest.MonkeyPatch.context() as patch:
        if part_bytes is not None:
            patch.setattr(roster_module, "PART_BYTES", part_bytes)
        feeds = [(records, 100.0 * w, False) for w, records in enumerate(waves, start=1)]
        for records, now, flush in [*feeds, ([], 1e9, True)]:
            batches = [records[s : s + size] for s in range(0, len(records), size)] or [[]]
            for batch in batches:
                res = pool[turn % engines].protect_window(held + batch, now=now, flush_all=flush)
                turn += 1
                held = list(res.held)
                out.extend((r.record_id, r.value) for r in res.published)
    return out, dict(store.items())


@given(panels(), st.sampled_from([None, 256]))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_engines_taking_turns_on_one_store_publish_what_one_engine_publishes(
    p: dict[str, Any], part_bytes: int | None
) -> None:
    """An engine keeps the rosters it wrote, and must read the one in the store when another
    engine wrote it since: two engines taking windows in turn publish and store exactly what
    one engine does (rosters whole, or in parts of 256 bytes)."""
    waves = _waves(p)
    alone = _taking_turns(p, waves, 1, part_bytes=part_bytes)
    assert alone == _taking_turns(p, waves, 2, part_bytes=part_bytes)


def _check(out: list[PublishedRecord], waves: list[list[ValidRecord]], k: int) -> None:
    by_id: dict[str, bytes] = {}
    releases: list[dict[bytes, Any]] = [{} for _ in waves]
    weights: dict[tuple[int, Any], set[float]] = defaultdict(set)
    answers: dict[bytes, set[str]] = defaultdict(set)
    for rec in out:
        known = by_id.setdefault(rec.record_id, rec.value)
        assert known == rec.value, "a republished record id with other bytes"
        if known is not rec.value:
            continue  # a replay: counted once
        row = orjson.loads(rec.value)
        who = rec.respondent
        assert who is not None
        wave = int(row["wave"])
        assert who not in releases[wave - 1], "a respondent published twice in one wave"
        qi = None if row["age"] is None else tuple(row[c] for c in CLAIM)
        releases[wave - 1][who] = qi
        if qi is not None:
            assert row["weight"] is not None and row["weight"] > 0
            weights[wave, qi].add(row["weight"])
            assert (row["sex"], row["rel"]) not in {("F", "husband"), ("M", "wife")}
    assert all(len(ws) == 1 for ws in weights.values()), "a class with two weights"
    history: dict[Any, set[bytes]] = defaultdict(set)
    for release in releases:
        classes: dict[Any, set[bytes]] = defaultdict(set)
        for who, qi in release.items():
            if qi is not None:
                classes[qi].add(who)
                history[qi].add(who)
        assert all(len(m) >= k for m in classes.values()), "a class below k within a release"
    assert all(len(m) >= k for m in history.values()), "a class below k over the history"
    sizes = linked_sets(releases)  # type: ignore[arg-type]
    assert all(s >= k for s in sizes.values()), sorted(sizes.values())[:5]
    del answers


def _nine_over_two_waves(
    absent: set[int],
) -> tuple[Engine, list[ValidRecord], list[PublishedRecord]]:
    """Nine members p0..p8 in wave 1, those but ``absent`` in wave 2, both waves decided (the
    last at the flush): the engine, wave 2's records and everything published."""
    engine = Engine(_policy(3), keyring=KEY, store=MemoryStore())
    people = [
        {"age": 20 + 5 * i, "sex": "FM"[i % 2], "rel": "other", "occ": "abc"[i % 3]}
        for i in range(9)
    ]
    w1 = [
        ValidRecord(f"p{i}", {**v, "wave": 1}, SourceRef("in", 0, i), 100.0)
        for i, v in enumerate(people)
    ]
    w2 = [
        ValidRecord(f"p{i}", {**v, "wave": 2}, SourceRef("in", 0, 9 + i), 200.0)
        for i, v in enumerate(people)
        if i not in absent
    ]
    return engine, w2, two_waves(engine, w1, w2)


def two_waves(
    engine: Engine, w1: list[ValidRecord], w2: list[ValidRecord]
) -> list[PublishedRecord]:
    """Waves 1 (at 100 s) and 2 (at 200 s) fed as the worker feeds them, held records first:
    wave 1 closes once wave 2 has been arriving for the grace, wave 2 at the last flush."""
    out: list[PublishedRecord] = []
    held: list[ValidRecord] = []
    for batch, now in ((w1, 100.0), (w2, 200.0), ([], 200.0 + GRACE), ([], 1e9)):
        res = engine.protect_window(held + batch, now=now, flush_all=now == 1e9)
        held = list(res.held)
        out.extend(res.published)
    return out


def test_an_absent_member_is_published_and_not_told_apart() -> None:
    """Wave 2 without one member: it is published all the same, with its sticky answer, and its
    record has the fields, the id shape and the weight of a present one."""
    _, _, out = _nine_over_two_waves({4})
    rows = [(r, orjson.loads(r.value)) for r in out]
    wave2 = [(r, row) for r, row in rows if row["wave"] == 2]
    assert len(wave2) == 9  # the absent member too
    absent = KEY.respondent_key("p4")
    imputed = next(row for r, row in wave2 if r.respondent == absent)
    first = next(row for r, row in rows if row["wave"] == 1 and r.respondent == absent)
    assert imputed["occ"] == first["occ"]  # its sticky draw
    shapes = {tuple(row) for _, row in wave2}
    assert len(shapes) == 1  # the same fields in the same order
    assert {len(row["record_id"]) for _, row in wave2} == {len(imputed["record_id"])}
    assert all(r.source is None for r, _ in wave2)  # no input position on any record


def test_panel_needs_a_wave_and_a_whole_wave() -> None:
    with pytest.raises(PolicyError, match=r"republication\.wave_attribute"):
        policy_from_yaml(_text(3).replace("wave_attribute: wave, ", ""))
    with pytest.raises(PolicyError, match=r"republication\.pool"):
        policy_from_yaml(_text(3).replace("slack: 0,", "slack: 0, pool: window,"))


def test_the_sticky_value_intruder_counts_respondents_it_cannot_tell_apart() -> None:
    """A chain followed by its sticky values loses the class-mates that skip a release (what
    regroup publishes) and keeps them when they are published anyway (what panel publishes);
    records sharing a combination are candidates by their number."""
    from gateway.measures.attack import sticky_chain_linkage  # noqa: PLC0415

    def rows(keys: list[str], qi: str) -> list[dict[str, Any]]:
        return [{"occ": key, "age": qi} for key in keys]

    every_wave = [rows(["x", "a", "b", "b", "c"], "t1"), rows(["x", "a", "b", "b", "c"], "t2")]
    res = sticky_chain_linkage(every_wave, ["occ"], ["age"], k=5)
    assert (res.chains, res.below_k, res.isolated) == (3, 0, 0)  # b, b: one pair, two people
    skipped = [rows(["x", "a", "b", "b", "c"], "t1"), rows(["x", "a"], "t2")]
    res = sticky_chain_linkage(skipped, ["occ"], ["age"], k=5)
    assert res.below_k == 2 and res.smallest[:2] == [2, 2]  # x and a: linked to each other only
    moved = [
        rows(["x", "a", "b", "b", "c"], "t1"),
        [*rows(["a", "b", "b", "c"], "t2"), {"occ": "x", "age": "t3"}],
    ]
    assert sticky_chain_linkage(moved, ["occ"], ["age"], k=5).isolated == 1  # x moved alone


def test_a_wave_trickling_in_forms_the_cohorts_it_forms_fed_at_once() -> None:
    """A wave arriving 4 records at a time over two and a half minutes of a virtual clock (far
    past the policy's 5 s hold time, which cut waves into slices before) is decided whole when
    it closes: the same bytes as the same wave fed at once."""
    rng = np.random.default_rng(20)
    people = [
        {
            "age": int(rng.integers(18, 90)),
            "sex": "FM"[i % 2],
            "rel": "other",
            "occ": "abc"[int(rng.integers(3))],
        }
        for i in range(300)
    ]

    def wave(w: int, at: float, rate: float | None) -> list[ValidRecord]:
        return [
            ValidRecord(
                f"p{i}",
                {**v, "wave": w},
                SourceRef("in", 0, (w - 1) * 1000 + i),
                at + (i / rate if rate else 0.0),
            )
            for i, v in enumerate(people)
        ]

    def run(rate: float | None) -> list[bytes]:
        engine = Engine(_policy(3), keyring=KEY, store=MemoryStore())
        held: list[ValidRecord] = []
        out: list[bytes] = []
        first = wave(1, 0.0, rate)
        second = wave(2, 1000.0, rate)[:3]  # the next wave's first k respondents close it
        size = 4 if rate else len(first)
        for start in range(0, len(first), size):
            batch = first[start : start + size]
            res = engine.protect_window([*held, *batch], now=batch[-1].arrived_at)
            held = list(res.held)
            out.extend(r.value for r in res.published)
        assert not out, "a wave published before it closed"
        # its grace counts from the k-th respondent of the next wave
        for batch, now in ((second, 1000.0), ([], second[-1].arrived_at + GRACE)):
            res = engine.protect_window([*held, *batch], now=now)
            held = list(res.held)
            out.extend(r.value for r in res.published)
        return out

    trickled, at_once = run(2.0), run(None)
    assert len(at_once) == len(people)
    assert trickled == at_once


@given(panels(), st.integers(1, 3), st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_panel_whose_k_rises_merges_its_small_cohorts_whole(
    p: dict[str, Any], rise: int, data: st.DataObject
) -> None:
    """The policy's k rises between two waves (the roster is kept): from the next wave on,
    cohorts below the new k join their nearest cohort whole, so no class of a release is
    below it unless the release holds one class only (a panel smaller than the new k, where
    nothing can be merged), and every member is still published in every wave."""
    waves = _waves(p)
    switch = data.draw(st.integers(1, len(waves) - 1))  # the last wave under the old k
    run = Run(p, MemoryStore())
    opened = 0
    for w, records in enumerate(waves, start=1):
        run.feed(records[opened:], 100.0 * w)
        opened = 0
        if w == switch and waves[w]:
            # the next wave's first record closes this one, decided under the old k; then a
            # new engine with the new policy over the same state decides the later ones
            run.feed(waves[w][:1], 100.0 * (w + 1))
            run.feed([], 100.0 * (w + 1) + GRACE)
            at_switch = len(run.results)
            run.p = {**p, "k": p["k"] + rise}
            run.crash()
            opened = 1
        elif w == switch:
            at_switch = len(run.results)
            run.p = {**p, "k": p["k"] + rise}
            run.crash()
    run.feed([], 1e9, flush=True)
    _check(run.out, waves, p["k"])  # every member in every wave; the history under the old k
    classes: dict[int, dict[Any, set[bytes]]] = defaultdict(lambda: defaultdict(set))
    for rec in run.out:
        row = orjson.loads(rec.value)
        if row["age"] is not None and rec.respondent is not None:
            classes[int(row["wave"])][tuple(row[c] for c in CLAIM)].add(rec.respondent)
    for wave, release in classes.items():
        if wave > switch and len(release) > 1:
            smallest = min(map(len, release.values()))
            assert smallest >= p["k"] + rise, (wave, smallest)
    # linked sets are kept at the history's k (the old one: no later k grows an intersection
    # back), and a wave's report says so: measured against the new k, the critical alert
    # fired for good after every such upgrade
    # (a window that measures linked sets says what they are held to)
    assert all("linked_promised" in r.report.measures
               for r in run.results if "linked_records" in r.report.measures)  # fmt: skip
    old_k = any("linked_promised" in r.report.measures for r in run.results[:at_switch])
    for res in run.results:
        m = res.report.measures
        if "linked_promised" in m:  # (a wave closed only after the switch: the new k)
            assert m["linked_promised"] == (p["k"] if old_k else p["k"] + rise)
            assert m["linked_smallest"] >= m["linked_promised"] and m["linked_below_k"] == 0


def test_an_engine_forgets_the_rosters_of_a_partition_it_no_longer_owns() -> None:
    """Panel waves on two input partitions through an engine with partition scope: it keeps each
    partition's roster (with its members' draws) between waves, and after
    ``forget_partition(0)`` (its worker lost the partition) partition 1's only; wave 3 of
    partition 0 then goes to another engine (the partition's new owner): together they publish
    what one engine that forgot nothing does."""
    p = {"n": 40, "late": 6, "waves": 3, "skip": 0.2, "change": 0.3, "seed": 7}
    waves = [
        [
            ValidRecord(r.respondent_id, r.values, SourceRef("in", i % 2, i), r.arrived_at)
            for i, r in enumerate(records)
        ]
        for records in _waves(p)
    ]

    def run(handover: bool) -> tuple[list[tuple[str, bytes]], set[int | None]]:
        store = MemoryStore()
        engine, other = (
            Engine(_policy(3), keyring=KEY, store=store, partition_scope=True) for _ in "ab"
        )
        out: list[tuple[str, bytes]] = []
        kept: set[int | None] = set()
        for w, records in enumerate(waves, start=1):
            by = {engine: records, other: []}
            if handover and w == 3:
                assert engine._panel is not None
                kept = engine._panel._rosters.partitions
                engine.forget_partition(0)
                assert engine._panel._rosters.partitions == {1}
                by = {
                    engine: [r for r in records if r.source and r.source.partition == 1],
                    other: [r for r in records if r.source and r.source.partition == 0],
                }
            for eng, batch in by.items():
                res = eng.protect_window(batch, now=100.0 * w, flush_all=True)
                assert not res.held
                out.extend((r.record_id, r.value) for r in res.published)
        return sorted(out), kept

    handed, kept = run(True)
    assert kept == {0, 1}
    assert handed == run(False)[0]


def _feed(policy: Any, store: MemoryStore, batches: list[list[ValidRecord]], w0: int) -> list[Any]:
    """Each batch as one flushed window of an engine on ``store`` (waves ``w0``, ``w0`` + 1,
    ...): the published records' ids, values and keys."""
    engine = Engine(policy, keyring=KEY, store=store)
    out: list[Any] = []
    for w, records in enumerate(batches, start=w0):
        res = engine.protect_window(records, now=100.0 * w, flush_all=True)
        out.extend((r.record_id, r.value, r.key) for r in res.published)
    return out


@pytest.mark.parametrize("pseudonym", ["drop", "hmac"])
@pytest.mark.parametrize("layout", ["maps", "lists"])
def test_a_roster_written_with_carried_rows_republishes_as_the_current_format(
    pseudonym: str, layout: str
) -> None:
    """Rosters carried each member's values as a row ``[claim, values, sampling weight, wave]``
    until 2026-11-30, the values as one map a member before 2026-11-29 (``maps``) and as a
    list with the names once a roster after (``lists``); they are read as they are: wave 3
    (absent members imputed from their carried values) publishes the same bytes from a roster
    rewritten in that format as from the current one."""
    p = {"n": 40, "late": 6, "waves": 3, "skip": 0.3, "change": 0.3, "seed": 11}
    waves = _waves(p)
    text = _text(3) + f"output: {{pseudonym: {pseudonym}}}\n"
    policy = policy_from_yaml(text)

    current = MemoryStore()
    _feed(policy, current, waves[:2], 1)
    sealer = Sealer(KEY.hkdf(CARRY_SALT, b"aes-256-gcm"))
    key = roster_key(None)
    roster = read_roster(current.get_many, key, sealer)
    carried = roster.carried
    rows = carried.rows_as_lists()
    assert len(rows) > 30
    doc = msgspec.msgpack.decode(roster.encode(sealer, key))
    if layout == "maps":  # one map a member, its missing values left out
        old = [[c, {n: v for n, v in m.items() if v is not None}, w, o] for c, m, w, o in rows]
    else:
        nid = carried.nid.tolist()
        old = [[c, [nid[i], *m.values()], w, o] for i, (c, m, w, o) in enumerate(rows)]
        doc["cnames"] = carried.names
    doc["carried"] = sealer.seal(msgspec.msgpack.encode(old), key)
    older = MemoryStore()
    older.put_many({**dict(current.items()), key: msgspec.msgpack.encode(doc)})
    derivation = current.meta(META_NAME)  # the draw derivation the state is bound to
    assert derivation is not None
    older.set_meta(META_NAME, derivation)
    assert read_roster(older.get_many, key, sealer).carried.rows_as_lists() == (
        rows if layout == "lists" else [[c, dict(m), w, o] for c, m, w, o in old]
    )
    assert _feed(policy, older, waves[2:], 3) == _feed(policy, current, waves[2:], 3)


def test_draws_kept_in_respondent_states_republish_from_the_roster() -> None:
    """Until 2026-11-30 a panel kept each respondent's sticky draws in a state entry of its
    own, and a respondent's state may come from another republication mode. A roster without
    draws takes those in the first time it meets their respondents: wave 3 (present, returning
    and imputed members) publishes the same bytes from a state rewritten in that format as from
    the current one, and the roster then holds every draw the current one does."""
    p = {"n": 40, "late": 6, "waves": 3, "skip": 0.3, "change": 0.3, "seed": 5}
    waves = _waves(p)
    policy = _policy(3)

    current = MemoryStore()
    _feed(policy, current, waves[:2], 1)
    sealer = Sealer(KEY.hkdf(CARRY_SALT, b"aes-256-gcm"))
    key = roster_key(None)
    roster = read_roster(current.get_many, key, sealer)
    states: dict[bytes, dict[str, Any]] = {}
    for kind, name, respondent, digest, value in roster.draws.entries():
        states.setdefault(respondent, {}).setdefault(kind, {}).setdefault(name, {})[
            digest.hex()
        ] = value
    assert len(states) > 30 and all("rr" in s for s in states.values())
    held = len(list(roster.draws.entries()))
    roster.draws = DrawTable()
    [(_, body)] = roster_entries(roster, sealer, key).items()
    doc = msgspec.msgpack.decode(body)
    del doc["draws"]  # the format before: no draws in the roster
    older = MemoryStore()
    older.put_many(
        {
            **dict(current.items()),
            key: msgspec.msgpack.encode(doc),
            **{k: encode_state(s) for k, s in states.items()},
        }
    )
    older.set_meta(META_NAME, current.meta(META_NAME) or b"")
    assert _feed(policy, older, waves[2:], 3) == _feed(policy, current, waves[2:], 3)
    after = read_roster(older.get_many, key, sealer).draws
    now = read_roster(current.get_many, key, sealer).draws
    assert len(list(after.entries())) >= held
    # the same draws (numbered in the order their respondents were met)
    assert sorted(map(repr, after.entries())) == sorted(map(repr, now.entries()))


@given(panels())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_window_reports_the_classes_it_publishes(p: dict[str, Any]) -> None:
    """A window that decides waves reports as many classes, and as small a smallest one, as
    its records publish: members who retired count nowhere, every member counted is published
    (present or imputed) with its class's tuple. Panels that retire often: cohorts above k
    (slack), members who skip most waves and retire after one, no one joining late."""
    p = {**p, "crash": None, "retire": 1, "slack": 2, "skip": 0.5, "late": 0, "waves": 5}
    p["n"] = max(p["n"], 30)  # so wave 1 holds k respondents or more (all but 4 in 10^6 draws)
    run = Run(p, MemoryStore())
    for w, records in enumerate(_waves(p), start=1):
        run.feed(records, 100.0 * w)
    run.feed([], 1e9, flush=True)
    checked = 0
    for res in run.results:
        classes: dict[tuple[int, Any], int] = defaultdict(int)
        for rec in res.published:
            row = orjson.loads(rec.value)
            if row["age"] is not None:
                classes[int(row["wave"]), tuple(row[c] for c in CLAIM)] += 1
        # every record decided is published or withheld (a repeat); the imputed ones besides
        report = res.report
        assert report.published + report.imputed == len(res.published)
        assert report.published + report.withheld + report.held == report.records_in
        assert res.report.groups == len(classes)
        if classes:
            assert res.report.min_group_size == min(classes.values())
            checked += 1
    assert checked >= 1


@given(panels())
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_window_reports_the_share_of_members_published_with_other_categories(
    p: dict[str, Any],
) -> None:
    """``panel_stale_ratio``: of the members present in a wave and published in a class, the
    share whose class publishes other categories than they answered (the worst wave of the
    window), counted here from the published records against the input."""
    p = {**p, "crash": None, "change": 0.5}
    waves = _waves(p)
    answered = {
        (KEY.respondent_key(r.respondent_id), int(r.values["wave"])): r.values
        for records in waves
        for r in records
        if r.respondent_id is not None
    }
    run = Run(p, MemoryStore())
    for w, records in enumerate(waves, start=1):
        run.feed(records, 100.0 * w)
    run.feed([], 1e9, flush=True)
    checked = 0
    for res in run.results:
        if "panel_stale_ratio" not in res.report.measures:
            continue
        by_wave: dict[int, list[bool]] = defaultdict(list)
        for rec in res.published:
            row = orjson.loads(rec.value)
            truth = answered.get((rec.respondent, int(row["wave"])))
            if truth is None or row["age"] is None:  # imputed, or not in a class
                continue
            by_wave[int(row["wave"])].append(
                (row["sex"], row["rel"]) != (truth["sex"], truth["rel"])
            )
        want = max((sum(v) / len(v) for v in by_wave.values()), default=0.0)
        assert res.report.measures["panel_stale_ratio"] == pytest.approx(want, abs=1e-12)
        checked += 1
    assert checked


@given(panels())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_record_read_again_is_measured_in_its_class_of_the_release(p: dict[str, Any]) -> None:
    """A record of a decided wave read again (with no input position, as here, a record cannot
    be told from one the wave was decided with) republishes the record as its release published
    it; the window holds that one record, but its class is the release's: measured there, it
    was a class of 1 < k (an error line, and the critical alert on the key's smallest class)."""
    # the copies in one window: the last window's measure is compared with all of them
    p = {**p, "crash": None, "late": 0, "waves": 1, "skip": 0.0, "window": max(p["window"], 3)}
    p["n"] = max(p["n"], 30)
    run = Run(p, MemoryStore())
    wave = _waves(p)[0]
    run.feed(wave, 100.0)
    run.feed([], 1e9, flush=True)
    release: dict[tuple[Any, ...], int] = defaultdict(int)
    first: dict[str, tuple[Any, ...]] = {}
    for rec in run.out:
        row = orjson.loads(rec.value)
        if row["age"] is not None:
            release[tuple(row[c] for c in CLAIM)] += 1
            first[rec.record_id] = tuple(row[c] for c in CLAIM)
    copies = [r for r in wave if r.values["age"] is not None][: 1 + p["seed"] % 3]
    before = len(run.out)
    run.feed(copies, 1e9 + 1.0, flush=True)
    again = run.out[before:]
    assert {r.record_id for r in again} <= set(first)  # the same records, republished
    measures = run.results[-1].report.measures
    sizes = [release[first[r.record_id]] for r in again if r.record_id in first]
    assert sizes and min(sizes) >= p["k"]
    assert measures["key_smallest_class"] == min(sizes)
    assert measures["key_share_below_k"] == 0.0 and measures["key_uniques"] == 0.0


def test_a_late_copy_is_dropped_and_a_record_read_again_republishes_the_imputed_too() -> None:
    """A decided wave's records are sent again only with a record the wave was decided with (a
    restart may have lost the outputs), the imputed ones with them. A late copy appended to the
    input (a producer's retry, a resubmission) is dropped as a repeat, as an absent member's
    late record is: republished alone, it told that its member answered the wave (a probe saw
    20 of 20 present members' late copies republished, 0 of 20 absent members')."""
    engine, w2, out = _nine_over_two_waves({4, 7})
    first = {r.record_id: r.value for r in out}
    wave2 = {rid for rid, value in first.items() if orjson.loads(value)["wave"] == 2}
    assert len(wave2) == 9  # 7 present, 2 imputed
    again = w2[0]
    assert again.source is not None
    late = again._replace(source=again.source._replace(offset=1000))
    res = engine.protect_window([late], now=1e9 + 1, flush_all=True)
    assert res.published == [] and not res.held
    assert res.report.measures["panel_repeats"] == 1.0
    # counted as withheld, not published: consumed = published + withheld + ... still holds
    assert (res.report.published, res.report.withheld) == (0, 1)
    res = engine.protect_window([again], now=1e9 + 2, flush_all=True)
    assert len(res.published) == 3  # its member's record and the two imputed ones
    assert {r.record_id for r in res.published} <= wave2
    assert all(first[r.record_id] == r.value for r in res.published)  # byte for byte


def _published(waves: list[list[ValidRecord]], p: dict[str, Any], together: bool) -> set[bytes]:
    """Every record published when each wave is closed on its own, or (``together``) when all
    of them arrive as a backlog and are decided in one window."""
    engine = Engine(_policy(p["k"], p["slack"], p["retire"]), keyring=KEY, store=MemoryStore())
    if together:
        batches = [([r for wave in waves for r in wave], len(waves))]
    else:
        batches = [(wave, w) for w, wave in enumerate(waves, start=1)]
    out: set[bytes] = set()
    for records, closed in batches:
        marks = InputMarks(closed_through=closed)
        res = engine.protect_window(records, now=100.0 * closed, flush_all=True, marks=marks)
        assert not res.held
        out.update(orjson.dumps([r.record_id, orjson.loads(r.value)]) for r in res.published)
    return out


@given(panels())
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_backlog_of_waves_publishes_what_the_waves_one_by_one_publish(p: dict[str, Any]) -> None:
    """A backlog (or a restart after downtime) decides several waves in one window. An absent
    member's imputed record of wave W carried the answers it gave in a later wave of that
    window, decided before the window's records were published: answers not yet given at W."""
    waves = _waves({**p, "repeat": 0.0})
    assert _published(waves, p, together=True) == _published(waves, p, together=False)


@given(panels())
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_what_a_wave_publishes_does_not_depend_on_the_order_its_records_arrive_in(
    p: dict[str, Any],
) -> None:
    """The stream's partitions interleave differently from one run to the next: a wave decided
    in arrival order formed other cohorts (and published other tuples than the file workflow,
    which decides in key order). Decided in keyed respondent order, the same answers in
    another order and other windows publish the same records, byte for byte."""
    p = {**p, "crash": None, "repeat": 0.0}  # (a repeat's first answer stands: order matters)
    waves = _waves(p)
    published = []
    for order, window in ((1, p["window"]), (-1, max(2, p["window"] // 2))):
        run = Run({**p, "window": window}, MemoryStore())
        for w, records in enumerate(waves, start=1):
            run.feed(records[::order], 100.0 * w)
        run.feed([], 1e9, flush=True)
        published.append(sorted((r.record_id, r.value) for r in run.out))
    assert published[0] == published[1]


def test_small_cohorts_merge_with_each_other_first_when_k_rises() -> None:
    """Cohorts of exactly k under a new k + 1 are all small: merged one at a time into the
    nearest of all cohorts, they piled into a few (cohorts of 10-30 at a new k of 6, in a
    probe: more information loss, for good). Paired with each other first, none ends up
    larger than twice the new k."""
    p = {"k": 2, "slack": 0, "retire": 3, "window": 1000}
    rng = np.random.default_rng(3)
    people = [
        {"age": int(rng.integers(18, 90)), "sex": "FM"[i % 2], "rel": "other", "occ": "a"}
        for i in range(200)
    ]
    run = Run(p, MemoryStore())
    run.feed(
        [ValidRecord(f"r{i}", {**v, "wave": 1}, None, 100.0) for i, v in enumerate(people)], 100.0
    )
    run.feed([], 100.0 + GRACE, flush=True)
    run.p = {**p, "k": 3}
    run.crash()
    run.feed(
        [ValidRecord(f"r{i}", {**v, "wave": 2}, None, 200.0) for i, v in enumerate(people)], 200.0
    )
    run.feed([], 1e9, flush=True)
    sizes: dict[Any, int] = defaultdict(int)
    for rec in run.out:
        row = orjson.loads(rec.value)
        if row["wave"] == 2 and row["age"] is not None:
            sizes[tuple(row[c] for c in CLAIM)] += 1
    assert sum(sizes.values()) == len(people)
    assert min(sizes.values()) >= 3 and max(sizes.values()) <= 6, sorted(sizes.values())
