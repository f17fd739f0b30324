"""The window engine: stateless file runs, and sticky republication with keyed randomness."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import orjson
import pytest

from gateway.engine.engine import Engine
from gateway.engine.keyed_inputs import KeyedInputs
from gateway.engine.records import SourceRef, ValidRecord, encode_rows
from gateway.errors import PolicyError
from gateway.keyed.keyed import Keyring
from gateway.keyed.randomness import SeededSource
from gateway.policy import Policy, policy_from_yaml
from gateway.state_store.state_codec import decode_state

POLICY = """
input: {respondent_id: rid}
window: {max_records: 1000, max_seconds: 1, max_hold_seconds: 10, on_hold_timeout: suppress}
microaggregation: {k: 3}
attributes:
  age:   {role: quasi_identifier, type: numeric, method: microaggregation}
  hours: {role: quasi_identifier, type: numeric, method: microaggregation}
  sex:   {role: quasi_identifier, type: categorical, method: microaggregation, categories: [F, M]}
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [a, b, c, d]
    rr: {mode: uniform, retention: 0.5}
  pay:   {role: sensitive, type: numeric, method: noise, noise: {ratio: 0.1}}
  email: {role: identifier, type: categorical, method: drop}
  wave:  {role: other, type: numeric, method: keep, required: false}
"""


class DictStore:
    """In-test StateStore: a dict, so the engine's use of the interface is visible."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.puts = 0

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        return {k: self.data[k] for k in keys if k in self.data}

    def put_many(self, entries: Mapping[bytes, bytes]) -> None:
        self.puts += 1
        self.data.update(entries)

    def count(self) -> int:
        return len(self.data)

    def close(self) -> None:
        pass


def _policy(text: str = POLICY) -> Policy:
    return policy_from_yaml(text)


def _records(wave: int, n: int, rng: np.random.Generator, *, offset: int = 0) -> list[ValidRecord]:
    out = []
    for i in range(n):
        out.append(
            ValidRecord(
                respondent_id=f"r{i}",
                values={
                    "age": int(20 + (i * 7) % 50),
                    "hours": int(10 + (i * 3) % 40),
                    "sex": "F" if i % 2 else "M",
                    "occ": "abcd"[i % 4],
                    "pay": float(1000 + 10 * i),
                    "email": f"user{i}@example.org",
                    "wave": wave,
                },
                source=SourceRef("in", 0, offset + i),
                arrived_at=0.0,
            )
        )
    return out


def _rows(result) -> list[dict]:  # type: ignore[no-untyped-def]
    return [orjson.loads(p.value) for p in result.published]


KEY = Keyring(b"k" * 32)


def test_stateless_window_groups_and_drops() -> None:
    engine = Engine(_policy(), randomness=SeededSource(1))
    res = engine.protect_window(_records(1, 50, np.random.default_rng(0)), now=0.0)
    rows = _rows(res)
    assert len(rows) == 50 and not res.held
    assert all("email" not in r and "rid" not in r for r in rows)
    centroids = defaultdict(int)
    for r in rows:
        centroids[(r["age"], r["hours"])] += 1
    assert min(centroids.values()) >= 3
    assert res.report.min_group_size is not None and 3 <= res.report.min_group_size <= 5
    assert {r["occ"] for r in rows} <= set("abcd")
    assert {"sse_sst_pct", "il1s", "dld", "interval_disclosure"} <= set(res.report.measures)


def test_seeded_runs_are_reproducible() -> None:
    recs = _records(1, 40, np.random.default_rng(0))
    a = Engine(_policy(), randomness=SeededSource(7)).protect_window(recs, now=0.0)
    b = Engine(_policy(), randomness=SeededSource(7)).protect_window(recs, now=0.0)
    assert [p.value for p in a.published] == [p.value for p in b.published]


def test_values_left_as_columns_encode_to_the_same_bytes() -> None:
    """encode=False (the engine process) leaves the output for encode_rows: same bytes, same
    state, and the columns given in place of each record's mapping change nothing."""
    stores = DictStore(), DictStore()
    engines = [Engine(_policy(), keyring=KEY, store=s) for s in stores]
    for wave in (1, 2):
        recs = _records(wave, 40, np.random.default_rng(wave), offset=100 * wave)
        by_attribute = {n: [r.values[n] for r in recs] for n in recs[0].values}
        full = engines[0].protect_window(recs, now=0.0)
        left = engines[1].protect_window(recs, now=0.0, by_attribute=by_attribute, encode=False)
        assert left.output is not None and not left.rows
        assert {p.value for p in left.published} == {b""}
        assert encode_rows(*left.output) == [p.value for p in full.published]
        assert [p.record_id for p in left.published] == [p.record_id for p in full.published]
    assert stores[0].data == stores[1].data


def test_sticky_values_survive_waves_changes_and_reverts() -> None:
    store = DictStore()
    engine = Engine(_policy(), keyring=KEY, store=store)
    w1 = _records(1, 30, np.random.default_rng(0))
    first = {r["record_id"].split("/")[-1]: r for r in _rows(engine.protect_window(w1, now=0.0))}
    # wave 2: same true values, new offsets -> identical published values
    w2 = _records(2, 30, np.random.default_rng(0), offset=100)
    second = _rows(engine.protect_window(w2, now=1.0))
    for i, row in enumerate(second):
        before = first[str(i)]
        assert (row["occ"], row["pay"], row["age"], row["hours"]) == (
            before["occ"],
            before["pay"],
            before["age"],
            before["hours"],
        )
    assert engine.protect_window(w2, now=1.0).report.sticky_hits >= 3 * 30

    # respondent 0 changes occupation a -> b, then reverts to a: the old draw comes back
    def one(occ: str, off: int) -> dict:
        rec = w1[0]
        changed = ValidRecord(
            rec.respondent_id, {**rec.values, "occ": occ}, SourceRef("in", 0, off), 0.0
        )
        # alone in its window (a release of its own) it cannot republish its group's tuple:
        # flushed, it is published with its quasi-identifiers suppressed, randomized as ever
        return _rows(engine.protect_window([changed], now=2.0, flush_all=True))[0]

    assert one("a", 500)["occ"] == first["0"]["occ"]
    one("b", 501)
    assert one("a", 502)["occ"] == first["0"]["occ"]


def test_republishing_unchanged_respondents_writes_only_what_a_replay_needs() -> None:
    store = DictStore()
    engine = Engine(_policy(), keyring=KEY, store=store)
    engine.protect_window(_records(1, 30, np.random.default_rng(0)), now=0.0)
    after_first = dict(store.data)
    assert sum(len(k) == 32 for k in after_first) == 30  # one entry per respondent

    def respondents(data: Mapping[bytes, bytes]) -> dict[bytes, dict]:
        """Each respondent's state without what its records published (``p``, kept for a
        replay after a crash: gateway.grouping.replay)."""
        out = {}
        for key, value in data.items():
            if len(key) == 32:
                state = decode_state(value)
                assert [entry[0] for entry in state.pop("p")][-1].startswith("in/0/")
                out[key] = state
        return out

    engine.protect_window(_records(2, 30, np.random.default_rng(0), offset=100), now=1.0)
    # nothing changed for a respondent: its entry changes only by the record it published (a
    # group's entry records who published its tuple in this release)
    assert respondents(store.data) == respondents(after_first)
    latest = {decode_state(v)["p"][-1][0] for k, v in store.data.items() if len(k) == 32}
    assert latest == {f"in/0/{100 + i}" for i in range(30)}

    # one respondent changes occupation: exactly its entry changes beyond that
    changed = _records(3, 30, np.random.default_rng(0), offset=200)
    rec = changed[4]
    other = "b" if rec.values["occ"] == "a" else "a"
    changed[4] = rec._replace(values={**rec.values, "occ": other})
    engine.protect_window(changed, now=2.0)
    now, first = respondents(store.data), respondents(after_first)
    assert {k for k, v in now.items() if first.get(k) != v} == {KEY.respondent_key("r4")}


def test_keys_computed_apart_protect_as_the_engines_own() -> None:
    # the engine process's parent computes a window's keyed digests while the child is busy:
    # an engine given them must publish and store exactly what it does computing them itself
    own, given = DictStore(), DictStore()
    inputs = KeyedInputs(_policy(), KEY)
    engines = Engine(_policy(), keyring=KEY, store=own), Engine(_policy(), keyring=KEY, store=given)
    for wave in (1, 2, 3):
        window = _records(wave, 30, np.random.default_rng(wave), offset=100 * wave)
        if wave == 2:  # changed values: fresh draws and a new group
            window[:6] = [
                r._replace(values={**r.values, "occ": "d", "age": 70}) for r in window[:6]
            ]
        a = engines[0].protect_window(window, now=float(wave))
        b = engines[1].protect_window(window, now=float(wave), keys=inputs.of(window))
        assert _rows(a) == _rows(b) and len(a.published) > 0
        assert (a.report.sticky_hits > 0) is (wave > 1)
    assert own.data == given.data
    # the given keys are the ones used: another secret's bind other draws and state keys
    other = KeyedInputs(_policy(), Keyring(b"o" * 32))
    fresh = DictStore()
    window = _records(1, 30, np.random.default_rng(1), offset=100)
    mine = Engine(_policy(), keyring=KEY, store=DictStore()).protect_window(window, now=1.0)
    theirs = Engine(_policy(), keyring=KEY, store=fresh).protect_window(
        window, now=1.0, keys=other.of(window)
    )
    assert [r["pay"] for r in _rows(mine)] != [r["pay"] for r in _rows(theirs)]
    assert KEY.respondent_key("r0") not in fresh.data
    with pytest.raises(ValueError, match="keys for 29 records given with a window of 30"):
        engines[1].protect_window(window, now=4.0, keys=inputs.of(window[1:]))


def test_a_full_digest_cache_is_refilled_without_losing_the_windows_hits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the value-digest cache is cleared when full; a window mixing cached values (returning
    # respondents) and new ones must still get every digest, and republish the stored values
    store = DictStore()
    engine = Engine(_policy(), keyring=KEY, store=store)
    first = _rows(engine.protect_window(_records(1, 30, np.random.default_rng(0)), now=0.0))
    monkeypatch.setattr("gateway.engine.keyed_inputs.DIGEST_CACHE_LIMIT", 32)  # 30 tuples cached
    returning = _records(2, 30, np.random.default_rng(0), offset=100)
    newcomers = [
        r._replace(respondent_id=f"new{i}", values={**r.values, "age": 90 + i})
        for i, r in enumerate(_records(2, 6, np.random.default_rng(0), offset=200))
    ]
    again = _rows(engine.protect_window(returning + newcomers, now=1.0))
    for before, after in zip(first, again[:30], strict=True):
        assert (after["age"], after["hours"], after["occ"], after["pay"]) == (
            before["age"],
            before["hours"],
            before["occ"],
            before["pay"],
        )


def test_hmac_pseudonym_is_published_and_keys_the_output_record() -> None:
    engine = Engine(_policy("output: {pseudonym: hmac}\n" + POLICY), keyring=KEY)
    res = engine.protect_window(_records(1, 12, np.random.default_rng(0)), now=0.0)
    assert len(res.published) == 12
    for rec, row in zip(res.published, _rows(res), strict=True):
        rid = f"r{int(rec.record_id.rpartition('/')[2])}"
        assert row["pseudonym"] == KEY.pseudonym(rid) != rid
        assert rec.key == row["pseudonym"].encode()


def test_matrix_change_keeps_published_values() -> None:
    store = DictStore()
    recs = _records(1, 40, np.random.default_rng(0))
    before = _rows(Engine(_policy(), keyring=KEY, store=store).protect_window(recs, now=0.0))
    stronger = _policy(POLICY.replace("retention: 0.5", "retention: 0.3"))
    after = _rows(Engine(stronger, keyring=KEY, store=store).protect_window(recs, now=0.0))
    assert [r["occ"] for r in before] == [r["occ"] for r in after]


def test_keyed_draws_replay_without_state() -> None:
    recs = _records(1, 40, np.random.default_rng(0))
    a = _rows(Engine(_policy(), keyring=KEY, store=DictStore()).protect_window(recs, now=0.0))
    b = _rows(Engine(_policy(), keyring=KEY, store=DictStore()).protect_window(recs, now=0.0))
    assert [r["occ"] for r in a] == [r["occ"] for r in b]
    other = _rows(
        Engine(_policy(), keyring=Keyring(b"z" * 32), store=DictStore()).protect_window(
            recs, now=0.0
        )
    )
    assert [r["occ"] for r in a] != [r["occ"] for r in other]


def test_fewer_than_k_new_records_are_held_then_suppressed() -> None:
    store = DictStore()
    engine = Engine(_policy(), keyring=KEY, store=store)
    recs = _records(1, 2, np.random.default_rng(0))
    res = engine.protect_window(recs, now=5.0)
    assert not res.published and len(res.held) == 2
    assert store.count() == 0  # nothing published, nothing stored
    res = engine.protect_window(list(res.held), now=10.0)  # waited max_hold_seconds
    rows = _rows(res)
    assert len(rows) == 2 and res.report.suppressed == 2
    assert all(r["age"] is None and r["hours"] is None and r["sex"] is None for r in rows)
    assert all(r["occ"] in set("abcd") for r in rows)


def test_held_records_join_later_arrivals_into_groups() -> None:
    engine = Engine(_policy(), keyring=KEY, store=DictStore())
    recs = _records(1, 5, np.random.default_rng(0))
    res = engine.protect_window(recs[:2], now=0.0)
    res = engine.protect_window([*res.held, *recs[2:]], now=1.0)
    assert len(res.published) == 5 and not res.held
    assert res.report.min_group_size is not None and res.report.min_group_size >= 3


def test_every_centroid_is_shared_by_k_respondents_over_history() -> None:
    store = DictStore()
    engine = Engine(_policy(), keyring=KEY, store=store)
    rng = np.random.default_rng(3)
    base = _records(1, 60, rng)
    respondent_of = {f"in/0/{w * 1000 + i}": f"r{i}" for w in range(1, 8) for i in range(60)}
    members: dict[tuple[float, float], set[str]] = defaultdict(set)
    held: list[ValidRecord] = []
    for wave in range(1, 8):
        recs = []
        for i, r in enumerate(base):
            vals = dict(r.values)
            vals["wave"] = wave
            if rng.random() < 0.1:  # 10% change a quasi-identifier this wave
                vals["age"] = int(rng.integers(18, 90))
                base[i] = ValidRecord(r.respondent_id, vals, r.source, 0.0)
            recs.append(
                ValidRecord(r.respondent_id, vals, SourceRef("in", 0, wave * 1000 + i), float(wave))
            )
        res = engine.protect_window([*held, *recs], now=float(wave))
        held = list(res.held)
        for row in _rows(res):
            if row["age"] is not None:
                members[(row["age"], row["hours"])].add(respondent_of[row["record_id"]])
    assert min(len(m) for m in members.values()) >= 3


def test_consistency_none_runs_as_one_release_only() -> None:
    """A republishing engine refuses fresh randomness every release and names the setting that
    fixes it (an earlier message named a flag no command had); a file, one release, runs it."""
    text = POLICY + "consistency: {mode: none}\n"
    with pytest.raises(PolicyError, match=r"set consistency: \{mode: sticky\}"):
        Engine(_policy(text), keyring=KEY)
    Engine(_policy(text), keyring=KEY, consistency_override=True)


def test_metadata_carries_what_analysts_need() -> None:
    meta = Engine(_policy(), randomness=SeededSource(0)).metadata()
    rr = meta["randomized_response"]["occ"]  # type: ignore[index]
    assert meta["k"] == 3 and rr["categories"] == ["a", "b", "c", "d"]
    assert abs(rr["epsilon"] - np.log(0.5 * 3 / 0.5)) < 1e-12  # OpenDP: ln(p(t-1)/(1-p))
    orjson.dumps(meta)


def test_several_waves_of_one_respondent_in_one_window_count_once_towards_k() -> None:
    """A window can hold a respondent's wave 1 and a changed wave 2 (a fast producer, a slow
    flush). Two slots of one respondent must never fill one group: the second tuple waits."""
    engine = Engine(_policy(), keyring=KEY, store=DictStore())
    recs = []
    for wave, age_shift in ((1, 0), (2, 1), (3, 1)):  # everyone changes age once, then stays
        for i in range(4):
            vals = {
                "age": 30 + i + age_shift,
                "hours": 40,
                "sex": "F",
                "occ": "a",
                "pay": 1.0,
                "email": "x@example.org",
                "wave": wave,
            }
            recs.append(ValidRecord(f"r{i}", vals, SourceRef("in", 0, wave * 10 + i), 0.0))
    owner = {r.source.record_id: r.respondent_id for r in recs if r.source is not None}
    members: dict[tuple[float, float], set[str]] = defaultdict(set)
    held: list[ValidRecord] = recs
    for step in range(8):  # past max_hold_seconds (10): what cannot join a group is suppressed
        res = engine.protect_window(held, now=2.0 * step)
        held = list(res.held)
        for row in _rows(res):
            if row["age"] is not None:
                members[(row["age"], row["hours"])].add(str(owner[row["record_id"]]))
    assert not held
    assert members and min(len(m) for m in members.values()) >= 3


def _spread(records: list[ValidRecord], partitions: int) -> list[ValidRecord]:
    """The same records, respondent r<i> on input partition i mod ``partitions``."""
    return [
        r._replace(source=SourceRef("in", int(str(r.respondent_id)[1:]) % partitions, k))
        for k, r in enumerate(records)
    ]


def test_partition_scope_keeps_groups_and_state_within_a_partition() -> None:
    """With state that follows input partitions, every state key names its partition and
    every group is formed inside one partition; randomized response is the same draw as
    without partition scope (bound to the respondent, not to where its state lives)."""
    from gateway.state_store.state_keys import state_key_partition  # noqa: PLC0415

    rng = np.random.default_rng(4)
    records = _spread(_records(1, 60, rng), 3)
    scoped_store, plain_store = DictStore(), DictStore()
    scoped = Engine(_policy(), keyring=KEY, store=scoped_store, partition_scope=True)
    plain = Engine(_policy(), keyring=KEY, store=plain_store)
    res = scoped.protect_window(records, now=0.0)
    rows = _rows(res)
    assert len(rows) == 60 and not res.held
    members: dict[str, set[int]] = defaultdict(set)
    for row, rec in zip(rows, records, strict=True):
        assert rec.source is not None
        members[str((row["age"], row["hours"]))].add(rec.source.partition)
    assert all(len(parts) == 1 for parts in members.values()), "a group spans partitions"
    assert (res.report.min_group_size or 0) >= 3
    partitions = {state_key_partition(key) for key in scoped_store.data}
    assert partitions == {0, 1, 2}  # every key routable, respondents and groups alike
    plain_rows = _rows(plain.protect_window(records, now=0.0))
    assert [r["occ"] for r in rows] == [r["occ"] for r in plain_rows]
    assert all(state_key_partition(key) is None for key in plain_store.data)
