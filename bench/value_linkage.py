"""Records linkable across releases by their published sensitive values, by rounding step.

    .venv/bin/python bench/value_linkage.py                     # panel and trickle, then cost
    .venv/bin/python bench/value_linkage.py --scenario trickle --steps 500:100,1000:200

The panel of bench/panel_waves.py (its first two waves; sensitive values do not change between
waves, so every later pair of releases links alike) is run once through the engine with the
shipped policy's noised amounts unrounded. Rounding is the last, deterministic step of the noise
path, so each (capital_gain step, capital_loss step) is applied to that run's published amounts
afterwards — the engine would publish exactly these values (the same keyed draws, then rounded;
tests/gateway/test_value_linkage.py checks it). For each step it prints the share of wave 2's
records linkable to wave 1 (``gateway.measures.attack.value_linkage``: a combination unique in both
releases) by all four published sensitive values, by the two amounts alone and by the two
randomized ones alone, with the precision of the links.

Then the engine's cost with the shipped rounding against the same policy unrounded: two
engines on the same 20,000 Adult records (3 waves, windows of 5,000), alternating window by
window in one process, so that the machine's drift falls on both.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import panel_waves as pw  # the panel, its scenarios and its mode runs

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.files.fileio import read_table, records_from_frame
from gateway.keyed.keyed import Keyring
from gateway.measures.attack import value_keys, value_linkage
from gateway.mechanisms.masking import round_to
from gateway.policy import Policy, parse_policy
from state.memory_store import MemoryStore

KEYS = {
    "all four": ("occupation", "income", "capital_gain", "capital_loss"),
    "amounts": ("capital_gain", "capital_loss"),
    "randomized": ("occupation", "income"),
}
AMOUNTS = ("capital_gain", "capital_loss")


def published_unrounded(scenario: str) -> list[dict[str, dict[str, Any]]]:
    """Waves 1 and 2 of the scenario under the shipped policy without round_to."""
    sc = dataclasses.replace(pw.SCENARIOS[scenario], waves=2)
    df = read_table(pw.ADULT, as_text=True)
    if sc.respondents:
        df = df.head(sc.respondents)
    base = records_from_frame(df, pw.policy_for("regroup", unrounded=True), pw.ADULT)
    waves = pw.build_waves(base, sc, "file", 29)
    run = pw.ModeRun("regroup", sc, unrounded=True)
    for w, wave in enumerate(waves, start=1):
        run.wave(w, wave if w == 1 else wave[1:])
        if w < len(waves):
            run.close(w, waves[w][0])
    tally = run.finish(len(waves))
    return [dict(tally.rows[w]) for w in (1, 2)]


def rounded(release: dict[str, dict[str, Any]], steps: tuple[float, float]) -> dict[str, Any]:
    out = {}
    for rid, published in release.items():
        row = dict(published)
        for name, step in zip(AMOUNTS, steps, strict=True):
            if step and row[name] is not None:
                row[name] = float(round_to(np.array([row[name]]), step)[0])
        out[rid] = row
    return out


def linkage_table(scenario: str, steps: list[tuple[float, float]], sd: tuple[float, float]) -> None:
    releases = published_unrounded(scenario)
    print(
        f"\n{scenario}: {len(releases[1])} records in wave 2; share linkable to wave 1 by their "
        f"published values (precision); noise.sd floors {sd[0]:g} / {sd[1]:g}"
    )
    print(
        f"{'gain step':>10} {'loss step':>10} {'step/sd':>9} " + "".join(f"{k:>18}" for k in KEYS)
    )
    for step in steps:
        pair = [rounded(r, step) for r in releases]
        cells = []
        for attrs in KEYS.values():
            link = value_linkage([value_keys(r, attrs) for r in pair]).pairs[0]
            cells.append(f"{100 * link.share_of_later:>8.1f}% ({link.precision:.2f})")
        ratio = "-" if not step[0] else f"{step[0] / sd[0]:g}/{step[1] / sd[1]:g}"
        print(f"{step[0]:>10g} {step[1]:>10g} {ratio:>9} " + "".join(f"{c:>18}" for c in cells))


def cost(records: int) -> None:
    data = yaml.safe_load(pw.POLICY.read_text())
    data["republication"]["pool"] = "window"  # every window protected as it comes
    policies: dict[str, Policy] = {"rounded": parse_policy(data)}
    for attr in data["attributes"].values():
        if attr.get("method") == "noise":
            attr.pop("round_to", None)
    policies["unrounded"] = parse_policy(data)
    base = records_from_frame(
        read_table(pw.ADULT, as_text=True).head(records), policies["rounded"], pw.ADULT
    )
    seconds = {k: [0.0, 0.0] for k in policies}
    for rnd in range(2):
        engines = {
            k: Engine(p, keyring=Keyring(b"value-linkage-bench-secret-01234"), store=MemoryStore())
            for k, p in policies.items()
        }
        for wave in range(3):
            recs = [
                ValidRecord(
                    r.respondent_id,
                    {**r.values, "wave": wave + 1},
                    SourceRef("in", 0, wave * 10**7 + i),
                    0.0,
                )
                for i, r in enumerate(base)
            ]
            for start in range(0, len(recs), 5000):
                order = list(policies)
                if (start // 5000 + rnd + wave) % 2:
                    order.reverse()
                for k in order:
                    gc.disable()  # collected between windows, as the engine process does
                    t = time.perf_counter()
                    engines[k].protect_window(recs[start : start + 5000], now=0.0)
                    seconds[k][wave > 0] += time.perf_counter() - t
                    gc.enable()
                    gc.collect(0)
    print(f"\nengine cost, {records} Adult records, 3 waves, 2 rounds, alternating windows")
    for k, (first, later) in seconds.items():
        print(
            f"{k:>10}: wave 1 {first / (2 * records) * 1e6:.1f} µs a record, "
            f"waves 2-3 {later / (4 * records) * 1e6:.1f}"
        )
    r, u = seconds["rounded"], seconds["unrounded"]
    print(f"rounded / unrounded: wave 1 {r[0] / u[0]:.3f}, waves 2-3 {r[1] / u[1]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", choices=["panel", "trickle", "both"], default="both")
    ap.add_argument(
        "--steps",
        default="0:0,100:100,500:100,500:200,1000:100,1000:200,2000:500,5000:1000",
        help="gain:loss rounding steps (0: unrounded)",
    )
    ap.add_argument("--sd", help="gain:loss noise.sd floors instead of the policy's")
    ap.add_argument("--cost-records", type=int, default=20_000, help="0: no cost run")
    args = ap.parse_args()
    if args.sd:  # the shipped policy with other noise floors, for the panel's mode runs
        data = yaml.safe_load(pw.POLICY.read_text())
        for name, sd in zip(AMOUNTS, args.sd.split(":"), strict=True):
            data["attributes"][name]["noise"]["sd"] = float(sd)
            data["attributes"][name].pop("round_to", None)
        tmp = Path(tempfile.mkdtemp()) / "adult.yaml"
        tmp.write_text(yaml.safe_dump(data))
        pw.POLICY = tmp
    pol = pw.policy_for("regroup", unrounded=True)
    noises = [pol.attributes[a].noise for a in AMOUNTS]
    floors = tuple(float(n.sd or 0.0) if n is not None else 0.0 for n in noises)
    steps = [(float(g), float(loss)) for g, loss in (s.split(":") for s in args.steps.split(","))]
    for scenario in ("panel", "trickle") if args.scenario == "both" else (args.scenario,):
        linkage_table(scenario, steps, (floors[0], floors[1]))
    if args.cost_records:
        cost(args.cost_records)


if __name__ == "__main__":
    main()
