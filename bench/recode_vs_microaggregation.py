"""Adult, k = 5: global recoding + local suppression against whole-key microaggregation.

    .venv/bin/python bench/recode_vs_microaggregation.py [--data ../shared/data/adult.csv]
    .venv/bin/python bench/recode_vs_microaggregation.py --stream [--waves 6] [--records N]

``--stream``: the Adult panel of bench/panel_waves.py (every record a respondent in each wave,
about 13 % changing a key per wave, windows of 5,000) through the stream engine with
adult_recode.yaml (waves decided whole when the next begins, exact-tuple k: docs/consistency.md).
Per wave: records, records withheld, records in exact classes below k (0 is the claim), the
smallest class, suppressed cells per key, and suppressed cells of unchanged respondents that
were published again (0: sticky); then the engine's time.

Protects the file with deploy/policies/adult.yaml (MDAV over the nine quasi-identifiers) and
deploy/policies/adult_recode.yaml (the same keys recoded, then suppressed to k), and prints one
table for docs/policy.md. Risk: records whose key matches fewer than k records (a missing value
matching any, sdcMicro's convention), records whose exact tuple is shared by fewer than k (a
suppressed cell a value of its own), Σ 1/fk (the expected re-identifications of an intruder
who picks one of the matching records at random), and whole-key record linkage (mixed
distance; for the recoded file each numeric interval stands for the mean of its originals, a
suppressed cell for the overall mean, a category for itself). Loss: cells suppressed, records
with a wrong category, SSE/SST of age, education_num and hours_per_week (recoded: the same
interval means).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from gateway.engine.engine import Engine
from gateway.engine.records import PublishedRecord, ValidRecord
from gateway.files.evaluate import claim_frame
from gateway.files.fileio import read_table, records_from_frame
from gateway.files.protect import protect_file
from gateway.grouping.mixed_microaggregation import claim_columns, claim_inputs
from gateway.grouping.recode_stream import RecodeStream
from gateway.grouping.recode_suppress import strict_classes_below_k
from gateway.keyed.keyed import Keyring
from gateway.measures import linkage, quality
from gateway.measures.frequency_risk import key_codes, sample_frequencies
from gateway.policy import MISSING_LABEL, Policy, load_policy
from state.memory_store import MemoryStore

ROOT = Path(__file__).resolve().parents[1]


def _numeric_standins(orig: pd.DataFrame, pub: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    out = pub.copy()
    for n in names:
        x = orig[n].astype(float)
        label = pub[n].astype(object)
        means = x.groupby(label.where(label.notna(), "\0")).transform("mean")
        out[n] = np.where(label.isna(), x.mean(), means)
    return out


def measure(src: Path, policy_path: Path, out: Path) -> dict[str, float]:
    policy = load_policy(policy_path)
    start = time.perf_counter()
    protect_file(src, policy, out, seed=1)
    seconds = time.perf_counter() - start
    raw = pd.read_csv(src, dtype=str, keep_default_na=False)
    prot = pd.read_csv(out, dtype=str, keep_default_na=False)
    before = claim_frame(raw, policy, published=False)
    keys = policy.k_claim
    numeric = [n for n in keys if policy.attributes[n].type.value == "numeric"]
    categorical = [n for n in keys if n not in numeric]
    pub = prot[keys].astype(object).where(prot[keys] != "", None)
    recoded = policy.microaggregation.algorithm.value == "recode_suppress"
    if recoded:
        after = _numeric_standins(before, pub, numeric)
        for n in categorical:  # the original's recoded category, for the wrong-category count
            after[n] = pub[n]
        truth = pd.DataFrame({n: before[n] for n in categorical})
        from gateway.grouping.recode_suppress import recode  # noqa: PLC0415

        for n in categorical:
            truth[n] = recode(before[n].tolist(), policy.attributes[n])
    else:
        after = claim_frame(prot, policy, published=True)
        truth = before[categorical]
    given = pub[categorical].notna()
    wrong = ((after[categorical].astype(str) != truth.astype(str)) & given).any(axis=1)
    fk, _ = sample_frequencies(key_codes(pub, keys))
    # missing in the release, not in the input (a missing category published empty is not lost)
    suppressed = pub.isna() & before[keys].notna() & (before[keys] != MISSING_LABEL)
    x = before[numeric].to_numpy(dtype=float)
    xm = after[numeric].to_numpy(dtype=float)
    link = linkage.mixed_linkage(before, after, claim_columns(policy))
    k = policy.microaggregation.k
    return {
        "records below k (missing matches any)": int((fk < k).sum()),
        "records below k (exact tuple)": strict_classes_below_k(pub, keys, k),
        "sum 1/fk": float(np.sum(1.0 / fk)),
        "whole-key linkage": link.share_linked,
        "suppressed cells": int(suppressed.to_numpy().sum()),
        "records with a suppression": int(suppressed.any(axis=1).sum()),
        "records with a wrong category": int(wrong.sum()),
        "SSE/SST %": quality.sse_sst_pct(x, xm),
        "protect seconds": seconds,
    }


def _through_engine(
    policy: Policy, records: list[ValidRecord], window: int
) -> tuple[list[PublishedRecord], float]:
    """Every record through one sticky engine in windows (held ones carried), and its time."""
    engine = Engine(
        policy, keyring=Keyring(b"recode-stream-bench-secret-01234"), store=MemoryStore()
    )
    out: list[PublishedRecord] = []
    held: list[ValidRecord] = []
    seconds, at = 0.0, 0
    while at < len(records) or held:
        batch = records[at : at + window]
        at += len(batch)
        t = time.perf_counter()
        res = engine.protect_window(held + batch, now=0.0, flush_all=at >= len(records))
        seconds += time.perf_counter() - t
        held = list(res.held)
        out += res.published
    return out, seconds


def stream(src: Path, waves_n: int, records: int | None, seed: int) -> None:
    """The Adult panel through the stream engine with recode_suppress (see the docstring)."""
    import dataclasses  # noqa: PLC0415

    from panel_waves import SCENARIOS, build_waves  # noqa: PLC0415 (bench/, run as a script)

    policy = load_policy(ROOT / "deploy/policies/adult_recode.yaml")
    df = read_table(src, as_text=True)
    base = records_from_frame(df.head(records) if records else df, policy, src)
    sc = dataclasses.replace(SCENARIOS["panel"], waves=waves_n)
    stream_ = [r for wave in build_waves(base, sc, "file", seed) for r in wave]
    by_id = {r.source.record_id: r for r in stream_ if r.source is not None}
    keys, k = policy.k_claim, policy.microaggregation.k
    recoder = RecodeStream(policy, lambda rows: [])
    published, seconds = _through_engine(policy, stream_, sc.window)
    # the same-run baseline: whole-key microaggregation (adult.yaml, regroup, pool: release)
    _, base_seconds = _through_engine(
        load_policy(ROOT / "deploy/policies/adult.yaml"), stream_, sc.window
    )
    out: list[tuple[ValidRecord, tuple[Any, ...], bool]] = []
    for p in published:
        row = orjson.loads(p.value)
        out.append((by_id[p.record_id], tuple(row[n] for n in keys), p.suppressed))
    truths = recoder.recoded(
        [claim_inputs(policy.attributes[n], [r.values.get(n) for r, _, _ in out]) for n in keys]
    )
    print(f"{len(base)} respondents, {waves_n} waves, k = {k}, keys {', '.join(keys)}")
    print(
        "| wave | records | withheld | in classes < k | smallest class | records with a "
        "suppression | " + " | ".join(keys) + " | unchanged re-shown |"
    )
    print("|---" * (7 + len(keys)) + "|")
    last: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
    for w in range(1, waves_n + 1):
        rows = [
            (r, s, sup, t)
            for (r, s, sup), t in zip(out, truths, strict=True)
            if r.values["wave"] == w
        ]
        classes: dict[tuple[Any, ...], set[str]] = defaultdict(set)
        cells = dict.fromkeys(keys, 0)
        reshown = suppressed_records = 0
        for r, shown, sup, truth in rows:
            if sup:
                continue
            classes[shown].add(str(r.respondent_id))
            pairs = zip(keys, shown, truth, strict=True)
            gone = [n for n, v, t in pairs if v is None and t is not None]
            suppressed_records += bool(gone)
            for n in gone:
                cells[n] += 1
            before = last.get(str(r.respondent_id))
            if before is not None and before[0] == truth:
                again = zip(before[1], shown, strict=True)
                reshown += sum(b is None and v is not None for b, v in again)
            last[str(r.respondent_id)] = (truth, shown)
        sizes = {c: len(m) for c, m in classes.items()}
        below = sum(1 for _, shown, sup, _ in rows if not sup and sizes[shown] < k)
        print(
            f"| {w} | {len(rows):,} | {sum(sup for _, _, sup, _ in rows):,} | {below} | "
            f"{min(sizes.values())} | {suppressed_records:,} | "
            + " | ".join(f"{cells[n]:,}" for n in keys)
            + f" | {reshown} |"
        )
    n = len(stream_)
    print(
        f"engine: recode_suppress {seconds:.2f} s ({seconds / n * 1e6:.1f} µs a record); "
        f"whole-key microaggregation (adult.yaml) {base_seconds:.2f} s "
        f"({base_seconds / n * 1e6:.1f} µs a record), same run"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "adult.csv"))
    ap.add_argument("--stream", action="store_true", help="the panel through the stream engine")
    ap.add_argument("--waves", type=int, default=6)
    ap.add_argument("--records", type=int, help="first N Adult records (--stream)")
    ap.add_argument("--seed", type=int, default=29)
    args = ap.parse_args()
    src = Path(args.data)
    if args.stream:
        stream(src, args.waves, args.records, args.seed)
        return
    with tempfile.TemporaryDirectory() as tmp:
        micro = measure(src, ROOT / "deploy/policies/adult.yaml", Path(tmp) / "m.csv")
        rec = measure(src, ROOT / "deploy/policies/adult_recode.yaml", Path(tmp) / "r.csv")
    print(
        "| | whole-key microaggregation (adult.yaml) | recoding + suppression (adult_recode.yaml) |"
    )
    print("|---|---|---|")
    for name in micro:
        a, b = micro[name], rec[name]
        fmt = (lambda v: f"{v:,}") if isinstance(a, int) else (lambda v: f"{v:.3f}")
        print(f"| {name} | {fmt(a)} | {fmt(b)} |")


if __name__ == "__main__":
    main()
