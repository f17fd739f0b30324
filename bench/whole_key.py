"""The engine's cost per record with the k claim over every quasi-identifier, against the
numeric-only claim of earlier versions, measured in the same run.

    .venv/bin/python bench/whole_key.py                 # Adult, windows of 5,000, 3 waves
    .venv/bin/python bench/whole_key.py --records 20000 --window 5000 --repeat 3

Both sides run the sticky engine (keyed randomness, an in-memory state store) on the same
records of ../shared/data/adult.csv: wave 1 has only new respondents (every record is
microaggregated), waves 2 and 3 republish them unchanged except a share of changed
quasi-identifiers (those are microaggregated again, among themselves).

* **whole key** — deploy/policies/adult.yaml: nine quasi-identifiers, numeric and nominal,
  microaggregated together;
* **deferred** — the same policy with ``republication.mode: deferred``: the engine before
  republication modes (a changed respondent keeps its group's first tuple);
* **numeric only** (baseline) — the same policy with the six categorical quasi-identifiers
  published unchanged (``unprotected: true``): the claim earlier versions made.

It prints µs per record per wave for each and the whole key's ratios to the other two (the
sides take turns wave by wave, so ratios hold on a noisy machine), and the smallest published
class over the whole key for each (the baseline's is the re-identification risk the change
removes). The garbage collector runs between windows, as in the engine process.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections import defaultdict
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
from gateway.policy import Policy, parse_policy, policy_from_yaml
from state.memory_store import MemoryStore
from stream_jobs.engine_process.memory import tune_memory

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT.parent / "shared" / "data" / "adult.csv"
CATEGORICAL_QIS = ("sex", "race", "marital_status", "relationship", "workclass", "native_country")


def policies() -> tuple[Policy, Policy, Policy]:
    """The shipped policy (whole key, its republication mode), the same with the ``deferred``
    mode (the engine before republication modes), and the numeric-only claim."""
    text = (ROOT / "deploy" / "policies" / "adult.yaml").read_text()
    whole = policy_from_yaml(text)
    data = yaml.safe_load(text)
    data["republication"]["mode"] = "deferred"
    deferred = parse_policy(data)
    data["microaggregation"].pop("edit_rules", None)  # they constrain categorical QIs only
    for name in CATEGORICAL_QIS:  # published unchanged, outside the claim
        attr = data["attributes"][name]
        attr.pop("hierarchy", None)
        attr.update(method="keep", unprotected=True)
    base = parse_policy(data)
    assert base.k_claim == ["age", "education_num", "hours_per_week"], base.k_claim
    return whole, deferred, base


def waves(
    records: list[ValidRecord], n_waves: int, change: float, seed: int
) -> list[list[ValidRecord]]:
    rng = np.random.default_rng(seed)
    out = []
    offset = 0
    current = [dict(r.values) for r in records]
    for w in range(n_waves):
        if w:
            for values in current:
                if rng.random() < change:
                    values["hours_per_week"] = int(rng.integers(1, 99))
        wave = []
        for i, values in enumerate(current):
            wave.append(
                ValidRecord(f"r{i}", {**values, "wave": w + 1}, SourceRef("in", 0, offset + i), 0.0)
            )
        offset += len(records)
        out.append(wave)
    return out


class Side:
    """One side's engine over the waves; the sides take turns wave by wave, so that their
    costs are measured close together on a noisy machine."""

    def __init__(self, policy: Policy, window: int) -> None:
        self.engine = Engine(policy, keyring=Keyring(b"b" * 32), store=MemoryStore())
        self.window = window
        self.per_wave: list[float] = []
        self.classes: dict[tuple[Any, ...], set[str]] = defaultdict(set)
        self.claim = [*policy.k_claim, *policy.unprotected_quasi_identifiers]

    def _timed(self, batch: list[ValidRecord], now: float, flush: bool) -> tuple[Any, float]:
        gc.disable()
        t = time.perf_counter()
        res = self.engine.protect_window(batch, now=now, flush_all=flush)
        spent = time.perf_counter() - t
        gc.enable()
        gc.collect(0)
        return res, spent

    def wave(self, wave: list[ValidRecord]) -> None:
        held: list[ValidRecord] = []
        results = []
        spent = 0.0
        for start in range(0, len(wave), self.window):
            res, seconds = self._timed(held + wave[start : start + self.window], 0.0, False)
            spent += seconds
            held = list(res.held)
            results.append(res)
        res, seconds = self._timed(held, 1e9, True)
        spent += seconds
        results.append(res)
        self.per_wave.append(spent / len(wave) * 1e6)
        owner = {r.source.record_id: r.respondent_id for r in wave if r.source}
        for res in results:
            for p in res.published:
                row = orjson.loads(p.value)
                t_ = tuple(row.get(a) for a in self.claim)
                if any(v is not None for v in t_):
                    self.classes[t_].add(str(owner.get(p.record_id)))

    @property
    def smallest(self) -> int:
        return min(len(v) for v in self.classes.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--window", type=int, default=5_000)
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--change", type=float, default=0.1, help="share changing QIs per wave")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    tune_memory()  # malloc and the collector as the engine process has them
    whole, deferred, base = policies()
    df = read_table(ADULT, as_text=True).head(args.records)
    data = waves(records_from_frame(df, whole, ADULT), args.waves, args.change, seed=1)
    print(f"{args.records} Adult records, windows of {args.window}, {args.waves} waves")
    print(
        f"{'run':>4} {'side':>13} "
        + " ".join(f"{'wave ' + str(w + 1):>10}" for w in range(args.waves))
        + f" {'smallest class (whole key)':>28}"
    )
    sides = (("numeric only", base), ("deferred", deferred), ("whole key", whole))
    for rep in range(args.repeat):
        runs = {name: Side(policy, args.window) for name, policy in sides}
        for w, wave in enumerate(data):
            order = list(runs.values())
            for side in order[w % 3 :] + order[: w % 3]:  # who goes first rotates
                side.wave(wave)
        got = {name: side.per_wave for name, side in runs.items()}
        for name, side in runs.items():
            print(
                f"{rep + 1:>4} {name:>13} "
                + " ".join(f"{v:>8.1f}µs" for v in side.per_wave)
                + f" {side.smallest:>28}"
            )
        for over in ("numeric only", "deferred"):
            ratio = [w / b for w, b in zip(got["whole key"], got[over], strict=True)]
            label = f"/ {over}"
            print(f"{rep + 1:>4} {label:>13} " + " ".join(f"{r:>9.2f}x" for r in ratio))


if __name__ == "__main__":
    main()
