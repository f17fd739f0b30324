"""Respondents sharded over several engines, each with a state store of its own.

One engine protects one window at a time on one core. Sharding splits every window by
respondent over N engines, which the stream worker runs in N processes
(``stream_jobs.engine_process.engine_process.EngineShards``), and merges their results into the one
result the unsharded engine would give in form: published records in input order, one report, the
window's risk measured over all its microaggregated records.

A respondent always lands in the same shard (:func:`shard_of`: a stable hash of the respondent
id; a record without one by its record id), so its stored values, its current group and that
group's live-member count all live in one store, and the sticky guarantees hold per shard
exactly as they hold for one engine. What changes:

* microaggregation groups form among a shard's own records (about 1/N of a window): a shard
  needs k new quasi-identifier tuples of its own before it forms a group, so records wait up
  to N times longer on a slow stream, and groups are drawn from a smaller pool (information
  loss is measured per window as before);
* the shard count is fixed for the life of a state directory, since respondents' state is
  where their hash put it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from gateway.engine.engine import Engine
from gateway.engine.records import (
    NO_MARKS,
    InputMarks,
    PublishedRecord,
    ValidRecord,
    WindowReport,
    WindowResult,
    window_id,
)
from gateway.keyed.draw_derivation import DrawsHolder, ShardDraws, settle
from gateway.measures.window_risk import window_measures

__all__ = ["MAX_SHARDS", "ShardedEngine", "merge", "route", "shard_of"]

MAX_SHARDS = 64  # a process and a state file each


def shard_of(record: ValidRecord, index: int, shards: int) -> int:
    """The shard of a record: by respondent id, else by record id (position in the window for
    a record without a source). CRC-32 is stable across processes and Python versions (the
    built-in ``hash`` of a str is salted per process) and only balances load: nothing derived
    from it is published or stored."""
    if shards == 1:
        return 0
    rid = record.respondent_id
    if rid is None:
        rid = record.source.record_id if record.source is not None else str(index)
    return zlib.crc32(rid.encode()) % shards


def route(records: Sequence[ValidRecord], shards: int) -> list[list[int]]:
    """The indices of ``records`` that go to each shard, in input order."""
    parts: list[list[int]] = [[] for _ in range(shards)]
    for i, r in enumerate(records):
        parts[shard_of(r, i, shards)].append(i)
    return parts


def merge(
    records: Sequence[ValidRecord],
    parts: Sequence[Sequence[int]],
    results: Sequence[WindowResult],
    *,
    interval_pct: float,
) -> WindowResult:
    """One window's result from its shards' results (shard s protected
    ``[records[i] for i in parts[s]]``).

    Published records come back in input order: each engine publishes its records in its input
    order less those it holds, so the shards' lists are interleaved by the window's order."""
    shard = [0] * len(records)
    for s, idx in enumerate(parts):
        for i in idx:
            shard[i] = s
    held_ids = {id(h) for res in results for h in res.held}
    if any(res.report.imputed for res in results):  # a panel's: one shard's records after another
        return _concatenated(records, results, held_ids, interval_pct=interval_pct)
    cursors = [iter(res.published) for res in results]
    row_cursors = [iter(res.rows) for res in results]
    with_rows = all(len(res.rows) == len(res.published) for res in results)
    published: list[PublishedRecord] = []
    rows = []
    for i, r in enumerate(records):
        if id(r) in held_ids:
            continue
        rec = next(cursors[shard[i]], None)
        if rec is None:
            raise ValueError(f"shard {shard[i]} neither published nor held one of its records")
        published.append(rec)
        if with_rows:
            rows.append(next(row_cursors[shard[i]]))
    if any(next(c, None) is not None for c in cursors):
        raise ValueError("a shard published more records than it was given")
    held = [h for res in results for h in res.held]
    if len(held) > 1:  # mostly none: the window's order is built only to sort some
        order = {id(r): i for i, r in enumerate(records)}
        held.sort(key=lambda h: order[id(h)])
    reports = [res.report for res in results]
    sampled = [res.aggregated for res in results if res.aggregated is not None]
    measures: dict[str, float] = {}
    if sampled:
        both = (np.vstack([a for a, _ in sampled]), np.vstack([m for _, m in sampled]))
        measures = window_measures(*both, interval_pct)
    measures.update(merge_key_measures([r.measures for r in reports]))
    measures.update(merge_sensitive_measures([r.measures for r in reports]))
    measures.update(merge_republication_measures([r.measures for r in reports]))
    return WindowResult(
        published=published,
        held=held,
        report=_merge_reports(window_id(records), reports, measures),
        rows=rows,
    )


def _concatenated(
    records: Sequence[ValidRecord],
    results: Sequence[WindowResult],
    held_ids: set[int],
    *,
    interval_pct: float,
) -> WindowResult:
    """A panel window's shards' results one after another: their published records stand for
    respondents, present or imputed, not for the window's records one by one."""
    del held_ids, interval_pct
    reports = [res.report for res in results]
    measures: dict[str, float] = {}
    measures.update(merge_republication_measures([r.measures for r in reports]))
    return WindowResult(
        published=[rec for res in results for rec in res.published],
        held=[h for res in results for h in res.held],
        report=_merge_reports(window_id(records), reports, measures),
        rows=[row for res in results for row in res.rows],
    )


_KEY_SUMS = ("key_records", "key_suppressed", "key_unknown_class", "key_uniques")


def merge_key_measures(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The whole-key measures of a window from its shards' (each shard's groups are its
    own, so the smallest class and the l-diversity are minima, shares weighted by records)."""
    parts = [p for p in parts if "key_records" in p]
    if not parts:
        return {}
    out = {name: sum(p.get(name, 0.0) for p in parts) for name in _KEY_SUMS}
    smallest = [p["key_smallest_class"] for p in parts if "key_smallest_class" in p]
    if smallest:
        out["key_smallest_class"] = min(smallest)
        below = sum(p.get("key_share_below_k", 0.0) * p["key_records"] for p in parts)
        out["key_share_below_k"] = below / out["key_records"]
    expected = [p["key_expected_reidentifications"] for p in parts if "key_smallest_class" in p]
    if expected:  # Σ 1/fk over the shards' records (their classes are their own)
        out["key_expected_reidentifications"] = sum(expected)
        out["key_global_risk"] = sum(expected) / out["key_records"]
    for name in {n for p in parts for n in p if n.startswith("ldiv_min:")}:
        out[name] = min(p[name] for p in parts if name in p)
    return out


def merge_sensitive_measures(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Unique sensitive combinations of a window from its shards': the sum of the shards'
    uniques, an upper bound (a combination repeated within a shard is repeated in the window;
    one unique in two shards is counted twice though repeated)."""
    parts = [p for p in parts if "sensitive_records" in p]
    if not parts:
        return {}
    return {n: sum(p[n] for p in parts) for n in ("sensitive_records", "sensitive_uniques")}


REPUBLICATION_MEASURES: dict[str, Callable[[Iterable[float]], float]] = {
    "linked_records": sum,
    "linked_below_k": sum,
    "linked_smallest": min,
    "linked_promised": min,
    "stale_records": sum,
    "stale_age_max": max,
    "release_smallest_class": min,
}


def merge_republication_measures(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The republication measures of a window from its shards' (linked candidate sets and
    classes never span shards: counts add up, smallest sets are minima)."""
    out: dict[str, float] = {}
    for name, combine in REPUBLICATION_MEASURES.items():
        values = [p[name] for p in parts if name in p]
        if values:
            out[name] = float(combine(values))
    return out


def _merge_reports(
    wid: str, reports: Sequence[WindowReport], measures: dict[str, float]
) -> WindowReport:
    sizes = [r.min_group_size for r in reports if r.min_group_size is not None]
    randomized: dict[str, int] = {}
    kept: dict[str, float] = {}
    for r in reports:
        for name, n in r.randomized.items():
            randomized[name] = randomized.get(name, 0) + n
            kept[name] = kept.get(name, 0.0) + r.retention[name] * n
    return WindowReport(
        window_id=wid,
        records_in=sum(r.records_in for r in reports),
        published=sum(r.published for r in reports),
        held=sum(r.held for r in reports),
        suppressed=sum(r.suppressed for r in reports),
        min_group_size=min(sizes) if sizes else None,
        groups=sum(r.groups for r in reports),
        sticky_hits=sum(r.sticky_hits for r in reports),
        deferred_moves=sum(r.deferred_moves for r in reports),
        risk_sampled=any(r.risk_sampled for r in reports),
        measures=measures,
        retention={name: kept[name] / n for name, n in randomized.items()},
        randomized=randomized,
        imputed=sum(r.imputed for r in reports),
        withheld=sum(r.withheld for r in reports),
        # each shard draws at its own values' sd: one sd only where the shards agree (or one)
        noise_sd={
            name: sd
            for name, sd in reports[0].noise_sd.items()
            if all(r.noise_sd.get(name) == sd for r in reports)
        }
        if reports
        else {},
    )


class ShardedEngine(ShardDraws):
    """Engines over shards of respondents, called one after the other in this process: the
    same results as ``EngineShards`` runs in processes (the thread engine on a sharded state
    directory, the file workflow, tests). Build the engines with ``measure_risk=False``."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("ShardedEngine needs at least one engine")
        versions = {e.version for e in engines}
        if len(versions) != 1:
            raise ValueError(f"shards run different policy versions: {sorted(versions)}")
        self.engines = list(engines)
        self.version = engines[0].version
        self._interval_pct = engines[0].policy.risk.interval_pct
        settle(self.engines, None, where="the engine shards")  # one derivation for all

    def _draw_shards(self) -> Sequence[DrawsHolder]:
        return self.engines

    def metadata(self) -> dict[str, object]:
        return self.engines[0].metadata()

    def protect_window(
        self,
        records: Sequence[ValidRecord],
        *,
        now: float,
        flush_all: bool = False,
        marks: InputMarks = NO_MARKS,
    ) -> WindowResult:
        parts = route(records, len(self.engines))
        results = [
            engine.protect_window(
                [records[i] for i in idx],
                now=now,
                flush_all=flush_all,
                marks=marks,
            )
            for engine, idx in zip(self.engines, parts, strict=True)
        ]
        return merge(records, parts, results, interval_pct=self._interval_pct)
