"""Engines over shards of respondents (gateway.engine.shards): routing, and merged results that keep
every guarantee of one engine."""

from __future__ import annotations

from collections import Counter

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import KEY, DictStore, _policy, _records

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord, WindowResult
from gateway.engine.shards import REPUBLICATION_MEASURES, ShardedEngine, route, shard_of
from gateway.measures.window_risk import window_measures

QI = ("age", "hours")


def _sharded(n: int) -> tuple[ShardedEngine, list[DictStore]]:
    stores = [DictStore() for _ in range(n)]
    engines = [Engine(_policy(), keyring=KEY, store=s, measure_risk=False) for s in stores]
    return ShardedEngine(engines), stores


def _rows(result: WindowResult) -> list[dict[str, object]]:
    return [orjson.loads(p.value) for p in result.published]


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.one_of(st.none(), st.sampled_from([f"r{i}" for i in range(12)])), max_size=40),
    shards=st.integers(1, 6),
)
def test_route_splits_in_order_and_keeps_a_respondent_in_one_shard(
    ids: list[str | None], shards: int
) -> None:
    records = [ValidRecord(rid, {}, SourceRef("in", 0, i), 0.0) for i, rid in enumerate(ids)]
    parts = route(records, shards)
    assert len(parts) == shards
    assert sorted(i for part in parts for i in part) == list(range(len(records)))
    assert all(part == sorted(part) for part in parts)
    shard_of_id: dict[str, int] = {}
    for s, part in enumerate(parts):
        for i in part:
            assert shard_of(records[i], i, shards) == s
            rid = records[i].respondent_id
            if rid is not None:
                assert shard_of_id.setdefault(rid, s) == s


def test_one_shard_gives_what_the_engine_gives() -> None:
    records = _records(1, 200, np.random.default_rng(0))
    plain = Engine(_policy(), keyring=KEY, store=DictStore()).protect_window(records, now=0.0)
    sharded, _ = _sharded(1)
    merged = sharded.protect_window(records, now=0.0)
    assert merged.published == plain.published
    # measured after the merge, from the arrays the shard handed back: the same figures
    assert merged.report == plain.report
    assert merged.report.risk_sampled


def test_sharded_windows_keep_groups_sticky_values_and_state_per_shard() -> None:
    engine, stores = _sharded(3)
    k = _policy().microaggregation.k
    w1 = _records(1, 300, np.random.default_rng(0))
    r1 = engine.protect_window(w1, now=0.0)
    rows1 = _rows(r1)
    assert not r1.held and len(rows1) == 300
    # published in input order
    assert [p.source for p in r1.published] == [r.source for r in w1]
    # every centroid is shared by at least k records, and the report says so
    assert min(Counter((r["age"], r["hours"]) for r in rows1).values()) >= k
    assert r1.report.min_group_size is not None and r1.report.min_group_size >= k
    # a respondent's state is in its shard's store, and only there
    for s, store in enumerate(stores):
        mine = [r.respondent_id or "" for i, r in enumerate(w1) if shard_of(r, i, 3) == s]
        keys = {k for k in store.data if not k.startswith(b"group:")}
        assert keys == set(KEY.respondent_keys(mine))
    # wave 2, same answers: every published value comes back unchanged
    w2 = _records(2, 300, np.random.default_rng(0), offset=1000)
    rows2 = _rows(engine.protect_window(w2, now=1.0))
    published = ("age", "hours", "occ", "pay")
    for a, b in zip(rows1, rows2, strict=True):
        assert [a[n] for n in published] == [b[n] for n in published]


def test_the_merged_report_is_the_windows_own() -> None:
    engine, _ = _sharded(3)
    records = _records(1, 300, np.random.default_rng(1))
    result = engine.protect_window(records, now=0.0)
    rep, rows = result.report, _rows(result)
    assert rep.records_in == 300 and rep.published + rep.held == 300
    # retention recomputed from the published rows: the share of records published as true
    kept = sum(row["occ"] == r.values["occ"] for row, r in zip(rows, records, strict=True))
    assert rep.randomized["occ"] == 300
    assert rep.retention["occ"] == pytest.approx(kept / 300, abs=1e-12)
    # risk and utility over all shards' records, recomputed from true and published values
    true = np.array([[r.values[n] for n in QI] for r in records], dtype=float)
    masked = np.array([[row[n] for n in QI] for row in rows], dtype=float)
    want = window_measures(true, masked, _policy().risk.interval_pct)
    # the numeric measures, recomputed; the whole-key ones merged from the shards' reports
    merged = ("key_", "ldiv_", "sensitive_", *REPUBLICATION_MEASURES)
    assert {k for k in rep.measures if not k.startswith(merged)} == want.keys()
    # unique sensitive combinations: counted within each shard and summed (at least the
    # window's own count: an upper bound)
    combination = [(row["occ"], row["pay"]) for row in rows]
    per_shard = [Counter(combination[i] for i in part) for part in route(records, 3)]
    assert rep.measures["sensitive_records"] == rep.published == 300
    assert rep.measures["sensitive_uniques"] == sum(
        1 for counts in per_shard for c in counts.values() if c == 1
    )
    window_uniques = sum(1 for c in Counter(combination).values() if c == 1)
    assert rep.measures["sensitive_uniques"] >= window_uniques
    assert rep.measures["key_records"] + rep.measures["key_suppressed"] == rep.published
    assert rep.measures["key_smallest_class"] >= 3
    # a first release: every respondent published with a group formed of at least k of them
    assert rep.measures["linked_records"] == rep.published
    assert rep.measures["linked_smallest"] >= 3 and rep.measures["linked_below_k"] == 0
    assert rep.measures["release_smallest_class"] >= 3
    for name, value in want.items():
        assert rep.measures[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


def test_a_shard_waits_for_k_records_of_its_own() -> None:
    # 2 shards, k = 3, 4 records: at most one shard can have 3 of them; the other's wait,
    # and a window that must flush publishes them with quasi-identifiers suppressed
    engine, _ = _sharded(2)
    records = _records(1, 4, np.random.default_rng(0))
    parts = route(records, 2)
    result = engine.protect_window(records, now=0.0)
    small = [i for part in parts if len(part) < 3 for i in part]
    assert sorted(records.index(h) for h in result.held) == small
    flushed = engine.protect_window(list(result.held), now=0.0, flush_all=True)
    assert not flushed.held and all(p.suppressed for p in flushed.published)
    assert flushed.report.suppressed == len(small)
