"""recode_suppress in the stream (gateway/grouping/recode_stream.py): recoded keys suppressed to
exact-tuple k per wave, sticky suppressed cells, late records, replays."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.engine.engine import Engine
from gateway.engine.records import PublishedRecord, SourceRef, ValidRecord
from gateway.grouping.exact_suppression import suppress_exact
from gateway.grouping.recode_suppress import interval_label
from gateway.keyed.keyed import Keyring
from gateway.policy import policy_from_yaml
from state.memory_store import MemoryStore

KEY = Keyring(b"recode-stream-panel-secret-01234")
CLAIM = ("age", "sex", "rel", "region")
BINS = [30.0, 50.0, 70.0]
POLICY = """
input: {respondent_id: rid}
window: {max_records: 1000, max_seconds: 1, max_hold_seconds: HOLD, on_hold_timeout: suppress}
microaggregation: {k: K, algorithm: recode_suppress, importance: [sex, age, rel, region]}
republication: {wave_attribute: wave, pool: release}
attributes:
  age: {role: quasi_identifier, type: numeric, method: microaggregation, bins: [30, 50, 70]}
  sex: {role: quasi_identifier, type: categorical, method: microaggregation, categories: [F, M]}
  rel: {role: quasi_identifier, type: categorical, method: microaggregation,
        categories: [husband, wife, other]}
  region: {role: quasi_identifier, type: categorical, method: microaggregation,
           categories: [a, b, c, d, e, f]}
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [x, y, z]
    rr: {mode: uniform, retention: 0.6}
  wave: {role: other, type: numeric, method: keep}
"""


def policy(k: int, hold: float = 1e6) -> Any:
    return policy_from_yaml(POLICY.replace("HOLD", str(hold)).replace("K", str(k)))


def recoded(values: dict[str, Any]) -> tuple[str | None, ...]:
    return (interval_label(values["age"], BINS), values["sex"], values["rel"], values["region"])


@st.composite
def panels(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "k": draw(st.integers(2, 4)),
        "n": draw(st.integers(3, 50)),
        "waves": draw(st.integers(1, 4)),
        "skip": draw(st.sampled_from([0.0, 0.2])),
        "change": draw(st.sampled_from([0.0, 0.1, 0.4])),
        "late": draw(st.sampled_from([0.0, 0.1, 0.3])),  # share sent after the next wave's
        "repeat": draw(st.sampled_from([0.0, 0.1])),  # sent twice in its wave
        "window": draw(st.integers(3, 60)),
        "seed": draw(st.integers(0, 2**31)),
    }


def panel(p: dict[str, Any]) -> list[ValidRecord]:
    """The records in arrival order: waves in turn, some of a wave's records after the next
    wave's first ones (late), some twice, respondents changing and skipping waves."""
    rng = np.random.default_rng(p["seed"])
    truth = [
        {
            "age": int(rng.integers(18, 90)),
            "sex": str(rng.choice(["F", "M"])),
            "rel": str(rng.choice(["husband", "wife", "other"])),
            "region": str(rng.choice(list("abcdef"), p=[0.4, 0.3, 0.1, 0.1, 0.05, 0.05])),
            "occ": str(rng.choice(list("xyz"))),
        }
        for _ in range(p["n"])
    ]
    waves: list[list[tuple[str, dict[str, Any]]]] = []
    for w in range(1, p["waves"] + 1):
        for v in truth:
            if w > 1 and rng.random() < p["change"]:
                field = str(rng.choice(["age", "region", "rel"]))
                v[field] = (
                    int(rng.integers(18, 90))
                    if field == "age"
                    else str(rng.choice(list("abcdef") if field == "region" else ["wife", "other"]))
                )
        present = [i for i in rng.permutation(p["n"]).tolist() if rng.random() >= p["skip"]]
        records = [(f"r{i}", {**truth[i], "wave": w}) for i in present]
        records += [r for r in records if rng.random() < p["repeat"]]
        waves.append(records)
    order: list[tuple[str, dict[str, Any]]] = []
    late: list[tuple[str, dict[str, Any]]] = []
    for records in waves:
        cut = rng.random(len(records)) < p["late"]
        on_time = [r for r, c in zip(records, cut, strict=True) if not c]
        order += on_time[:1] + late + on_time[1:]  # last wave's late ones after this one began
        late = [r for r, c in zip(records, cut, strict=True) if c]
    order += late
    return [ValidRecord(rid, v, SourceRef("in", 0, at), 0.0) for at, (rid, v) in enumerate(order)]


def decided(published: list[PublishedRecord]) -> list[PublishedRecord]:
    """A window's records in the order the engine decided them: wave by wave (a window can
    decide a late record of one wave and the next wave; the later wave is the later
    publication), in window order within a wave."""
    return sorted(published, key=lambda r: orjson.loads(r.value)["wave"])


def run(engine: Engine, stream: list[ValidRecord], window: int) -> list[PublishedRecord]:
    out: list[PublishedRecord] = []
    held: list[ValidRecord] = []
    at = 0
    while at < len(stream) or held:
        batch = stream[at : at + window]
        at += len(batch)
        res = engine.protect_window(held + batch, now=0.0, flush_all=at >= len(stream))
        held = list(res.held)
        out += decided(res.published)
    return out


def check_exact_k(p: dict[str, Any], stream: list[ValidRecord], out: list[PublishedRecord]) -> None:
    """Every published exact tuple (a missing cell a value of its own) has ≥ k respondents in
    its release; no published value is wrong; an unchanged respondent's suppressed cells stay."""
    by_id = {r.source.record_id: r for r in stream if r.source is not None}
    classes: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    last: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
    for rec in out:
        row, src = orjson.loads(rec.value), by_id[rec.record_id]
        shown, truth = tuple(row[c] for c in CLAIM), recoded(dict(src.values))
        assert all(s is None or s == t for s, t in zip(shown, truth, strict=True))
        if rec.suppressed:  # withheld: no key value at all
            assert shown == (None,) * len(CLAIM)
            continue
        rid = str(src.respondent_id)
        classes[row["wave"], shown].add(rid)
        before = last.get(rid)
        if before is not None and before[0] == truth:
            again = [c for c, b, s in zip(CLAIM, before[1], shown, strict=True) if b is None and s]
            assert not again, f"{rid}: suppressed {again} published again, unchanged"
        last[rid] = (truth, shown)
    small = {key: len(m) for key, m in classes.items() if len(m) < p["k"]}
    assert not small, f"exact classes below k in a release: {small}"


@given(panels())
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_panels_publish_exact_k_per_release_and_keep_suppressed_cells(
    p: dict[str, Any],
) -> None:
    stream = panel(p)
    out = run(Engine(policy(p["k"]), keyring=KEY, store=MemoryStore()), stream, p["window"])
    assert sorted(r.record_id for r in out) == sorted(
        r.source.record_id for r in stream if r.source is not None
    )  # every record published once (late ones after the hold time: withheld)
    check_exact_k(p, stream, out)


def test_late_records_join_their_wave_and_unchanged_ones_stay_suppressed() -> None:
    """A wave decided, then: a late unchanged respondent joins its stored class; a late new one
    the class of its tuple under the fewest suppressions; one that fits no class waits, then
    is withheld."""
    wave1 = [
        {"age": 35, "sex": "F", "rel": "wife", "region": r}
        for r in ("a", "a", "a", "b", "b", "b", "c", "d", "e")
    ]
    stream = [
        ValidRecord(f"r{i}", {**v, "wave": 1}, SourceRef("in", 0, i), 0.0)
        for i, v in enumerate(wave1)
    ]
    engine = Engine(policy(3, hold=10), keyring=KEY, store=MemoryStore())
    first = engine.protect_window(stream, now=0.0, flush_all=True)
    rows = {r.record_id: orjson.loads(r.value) for r in first.published}
    # c, d and e alone: their region (the least important key) suppressed, a class of 3
    assert [rows[f"in/0/{i}"]["region"] for i in (0, 3, 6, 7, 8)] == ["a", "b", None, None, None]
    assert rows["in/0/6"]["rel"] == "wife"
    late = [
        ValidRecord("r6", {**wave1[6], "wave": 1}, SourceRef("in", 0, 10), 0.0),  # again
        ValidRecord("n1", {**wave1[0], "wave": 1}, SourceRef("in", 0, 11), 0.0),  # new, fits
        ValidRecord("n2", {**wave1[0], "sex": "M", "wave": 1}, SourceRef("in", 0, 12), 0.0),
        # k respondents of wave 2 close wave 1 (fewer would not: a mistyped wave number)
        *(
            ValidRecord(f"n{i}", {**wave1[0], "wave": 2}, SourceRef("in", 0, 10 + i), 0.0)
            for i in (3, 4, 5)
        ),
    ]
    res = engine.protect_window(late, now=1.0)
    got = {r.record_id: orjson.loads(r.value) for r in res.published}
    assert got["in/0/10"]["region"] is None  # r6, unchanged: its suppressed cell stays
    assert got["in/0/11"]["region"] == "a"  # joins (35, F, wife, a) without suppression
    # wave 2 waits
    assert sorted(r.respondent_id or "" for r in res.held) == ["n2", "n3", "n4", "n5"]
    last = engine.protect_window(list(res.held), now=20.0)  # past the hold time
    # n2 fits no class; wave 2's three share their tuple
    assert {r.record_id: r.suppressed for r in last.published} == {
        "in/0/12": True,
        "in/0/13": False,
        "in/0/14": False,
        "in/0/15": False,
    }
    check_exact_k({"k": 3}, stream + late, [*first.published, *res.published, *last.published])


def test_deciding_a_wave_again_against_its_state_publishes_the_same() -> None:
    """A replay: the wave decided and its state written, the outputs lost; a new engine on
    that state decides the same records again (among later ones) and publishes the same."""
    p = {"k": 3, "n": 40, "waves": 3, "skip": 0.2, "change": 0.3, "late": 0.0, "repeat": 0.0}
    stream = panel({**p, "window": 0, "seed": 7})
    store = MemoryStore()
    pol = policy(3)
    first = run(Engine(pol, keyring=KEY, store=store), stream, 25)
    again = run(Engine(pol, keyring=KEY, store=store), stream, 17)
    assert sorted((r.record_id, r.value) for r in again) == sorted(
        (r.record_id, r.value) for r in first
    )
    check_exact_k(p, stream, first)


def test_exact_suppression_from_sticky_masks_suppresses_nothing_more() -> None:
    """Starting from masks that already give every class k, nothing more is suppressed."""
    rows = [("a", "x"), ("a", "x"), ("a", "y"), ("b", "y"), ("b", "y"), ("c", "z")]
    who = list(range(len(rows)))
    first = suppress_exact(rows, [0] * 6, who, k=2, order=[1, 0])
    assert first.withheld == []
    again = suppress_exact(rows, first.masks, who, k=2, order=[1, 0])
    assert again.masks == first.masks


def test_reports_count_suppressed_cells_per_attribute_and_no_class_below_k() -> None:
    """Each window's measures: suppressed cells per key (as many as the output shows), the
    whole-key figures at 0 records below k; the metadata names the method and the keys."""
    p = {"k": 3, "n": 60, "waves": 3, "skip": 0.1, "change": 0.2, "late": 0.2, "repeat": 0.0}
    stream = panel({**p, "window": 0, "seed": 11})
    by_id = {r.source.record_id: r for r in stream if r.source is not None}
    engine = Engine(policy(3), keyring=KEY, store=MemoryStore())
    counted = dict.fromkeys(CLAIM, 0.0)
    shown = dict.fromkeys(CLAIM, 0)
    held: list[ValidRecord] = []
    at = 0
    while at < len(stream) or held:
        batch = stream[at : at + 20]
        at += len(batch)
        res = engine.protect_window(held + batch, now=0.0, flush_all=at >= len(stream))
        held = list(res.held)
        m = res.report.measures
        if res.published and m.get("key_records"):
            assert m["key_share_below_k"] == 0 and m["key_smallest_class"] >= 3
        for name in CLAIM:
            counted[name] += m.get(f"suppressed_cells:{name}", 0.0)
        for rec in res.published:
            row = orjson.loads(rec.value)
            if not rec.suppressed:
                truth = recoded(dict(by_id[rec.record_id].values))
                for name, t in zip(CLAIM, truth, strict=True):
                    shown[name] += row[name] is None and t is not None
    assert counted == {n: float(c) for n, c in shown.items()}
    assert counted["region"] > 0  # the panel needed suppression
    meta = engine.metadata()
    assert meta["recode_suppress"]["keys"] == list(CLAIM)
    assert meta["recode_suppress"]["suppressed_first"] == ["region", "rel", "age", "sex"]
    assert meta["republication"]["mode"] == "recode_suppress"


@given(panels(), st.lists(st.integers(1, 12), min_size=1, max_size=3))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_replays_after_crashes_publish_what_was_published(
    p: dict[str, Any], crashes: list[int]
) -> None:
    """The worker's commit rule (tests/gateway/test_republication_replay.py): a window's
    offsets are committed once the next window's state is written, never past a held record;
    a crash loses the last two windows' outputs. Every replayed record publishes its first
    copy again, and exact k per release holds over the first copies."""
    stream, store, pol = panel(p), MemoryStore(), policy(p["k"])
    first: dict[str, PublishedRecord] = {}
    start = 0
    while True:
        engine = Engine(pol, keyring=KEY, store=store)
        held: list[ValidRecord] = []
        pending: tuple[list[PublishedRecord], int] = ([], start)
        at, windows = start, 0
        crash = crashes.pop(0) if crashes else None
        while at < len(stream) or held:
            batch = stream[at : at + p["window"]]
            at += len(batch)
            res = engine.protect_window(held + batch, now=0.0, flush_all=at >= len(stream))
            held, windows = list(res.held), windows + 1
            if crash is not None and windows == crash:
                break  # this window's state written, its outputs and the one's before lost
            outputs, start = pending
            for rec in outputs:
                assert first.setdefault(rec.record_id, rec).value == rec.value, "replay differs"
            oldest = min((r.source.offset for r in held if r.source is not None), default=at)
            pending = (decided(res.published), oldest)
        else:
            for rec in pending[0]:
                assert first.setdefault(rec.record_id, rec).value == rec.value
            break
    assert len(first) == len(stream)
    check_exact_k(p, stream, list(first.values()))


def test_partition_scope_keeps_each_partitions_classes_and_registry_apart() -> None:
    """With state that follows its partition, a wave is decided per state partition: every
    class of each partition has k, and its registry entries name the partition."""
    p = {"k": 3, "n": 60, "waves": 3, "skip": 0.1, "change": 0.2, "late": 0.1, "repeat": 0.0}
    stream = [
        r._replace(source=SourceRef("in", int(str(r.respondent_id)[1:]) % 2, r.source.offset))
        for r in panel({**p, "window": 0, "seed": 5})
        if r.source is not None
    ]
    store = MemoryStore()
    out = run(Engine(policy(3), keyring=KEY, store=store, partition_scope=True), stream, 20)
    check_exact_k(p, stream, out)
    registry = [key for key, _ in store.items() if key.startswith(b"group:")]
    assert registry and all(key.split(b".")[0] in (b"group:0", b"group:1") for key in registry)


def test_a_late_record_of_an_older_wave_does_not_reset_what_was_suppressed_since() -> None:
    """r answers wave 3 with region c (suppressed: alone), then its wave-2 record arrives late
    with other values and is published; in wave 4 r gives its wave-3 answer again, beside two
    new respondents of region c: it still publishes the region suppressed."""

    def rec(rid: str, wave: int, at: int, region: str, rel: str = "wife") -> ValidRecord:
        values = {"age": 35, "sex": "F", "rel": rel, "region": region, "occ": "x", "wave": wave}
        return ValidRecord(rid, values, SourceRef("in", 0, at), 0.0)

    wave2 = [rec(f"x{j}", 2, j, "a", "other") for j in range(3)]
    wave3 = [rec(r, 3, 3 + j, g) for j, (r, g) in enumerate(zip("rstabc", "cdeaaa", strict=True))]
    engine = Engine(policy(3), keyring=KEY, store=MemoryStore())
    out = list(engine.protect_window([*wave2, *wave3], now=0.0).published)  # wave 2 decided
    res = engine.protect_window([*wave3, rec("u", 4, 9, "c")], now=0.0)  # wave 3 decided
    out += res.published
    res = engine.protect_window([*res.held, rec("r", 2, 10, "a", "other")], now=0.0)  # late
    out += res.published
    assert [orjson.loads(p.value)["region"] for p in res.published] == ["a"]  # joins x0..x2
    wave4 = [
        rec(r, 4, 11 + j, g) for j, (r, g) in enumerate(zip("rstabcv", "cdeaaac", strict=True))
    ]
    out += engine.protect_window([*res.held, *wave4], now=0.0, flush_all=True).published
    rows = {p.record_id: orjson.loads(p.value) for p in out}
    assert rows["in/0/3"]["region"] is None  # r in wave 3: alone with c
    # r in wave 4, unchanged since wave 3: its region stays suppressed (started afresh, it
    # would form a class of c with u and v), so u and v lose theirs too
    assert [rows[f"in/0/{i}"]["region"] for i in (11, 9, 17)] == [None, None, None]
