"""Can an intruder tell a panel's imputed (absent) records from answered ones?

    .venv/bin/python bench/panel_participation.py                 # 3,000 members, 4 secrets
    .venv/bin/python bench/panel_participation.py --secrets 6 --members 2000

Panels of Adult respondents (../shared/data/adult.csv) in 4 waves, through `privgw protect
--state-dir` (deploy/policies/adult.yaml); at each wave after the first 20 % of the members
are absent at random. Two ways answers change from a wave to the next: ``indep`` (each of
occupation, income, capital gain and hours for 15 % of the members, on its own) and ``event``
(a life event for 15 % changes occupation, income and capital gain together). Members answer
on a habitual day of each wave (their own offset, ± 6 h).

The intruder holds every release and follows each member by its records (the true linkage: a
probe's own linkage by classes and sticky values got 98 % of records right). Each record of a
wave after the first is scored, and the AUC of imputed against answered is printed (0.5: no
better than chance), the mean ± SE over the secrets:

* ``into``: which published answers changed from the member's previous record (16 patterns,
  a likelihood ratio cross-fitted over the other secrets' panels), at wave 2 (later, answered
  records include members coming back);
* ``return``: the patterns into and out of the record (256 patterns; records before the last
  wave): an imputed value is not the member's truth, which shows when it answers again;
* ``day``: how far the day of the wave it answered moved from its previous record's.

Two ways of imputing in the same run on the same panels and secrets: ``aged`` (the engine's:
the answers moved together as one donor's, other attributes carried and aged) and
``carried`` (no ageing at all: answers carried forward, other attributes a random present
respondent's, the engine before 2026-12-07).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.files.panel_file import protect_waves  # noqa: E402
from gateway.keyed.keyed import Keyring  # noqa: E402
from gateway.panel import step  # noqa: E402
from gateway.panel.output import panel_record_ids  # noqa: E402
from gateway.policy import load_policy  # noqa: E402
from state.file_state import open_file_state  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "adult.csv"
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"
ANSWERS = ("occupation", "income", "capital_gain", "capital_loss")
WAVES, ABSENT, CHANGE = 4, 0.2, 0.15


def panel(members: int, seed: int, scenario: str) -> pd.DataFrame:
    """Every member's truth in every wave, with whether it answered."""
    rng = np.random.default_rng(seed)
    adult = pd.read_csv(DATA, dtype=str, keep_default_na=False)
    now = adult.iloc[rng.permutation(len(adult))[:members]].reset_index(drop=True)
    now["respondent_id"] = [f"r{i:06d}" for i in range(members)]
    jobs = sorted(set(adult["occupation"]) - {"?"})
    habit = rng.integers(0, 6 * 86400, members)
    waves = []
    for w in range(1, WAVES + 1):
        if w > 1:
            if scenario == "indep":
                occ, inc, gain, hours = (rng.random(members) < CHANGE for _ in range(4))
            else:
                event = rng.random(members) < CHANGE
                occ = event
                inc, gain = event & (rng.random(members) < 0.7), event & (rng.random(members) < 0.6)
                hours = event
            flip = {">50K": "<=50K", "<=50K": ">50K"}
            now.loc[inc, "income"] = now.loc[inc, "income"].map(flip)
            now.loc[occ, "occupation"] = rng.choice(jobs, int(occ.sum()))
            new_gain = np.where(rng.random(members) < 0.5, 0, rng.integers(500, 20000, members))
            now["capital_gain"] = np.where(gain, new_gain, now["capital_gain"].astype(int))
            h = now["hours_per_week"].astype(int).to_numpy()
            now["hours_per_week"] = np.where(
                hours, np.clip(h + rng.integers(-10, 11, members), 1, 99), h
            )
        seconds = np.clip(habit + rng.integers(-6 * 3600, 6 * 3600, members), 0, 7 * 86400 - 1)
        at = pd.Timestamp("2024-01-01") + pd.Timedelta(days=30 * (w - 1))
        stamps = (at + pd.to_timedelta(seconds, unit="s")).strftime("%Y-%m-%dT%H:%M:%SZ")
        present = rng.random(members) >= (ABSENT if w > 1 else 0.0)
        waves.append(now.assign(wave=str(w), submitted_at=stamps, present=present).astype(str))
    return pd.concat(waves, ignore_index=True)


@contextmanager
def imputing(way: str) -> Iterator[None]:
    """``carried``: the panel step ages nothing (answers carried forward; other attributes not
    carried, so a random present respondent's)."""
    aged = step._aged
    if way == "carried":
        step._aged = lambda policy, kind: ()  # type: ignore[assignment]
    try:
        yield
    finally:
        step._aged = aged


def release(truth: pd.DataFrame, secret: bytes, way: str) -> pd.DataFrame:
    """Every published record with its member, wave and whether it was imputed."""
    policy = load_policy(POLICY)
    published = []
    with tempfile.TemporaryDirectory() as tmp, imputing(way):
        key = Path(tmp) / "secret"
        key.write_bytes(secret.hex().encode())
        key.chmod(0o600)
        os.environ["PRIVGW_SECRET_FILE"] = str(key)
        for w in range(1, WAVES + 1):
            src, dst = Path(tmp) / f"in{w}.csv", Path(tmp) / f"out{w}.csv"
            rows = truth[(truth.wave == str(w)) & (truth.present == "True")]
            rows.drop(columns="present").to_csv(src, index=False)
            protect_waves(src, policy, dst, Path(tmp) / "state", open_file_state)
            published.append(pd.read_csv(dst, dtype=str, keep_default_na=False))
    out = pd.concat(published, ignore_index=True)
    ids = sorted(truth.respondent_id.unique())
    keyring = Keyring(secret.hex().encode())  # the file's text is the secret
    keys = dict(zip(ids, keyring.respondent_keys(ids), strict=True))
    truth = truth.copy()
    for w in range(1, WAVES + 1):
        at = truth.wave == str(w)
        truth.loc[at, "record_id"] = panel_record_ids([keys[r] for r in truth.respondent_id[at]], w)
    labels = truth[["record_id", "respondent_id", "present"]]
    return out.merge(labels, on="record_id", how="left", validate="one_to_one")


def features(pub: pd.DataFrame) -> pd.DataFrame:
    """Per record of a wave after the first: imputed, and the intruder's features."""
    d = pub.assign(w=pub.wave.astype(int)).sort_values(["respondent_id", "w"])
    by = d.groupby("respondent_id")
    into = sum((d[a] != by[a].shift(1)).astype(int) * 2**i for i, a in enumerate(ANSWERS))
    out_of = sum((d[a] != by[a].shift(-1)).astype(int) * 2**i for i, a in enumerate(ANSWERS))
    day = pd.to_datetime(d.submitted_at.str[:10])
    into_wave = (day - day.groupby(d.w).transform("min")).dt.days
    f = pd.DataFrame({
        "imputed": d.present != "True",
        "w": d.w,
        "into": into,
        "return": into * 16 + out_of,
        "day": (into_wave - into_wave.groupby(d.respondent_id).shift(1)).abs(),
    })  # fmt: skip
    return f[f.w > 1]


def auc(score: np.ndarray, y: np.ndarray) -> float:
    ranks = pd.Series(score).rank().to_numpy()
    n1, n0 = int(y.sum()), int((~y).sum())
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def likelihood_ratio(train: list[pd.DataFrame], test: pd.DataFrame, column: str) -> np.ndarray:
    """Each pattern's share among imputed over its share among answered, from other panels."""
    both = pd.concat(train)
    imp = both[both.imputed][column].value_counts(normalize=True)
    ans = both[~both.imputed][column].value_counts(normalize=True)
    ratio = (imp + 1e-4).div(ans + 1e-4, fill_value=1e-4)
    return test[column].map(ratio).fillna(1.0).to_numpy()


def scores(runs: list[pd.DataFrame]) -> dict[str, tuple[float, float]]:
    """AUC of each feature, mean and standard error over the runs."""
    found: dict[str, list[float]] = {"into": [], "return": [], "day": []}
    for i, f in enumerate(runs):
        others = runs[:i] + runs[i + 1 :]
        y = f.imputed.to_numpy()
        first = f.w == 2  # (later, answered records include members coming back)
        found["into"].append(
            auc(likelihood_ratio([o[o.w == 2] for o in others], f[first], "into"), y[first])
        )
        back = f.w < WAVES
        found["return"].append(
            auc(likelihood_ratio([o[o.w < WAVES] for o in others], f[back], "return"), y[back])
        )
        found["day"].append(auc(f.day.to_numpy(), y))
    return {
        k: (float(np.mean(v)), float(np.std(v, ddof=1) / np.sqrt(len(v)))) for k, v in found.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", type=int, default=3000)
    ap.add_argument("--secrets", type=int, default=4)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    print(
        f"{args.members} members, {WAVES} waves, {ABSENT:.0%} absent a wave, {args.secrets} secrets"
    )
    print("AUC imputed vs answered, mean ± SE over the secrets (0.5: chance)")
    print(f"{'changes':8} {'imputing':8} {'into':>15} {'return':>15} {'day':>15} {'seconds':>8}")
    for scenario in ("indep", "event"):
        panels = [panel(args.members, seed, scenario) for seed in range(args.secrets)]
        secrets = [os.urandom(32) for _ in range(args.secrets)]
        for way in ("carried", "aged"):
            start = time.perf_counter()
            runs = [features(release(t, s, way)) for t, s in zip(panels, secrets, strict=True)]
            took = time.perf_counter() - start
            cells = [f"{m:.3f} ± {se:.3f}" for m, se in scores(runs).values()]
            print(f"{scenario:8} {way:8} {cells[0]:>15} {cells[1]:>15} {cells[2]:>15} {took:8.1f}")


if __name__ == "__main__":
    main()
