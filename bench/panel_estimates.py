"""An analyst's wave estimates from a published panel under attrition, against the truth.

    .venv/bin/python bench/panel_estimates.py                  # 3,000 members, 6 secrets
    .venv/bin/python bench/panel_estimates.py --members 4000 --secrets 9

A panel of Adult respondents (../shared/data/adult.csv) in 3 waves, through `privgw protect
--state-dir` (deploy/policies/adult.yaml: income by randomized response). At wave 2, 20 % of
all members (present or absent) change their income, 20 % skip the wave (at random) and 10 %
new members join; at wave 3 nobody changes, a fresh 20 % skip and 5 % join. The analyst uses
only the published records, their analysis weights and the published matrix: each wave's
share of ">50K" by inversion (P⁻¹ of the weighted published shares), its standard error over
Kish's effective size, and the net change between waves 1 and 2. The truth is every active
member's current income, sampling-weighted.

Two ways of imputing the absent members' answers, in the same run on the same panels and
secrets: ``aged`` (the engine's: by the transitions of those present in both waves) and
``carried`` (the last answer carried forward, the engine before it aged answers). Printed per
way: each wave's mean error in points and mean z over the secrets, the net change estimated
against the truth, and the seconds.
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
from typing import Any

import numpy as np
import orjson
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.files.panel_file import protect_waves  # noqa: E402
from gateway.panel import step  # noqa: E402
from gateway.policy import load_policy  # noqa: E402
from state.file_state import open_file_state  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "adult.csv"
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"
HIGH = ">50K"


def panel(members: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the rows answered, every active member's truth per wave with its sampling weight)."""
    rng = np.random.default_rng(seed)
    adult = pd.read_csv(DATA, dtype=str, keep_default_na=False)
    order = rng.permutation(len(adult))
    taken = 0

    def take(n: int) -> pd.DataFrame:
        nonlocal taken
        rows = adult.iloc[order[taken : taken + n]].copy()
        rows["respondent_id"] = [f"r{i:06d}" for i in range(taken, taken + n)]
        taken += n
        return rows

    now = take(members)
    answered, truth = [], []
    for wave, (change, skip, join) in enumerate(
        ((0.0, 0.0, 0.0), (0.2, 0.2, 0.1), (0.0, 0.2, 0.05)), 1
    ):
        flip = rng.random(len(now)) < change
        now.loc[flip, "income"] = np.where(now.loc[flip, "income"] == HIGH, "<=50K", HIGH)
        new = take(int(members * join))
        now = pd.concat([now, new], ignore_index=True)
        present = rng.random(len(now)) >= skip
        present[len(now) - len(new) :] = True  # a new member answers the wave it joins
        truth.append(now.assign(wave=wave))
        answered.append(now[present].assign(wave=wave))
    return pd.concat(answered), pd.concat(truth)


def estimate(release: pd.DataFrame, matrix: list[list[float]]) -> tuple[float, float]:
    """The share of ">50K" by inversion of the weighted published shares, and its SE."""
    w = release["weight"].to_numpy(float)
    seen = np.array([np.sum(w * (release["income"] == c)) for c in ("<=50K", HIGH)]) / w.sum()
    inverse = np.linalg.inv(np.asarray(matrix))
    n_eff = w.sum() ** 2 / np.sum(w**2)
    cov = inverse @ ((np.diag(seen) - np.outer(seen, seen)) / n_eff) @ inverse.T
    return float((inverse @ seen)[1]), float(np.sqrt(cov[1, 1]))


@contextmanager
def carried_forward() -> Iterator[None]:
    """The engine with answers carried forward: no absent member's answer aged."""
    aged = step._aged
    step._aged = lambda policy, kind: ()  # no answer outside the claim aged
    try:
        yield
    finally:
        step._aged = aged


def run(rows: pd.DataFrame, truth: pd.DataFrame, secret: bytes) -> dict[str, Any]:
    policy = load_policy(POLICY)
    with tempfile.TemporaryDirectory(prefix="privgw-estimates-") as tmp:
        src, out = Path(tmp) / "panel.csv", Path(tmp) / "out.csv"
        rows.to_csv(src, index=False)
        (Path(tmp) / "secret.key").write_bytes(secret)
        (Path(tmp) / "secret.key").chmod(0o600)
        os.environ["PRIVGW_SECRET_FILE"] = str(Path(tmp) / "secret.key")
        started = time.process_time()
        protect_waves(src, policy, out, Path(tmp) / "state", open_file_state)
        seconds = time.process_time() - started
        published = pd.read_csv(out, dtype={"income": str})
        matrix = orjson.loads(out.with_name("out.csv.meta.json").read_bytes())
    matrix = matrix["randomized_response"]["income"]["matrix"]
    out_: dict[str, Any] = {"seconds": seconds}
    for wave in (1, 2, 3):
        est, se = estimate(published[published.wave == wave], matrix)
        t = truth[truth.wave == wave]
        w = t["fnlwgt"].astype(float)
        true = float(np.sum(w * (t["income"] == HIGH)) / w.sum())
        out_[wave] = (est, se, true)
    return out_


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=3000)
    ap.add_argument("--secrets", type=int, default=6)
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # each run's new state directory says it was created
    results: dict[str, list[dict[str, Any]]] = {"aged": [], "carried": []}
    for s in range(args.secrets):
        rows, truth = panel(args.members, seed=100 + s)
        secret = os.urandom(32)
        results["aged"].append(run(rows, truth, secret))
        with carried_forward():
            results["carried"].append(run(rows, truth, secret))
    print(f"{args.members} members, 3 waves, {args.secrets} panels and secrets")
    print(f"{'imputed answers':<16} {'wave':>4} {'error (points)':>15} {'mean z':>7} {'SE':>6}")
    for way, runs in results.items():
        for wave in (1, 2, 3):
            err = np.array([(r[wave][0] - r[wave][2]) * 100 for r in runs])
            z = np.array([(r[wave][0] - r[wave][2]) / r[wave][1] for r in runs])
            se = np.mean([r[wave][1] * 100 for r in runs])
            print(f"{way:<16} {wave:>4} {err.mean():>+15.2f} {z.mean():>+7.2f} {se:>6.2f}")
    for way, runs in results.items():
        est = np.array([(r[2][0] - r[1][0]) * 100 for r in runs])
        true = np.array([(r[2][2] - r[1][2]) * 100 for r in runs])
        cpu = np.mean([r["seconds"] for r in runs])
        print(
            f"{way}: net change wave 1 -> 2 {est.mean():+.2f} points (sd {est.std():.2f}) "
            f"against a true {true.mean():+.2f}; {cpu:.1f} s CPU a panel"
        )


if __name__ == "__main__":
    main()
