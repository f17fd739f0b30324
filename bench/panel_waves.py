"""A panel survey through the engine, wave after wave: every republication mode side by side.

    .venv/bin/python bench/panel_waves.py                       # the panel, all modes
    .venv/bin/python bench/panel_waves.py --scenario attrition  # 30 % skip each wave
    .venv/bin/python bench/panel_waves.py --scenario trickle    # 600 respondents at 4/s
    .venv/bin/python bench/panel_waves.py --modes regroup,cohort --order shuffled
    .venv/bin/python bench/panel_waves.py --unrounded    # noised amounts not rounded

The panel (issue 29): every record of ../shared/data/adult.csv is a respondent present in 6
waves, protected by deploy/policies/adult.yaml in windows of 5,000. Between waves, independently
per respondent: a never-married respondent marries with probability 0.10 (Married-civ-spouse,
Husband or Wife by sex), a married one divorces with 0.03 (Divorced, Not-in-family), hours per
week move by N(0, 8) (rounded, clipped to 1..99) with 0.08, workclass is redrawn from its
marginal with 0.03. ``attrition``: the same with 30 % of respondents skipping each wave.
``trickle``: 600 respondents, 3 waves, 30 % changing, arriving at 4 records/s into windows
closed every 2 s (simulated time), held records suppressed after 30 s.

Modes: the policy's republication modes (``deferred`` is the behaviour before them), ``+sN``
for N slack members, ``@window`` or ``@release`` for the pool new and changed respondents are
grouped in (the policy's otherwise), and ``fresh``: a new whole-key MDAV every wave (an engine
without stored groups; randomized response stays sticky by its keyed draws) — the other
extreme. ``:strata=a+b`` groups within strata of those attributes (``small_strata: suppress``),
``:l=N`` merges groups until each publishes N distinct incomes (issue 31), e.g.
``regroup:strata=race:l=2``.

Per wave and mode it prints: respondents whose quasi-identifiers changed, changers still
publishing their previous tuple, the share of published respondents out of date (their values
changed since the tuple they publish was formed), married and never-married shares true /
published, the smallest class within the release and over the history, the linked candidate
set (smallest, share below k: the intersection attack over all releases so far), SSE/SST of the
numeric quasi-identifiers, the share of categorical quasi-identifier cells published as another
category, suppressed records, the share of the release's records linkable to the previous
release by their published sensitive values alone (``gateway.measures.attack.value_linkage``: a
combination unique in both releases; its precision is printed per mode at the end), and the
engine's µs a record. Engine cost ratios against ``deferred`` are measured in the same run.
``--unrounded`` publishes the noised amounts without the policy's ``round_to``.
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.files.fileio import read_table, records_from_frame
from gateway.keyed.keyed import Keyring
from gateway.measures import quality
from gateway.measures.attack import (
    linked_sets,
    sticky_chain_linkage,
    value_keys,
    value_linkage,
)
from gateway.policy import Method, Policy, RepublicationMode, Role, parse_policy
from state.memory_store import MemoryStore
from stream_jobs.engine_process.memory import tune_memory

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT.parent / "shared" / "data" / "adult.csv"
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"
MARRIED = {"Married-civ-spouse", "Married-AF-spouse", "Married-spouse-absent"}
NUMERIC = ("age", "education_num", "hours_per_week")
CATEGORICAL = ("sex", "race", "marital_status", "relationship", "workclass", "native_country")
GENERALIZED = {
    **dict.fromkeys(MARRIED, "Married"),
    "Never-married": "Never-married",
    **dict.fromkeys(("Divorced", "Separated", "Widowed"), "Previously-married"),
}


@dataclass(frozen=True)
class Scenario:
    respondents: int | None  # None: every Adult record
    waves: int
    window: int
    skip: float  # share of respondents absent from a wave
    change_scale: float  # multiplies the change probabilities
    rate: float | None  # records per second (simulated); None: all at once
    max_seconds: float = 2.0
    max_hold: float = 30.0


SCENARIOS = {
    "panel": Scenario(None, 6, 5000, 0.0, 1.0, None),
    "attrition": Scenario(None, 6, 5000, 0.3, 1.0, None),
    # 30 % changing a wave: the change probabilities scaled up about 2.3x
    "trickle": Scenario(600, 3, 5000, 0.0, 2.3, 4.0),
}


def policy_for(mode: str, *, unrounded: bool = False) -> Policy:
    """The shipped policy with a mode: ``name[+sN][@pool][:strata=a+b][:l=N]``, e.g.
    ``cohort+s2@window`` or ``regroup:strata=race:l=2``; ``unrounded``: the noised amounts
    without the policy's round_to."""
    data = yaml.safe_load(POLICY.read_text())
    if unrounded:
        for attr in data["attributes"].values():
            if attr.get("method") == "noise":
                attr.pop("round_to", None)
    mode, *options = mode.split(":")
    for option in options:
        key, _, value = option.partition("=")
        if key == "strata":
            data["microaggregation"].update(strata=value.split("+"), small_strata="suppress")
        elif key == "l":
            data["microaggregation"]["l_diversity"] = {"attribute": "income", "l": int(value)}
        else:
            raise SystemExit(f"unknown mode option {option!r}: strata=a+b or l=N")
    mode, _, pool = mode.partition("@")
    name, _, slack = mode.partition("+s")
    rep = data.setdefault("republication", {})
    rep["mode"] = "regroup" if name == "fresh" else name
    rep["slack"] = int(slack or 0)
    if pool:
        rep["pool"] = pool
    elif rep["mode"] != "panel":  # the other modes as they shipped: one pool per wave
        rep["pool"] = "release"
    return parse_policy(data)


def change(rng: np.random.Generator, v: dict[str, Any], scale: float, work: list[Any]) -> None:
    """One wave of life for one respondent (in place)."""
    status = v["marital_status"]
    if status == "Never-married" and rng.random() < 0.10 * scale:
        v["marital_status"] = "Married-civ-spouse"
        v["relationship"] = "Husband" if v["sex"] == "Male" else "Wife"
    elif status in MARRIED and rng.random() < 0.03 * scale:
        v["marital_status"] = "Divorced"
        v["relationship"] = "Not-in-family"
    if rng.random() < 0.08 * scale:
        v["hours_per_week"] = int(np.clip(round(v["hours_per_week"] + rng.normal(0, 8)), 1, 99))
    if rng.random() < 0.03 * scale:
        v["workclass"] = work[int(rng.integers(len(work)))]


def claim_of(v: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(
        GENERALIZED.get(v[c], v[c]) if c == "marital_status" else v[c]
        for c in (*NUMERIC, *CATEGORICAL)
    )


TRUTH: list[dict[str, dict[str, Any]]] = []  # per wave: every respondent's current values


def build_waves(
    base: list[ValidRecord], sc: Scenario, order: str, seed: int
) -> list[list[ValidRecord]]:
    """Each wave's records in arrival order (arrived_at: simulated seconds; all at once: 100 s
    a wave). Every respondent's current values, absent or not, go to ``TRUTH``."""
    rng = np.random.default_rng(seed)
    current = [dict(r.values) for r in base]
    work = [v["workclass"] for v in current]
    out: list[list[ValidRecord]] = []
    offset = 0
    clock = 0.0
    TRUTH.clear()
    for w in range(sc.waves):
        if w:
            for v in current:
                change(rng, v, sc.change_scale, work)
        TRUTH.append({f"r{i}": dict(v) for i, v in enumerate(current)})
        present = [i for i in range(len(current)) if rng.random() >= sc.skip]
        if order == "shuffled":
            present = rng.permutation(present).tolist()
        wave = []
        for j, i in enumerate(present):
            at = clock + j / sc.rate if sc.rate else 100.0 * (w + 1)
            values = {**current[i], "wave": w + 1}
            wave.append(ValidRecord(f"r{i}", values, SourceRef("in", 0, offset + j), at))
        offset += len(present)
        if sc.rate:
            clock += len(present) / sc.rate + 60.0  # a minute between waves
        out.append(wave)
    return out


@dataclass
class Tally:
    """What one mode published, by wave (release)."""

    rows: dict[int, list[tuple[str, dict[str, Any]]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    seconds: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    engine_stale: dict[int, float] = field(default_factory=lambda: defaultdict(float))


class ModeRun:
    """One mode's engine over the panel; waves are fed one at a time, so that the modes can
    take turns and their costs are measured close together on a noisy machine."""

    def __init__(self, mode: str, sc: Scenario, *, unrounded: bool = False) -> None:
        self.mode, self.sc = mode, sc
        self.policy = policy_for(mode, unrounded=unrounded)
        self.key = Keyring(b"panel-waves-bench-secret-0123456")
        self.engine = Engine(self.policy, keyring=self.key, store=MemoryStore())
        self.tally = Tally()
        self.held: list[ValidRecord] = []
        self.owner: dict[str, str] = {}
        self.wave_of: dict[str, int] = {}
        self.by_key: dict[bytes, str] = {}  # panel: a published record's respondent
        self.seen: set[str] = set()
        rep = self.policy.republication
        self.panel = rep.mode is RepublicationMode.PANEL
        self.grace = rep.close_grace if self.panel else 0.0

    def _protect(self, batch: list[ValidRecord], now: float, wave: int, flush: bool) -> None:
        gc.disable()  # collected between windows, as the engine process does
        t = time.perf_counter()
        res = self.engine.protect_window(batch, now=now, flush_all=flush)
        self.tally.seconds[wave] += time.perf_counter() - t
        gc.enable()
        gc.collect(0)
        self.tally.engine_stale[wave] += res.report.measures.get("stale_records", 0.0)
        self.held = list(res.held)
        for p in res.published:
            row = orjson.loads(p.value)
            if p.respondent is not None:  # panel: imputed records stand for a respondent too
                owner, w = self.by_key[p.respondent[-32:]], int(row["wave"])
            else:
                owner, w = self.owner[p.record_id], self.wave_of[p.record_id]
            self.tally.rows[w].append((owner, row))

    def wave(self, w: int, records: list[ValidRecord]) -> None:
        """Wave ``w``'s windows. The next wave's first k records close it (a watermark; fewer
        could be strays): their window is fed by :meth:`close` and counted as this wave's
        cost."""
        sc = self.sc
        if self.mode.startswith("fresh"):  # no stored groups: a new whole-key MDAV for every wave
            self.engine = Engine(self.policy, keyring=self.key, store=MemoryStore())
        for r in records:
            assert r.source is not None
            self.owner[r.source.record_id] = str(r.respondent_id)
            self.wave_of[r.source.record_id] = w
        if self.panel:
            fresh = [str(r.respondent_id) for r in records if r.respondent_id not in self.seen]
            self.seen.update(fresh)
            self.by_key.update(zip(self.key.respondent_keys(fresh), fresh, strict=True))
        if sc.rate is None:
            # the panel's clock runs (its waves close by grace); the other modes' as before
            now = records[0].arrived_at if self.panel and records else 0.0
            for start in range(0, len(records), sc.window):
                self._protect(self.held + records[start : start + sc.window], now, w, False)
        else:  # windows closed by time: every max_seconds of arrivals
            start = 0
            while start < len(records):
                opened = records[start].arrived_at
                end = start
                while end < len(records) and records[end].arrived_at < opened + sc.max_seconds:
                    end += 1
                self._protect(self.held + records[start:end], opened + sc.max_seconds, w, False)
                start = end
        if self.mode.startswith("fresh"):
            self._protect(self.held, 1e12, w, True)

    def close(self, w: int, first_of_next: list[ValidRecord]) -> None:
        """Wave ``w`` ends: the next wave's first k records arrive, alone in their window."""
        for r in first_of_next:
            assert r.source is not None
            self.owner[r.source.record_id] = str(r.respondent_id)
            self.wave_of[r.source.record_id] = w + 1
        now = first_of_next[-1].arrived_at if self.sc.rate or self.panel else 0.0
        if self.panel:  # the next wave has been arriving for the close grace
            fresh = [
                str(r.respondent_id) for r in first_of_next if r.respondent_id not in self.seen
            ]
            self.seen.update(fresh)
            self.by_key.update(zip(self.key.respondent_keys(fresh), fresh, strict=True))
            self._protect([*self.held, *first_of_next], now, w, False)
            now += self.grace
            self._protect(self.held, now, w, False)
            return
        self._protect([*self.held, *first_of_next], now, w, False)

    def finish(self, last: int) -> Tally:
        if self.held:
            self._protect(self.held, 1e12, last, True)
        return self.tally


def report(
    mode: str,
    tally: Tally,
    waves: list[list[ValidRecord]],
    k: int,
    base_cost: list[float] | None,
    *,
    sensitive: list[str],
) -> list[float]:
    spec = policy_for(mode).microaggregation
    strata, ldiv = spec.strata or [], spec.l_diversity
    sensitive_releases: list[dict[str, tuple[Any, ...]]] = []
    truth_by_wave = [{str(r.respondent_id): r.values for r in wave} for wave in waves]
    weighted_any = False
    history: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    releases: list[dict[str, Any]] = []
    prev_claim: dict[str, tuple[Any, ...]] = {}
    prev_tuple: dict[str, tuple[Any, ...] | None] = {}
    formed_with: dict[str, tuple[Any, ...]] = {}  # the values when its tuple was formed
    costs: list[float] = []
    for w, present_truth in enumerate(truth_by_wave, start=1):
        rows = tally.rows.get(w, [])
        truth = TRUTH[w - 1] if TRUTH else present_truth  # every respondent, absent or not
        fit = marginal_fit(rows, truth)
        weighted_any = weighted_any or fit.weighted
        imputed = sum(rid not in present_truth for rid, _ in rows)
        present_suppressed = sum(row["age"] is None for rid, row in rows if rid in present_truth)
        cols = (*NUMERIC, *CATEGORICAL)
        changed = {
            rid
            for rid, v in present_truth.items()
            if rid in prev_claim and claim_of(v) != prev_claim[rid]
        }
        release: dict[str, Any] = {}
        classes: dict[tuple[Any, ...], set[str]] = defaultdict(set)
        strata_of: dict[tuple[Any, ...], set[tuple[Any, ...]]] = defaultdict(set)
        incomes: dict[tuple[Any, ...], set[Any]] = defaultdict(set)
        stale_changers = out_of_date = published = suppressed = 0
        x_true, x_pub = [], []
        cat_cells = cat_wrong = 0
        married = [0, 0, 0]  # true married, published married, records with a published status
        never = [0, 0]
        for rid, row in rows:
            v = truth[rid]
            t = tuple(row[c] for c in cols)
            if row["age"] is None:
                release[rid] = None
                suppressed += 1
                continue
            published += 1
            release[rid] = t
            classes[t].add(rid)
            history[t].add(rid)
            strata_of[t].add(tuple(v[s] for s in strata))
            incomes[t].add(row["income"])
            now = claim_of(v)
            if prev_tuple.get(rid) != t:
                formed_with[rid] = now
            if rid in changed and prev_tuple.get(rid) == t:
                stale_changers += 1
            if formed_with.get(rid) != now:
                out_of_date += 1
            prev_tuple[rid] = t
            x_true.append([float(v[c]) for c in NUMERIC])
            x_pub.append([float(row[c]) for c in NUMERIC])
            true_status = GENERALIZED[v["marital_status"]]
            married[0] += true_status == "Married"
            married[1] += row["marital_status"] == "Married"
            married[2] += 1
            never[0] += true_status == "Never-married"
            never[1] += row["marital_status"] == "Never-married"
            for c in CATEGORICAL:
                true_c = true_status if c == "marital_status" else v[c]
                cat_cells += 1
                cat_wrong += row[c] != true_c
        releases.append(release)
        sensitive_releases.append(value_keys(dict(rows), sensitive))
        vlink = value_linkage(sensitive_releases[-2:]).pairs
        vshare = f"{100 * vlink[0].share_of_later:>5.1f}%" if vlink else f"{'-':>6}"
        prev_claim.update({rid: claim_of(v) for rid, v in present_truth.items()})
        sizes = linked_sets(releases)
        here = [sizes[rid] for rid, t in release.items() if t is not None]
        n = max(published, 1)
        below = sum(s < k for s in here)
        sse = quality.sse_sst_pct(np.array(x_true), np.array(x_pub)) if len(x_true) > 1 else 0.0
        cost = tally.seconds[w] / max(len(present_truth), 1) * 1e6
        costs.append(cost)
        ratio = f"{cost / base_cost[w - 1]:.2f}x" if base_cost else "-"
        crossing = sum(len(s) > 1 for s in strata_of.values()) if strata else "-"
        below_l = sum(len(s) < ldiv.l for s in incomes.values()) if ldiv else "-"
        print(
            f"{mode:>13} {w:>4} {len(changed):>7} {stale_changers:>6} "
            f"{100 * out_of_date / n:>6.1f}% {100 * tally.engine_stale[w] / n:>6.1f}% "
            f"{100 * married[0] / n:>5.1f}/{100 * married[1] / n:<5.1f} "
            f"{100 * never[0] / n:>5.1f}/{100 * never[1] / n:<5.1f} "
            f"{min((len(m) for m in classes.values()), default=0):>4} "
            f"{min((len(m) for m in history.values()), default=0):>4} "
            f"{min(here, default=0):>4} {100 * below / max(len(here), 1):>6.1f}% "
            f"{sse:>6.2f} {100 * cat_wrong / max(cat_cells, 1):>5.2f}% {suppressed:>5} "
            f"{vshare} {cost:>7.1f} {ratio:>6} {crossing:>4} {below_l:>4} "
            f"{fit.gap:>5.2f} {fit.worst:>22} {fit.hours:>5.2f} "
            f"{fit.deff if fit.weighted else float('nan'):>5.3f} {imputed:>5} "
            f"{100 * present_suppressed / max(len(present_truth), 1):>5.2f}%"
        )
    chains = sticky_chain_linkage(
        [[row for _, row in tally.rows.get(w, [])] for w in range(1, len(waves) + 1)],
        sensitive,
        (*NUMERIC, *CATEGORICAL),
        k,
    )
    print(
        f"{mode:>13}  sticky-value intruder (follows by {', '.join(sensitive)}; knows who took "
        f"part): {chains.below_k} of {chains.chains} followed respondents linked below k, "
        f"{chains.isolated} isolated"
    )
    overall = value_linkage(sensitive_releases)
    print(
        f"{mode:>13}  value linkage over all pairs of releases: {overall.linked} of "
        f"{overall.records} records ({100 * overall.share:.1f} %), precision "
        f"{overall.precision:.3f}"
    )
    return costs


HEADER = (
    f"{'mode':>13} {'wave':>4} {'changed':>7} {'stale':>6} {'outdated':>7} {'engine':>7} "
    f"{'married t/p':>11} {'never t/p':>11} {'rel':>4} {'hist':>4} "
    f"{'link':>4} {'<k':>7} {'SSE%':>6} {'cat%':>6} {'supp':>5} {'vlink':>6} {'µs/rec':>7} "
    f"{'cost':>6} {'xstr':>4} {'<l':>4} {'gap':>5} {'largest gap at':>22} {'hours':>5} "
    f"{'deff':>5} {'imp':>5} {'supp%':>6}"
)


@dataclass(frozen=True)
class Fit:
    """A release against the panel's current truth: the largest gap of any category's share of
    any categorical quasi-identifier (points), where, the gap of mean hours, the weights' Kish
    design effect. Weighted by the published weight where there is one (the truth then by the
    sampling weight, which the published weight estimates with)."""

    gap: float
    worst: str
    hours: float
    deff: float
    weighted: bool


def marginal_fit(rows: list[tuple[str, dict[str, Any]]], truth: dict[str, dict[str, Any]]) -> Fit:
    shown = [(rid, row) for rid, row in rows if row["age"] is not None]
    weighted = bool(shown) and shown[0][1].get("weight") is not None
    wp = np.array([float(row["weight"]) if weighted else 1.0 for _, row in shown])
    people = list(truth.values())
    wt = np.array([float(v.get("fnlwgt") or 1.0) if weighted else 1.0 for v in people])
    gap, worst = 0.0, "-"
    for c in CATEGORICAL:

        def true_of(v: dict[str, Any], c: str = c) -> Any:
            return GENERALIZED[v[c]] if c == "marital_status" else v[c]

        pub: dict[Any, float] = defaultdict(float)
        for (_, row), weight in zip(shown, wp, strict=True):
            pub["?" if row[c] is None else row[c]] += weight
        tru: dict[Any, float] = defaultdict(float)
        for v, weight in zip(people, wt, strict=True):
            value = true_of(v)
            tru["?" if value is None else value] += weight
        for cat in pub.keys() | tru.keys():
            g = 100 * abs(pub[cat] / max(wp.sum(), 1e-12) - tru[cat] / max(wt.sum(), 1e-12))
            if g > gap:
                gap, worst = g, f"{c[:10]}={str(cat)[:10]}"
    hp = np.array([float(row["hours_per_week"]) for _, row in shown])
    ht = np.array([float(v["hours_per_week"]) for v in people])
    if not shown:  # every record of the wave suppressed: no published marginal to compare
        return Fit(math.nan, "all suppressed", math.nan, math.nan, weighted)
    hours = abs(float(np.average(hp, weights=wp)) - float(np.average(ht, weights=wt)))
    deff = float(len(wp) * np.square(wp).sum() / wp.sum() ** 2) if len(wp) else 1.0
    return Fit(gap, worst, hours, deff, weighted)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="panel")
    ap.add_argument(
        "--modes", default="regroup,cohort,panel,deferred,fresh", help="modes, comma-separated"
    )
    ap.add_argument("--order", choices=["file", "shuffled"], default="file")
    ap.add_argument("--records", type=int, help="first N Adult records (default: the scenario's)")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--unrounded", action="store_true", help="noise without round_to")
    args = ap.parse_args()
    tune_memory()  # malloc and the collector as the engine process has them
    sc = SCENARIOS[args.scenario]
    base_policy = policy_for("deferred")
    df = read_table(ADULT, as_text=True)
    n = args.records or sc.respondents
    if n:
        df = df.head(n)
    base = records_from_frame(df, base_policy, ADULT)
    waves = build_waves(base, sc, args.order, args.seed)
    k = base_policy.microaggregation.k
    sensitive = [
        n
        for n, a in base_policy.attributes.items()
        if a.role is Role.SENSITIVE and a.method is not Method.DROP
    ]
    print(
        f"{args.scenario}: {len(base)} respondents, {sc.waves} waves, arrival order {args.order}, "
        f"k = {k}; stale: changers still publishing their previous tuple; outdated: published "
        f"respondents whose tuple was formed before their values changed (engine: the engine's "
        f"own count); rel/hist: smallest class in the release / over the history; link, <k: "
        f"smallest linked candidate set and share below k; vlink: records linkable to the "
        f"previous release by their published sensitive values alone"
        + (" (noised amounts not rounded)" if args.unrounded else "")
        + "; xstr: classes whose respondents span strata (a tuple two groups happen to share "
        "counts too); <l: classes publishing fewer than l distinct incomes"
    )
    print(HEADER)
    modes = args.modes.split(",")
    runs = [ModeRun(mode, sc, unrounded=args.unrounded) for mode in modes]
    for w, wave in enumerate(waves, start=1):
        for run in runs:  # the modes take turns, wave by wave
            run.wave(w, wave if w == 1 else wave[k:])  # the first k closed the wave before
            if w < len(waves):
                run.close(w, waves[w][:k])
    tallies = [run.finish(len(waves)) for run in runs]
    # engine cost ratios against deferred, else against the first mode named (same run)
    baseline = "deferred" if "deferred" in modes else modes[0]
    base_cost = [
        tallies[modes.index(baseline)].seconds[w] / max(len(wave), 1) * 1e6
        for w, wave in enumerate(waves, start=1)
    ]
    print(f"cost: engine µs a record against {baseline} in the same run")
    for mode, tally in zip(modes, tallies, strict=True):
        report(mode, tally, waves, k, base_cost if mode != baseline else None, sensitive=sensitive)


if __name__ == "__main__":
    main()
