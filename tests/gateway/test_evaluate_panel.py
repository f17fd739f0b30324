"""`privgw evaluate` on a panel release: the published file's analysis
weights are used for its shares and estimates, and the raking's promise (each category's
weighted share within 1.5 points of the original's) is what evaluate reports and checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.files.panel_weights import share_gaps
from gateway.grouping.mixed_microaggregation import QIKind, claim_columns
from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy
from gateway.validation import Validator
from state.memory_store import MemoryStore
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"
SECRET = "evaluate-panel-secret-0123456789"  # evaluate pairs a panel's records by their keyed ids


def _release(tmp_path: Path) -> tuple[Path, Path]:
    """One wave of the simulated Adult panel through the engine as shipped: the original
    records and the published ones, row for row, as files."""
    policy = load_policy(POLICY)
    validator = Validator(policy)
    rows = list(PanelSurvey(respondents=8000, waves=1, seed=3, rows=load_rows()).records())
    records, keyring = [], Keyring(SECRET.encode())
    for i, row in enumerate(rows):
        rid, values = validator.decode_and_validate(*reversed(encode(row)))  # type: ignore[misc]
        records.append(ValidRecord(rid, values, SourceRef("in", 0, i, 0), 0.0))
    engine = Engine(policy, keyring=keyring, store=MemoryStore())
    result = engine.protect_window(records, now=0.0, flush_all=True)
    # a panel record carries no input position: matched to its respondent (in memory only)
    by_key = {p.respondent: orjson.loads(p.value) for p in result.published}
    keys = [keyring.respondent_key(str(row["respondent_id"])) for row in rows]
    assert set(by_key) == set(keys)
    original, protected = tmp_path / "wave1.csv", tmp_path / "wave1.protected.csv"
    pd.DataFrame(rows).to_csv(original, index=False)
    pd.DataFrame([by_key[key] for key in keys]).to_csv(protected, index=False)
    return original, protected


def test_evaluate_weighs_a_panel_release_by_its_analysis_weights(tmp_path: Path) -> None:
    original, protected = _release(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "evaluate", str(original), str(protected),
         "--policy", str(POLICY), "--json", "--report", str(tmp_path / "report.html")],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PRIVGW_SECRET": SECRET, "PRIVGW_SECRET_FILE": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    # the utility report's marginals are the release's weighted shares
    assert "published (weighted)" in (tmp_path / "report.html").read_text()
    gaps = result["weighted_shares"]
    policy = load_policy(POLICY)
    categorical = [c.name for c in claim_columns(policy) if c.kind is not QIKind.NUMERIC]
    assert categorical and set(categorical) <= set(gaps)
    # the raking's promise, with the targets rounded to k records
    assert all(gaps[q]["largest_gap_points"] <= 1.5 for q in categorical), gaps
    # the published means are the weighted means of the published values, the original's
    # those of the original values by their sampling weights
    prot, orig = pd.read_csv(protected), pd.read_csv(original)
    assert policy.weight is not None
    fnl = orig[policy.weight].to_numpy(dtype=float)
    w = prot["weight"].to_numpy(dtype=float)
    for name, est in result["weighted_estimates"].items():
        y = pd.to_numeric(prot[name], errors="coerce").to_numpy(dtype=float)
        x = pd.to_numeric(orig[name], errors="coerce").to_numpy(dtype=float)
        ok = np.isfinite(x) & np.isfinite(y)
        assert np.isclose(est["mean_published"], np.average(y[ok], weights=w[ok]))
        assert np.isclose(est["mean_original"], np.average(x[ok], weights=fnl[ok]))
    # the gap of one attribute, recomputed
    raw = pd.Series(fnl).groupby(orig["sex"].to_numpy()).sum() / fnl.sum()
    pub = pd.Series(w).groupby(prot["sex"].to_numpy()).sum() / w.sum()
    want = max(
        100 * abs(pub.get(c, 0.0) - raw.get(c, 0.0)) for c in set(raw.index) | set(pub.index)
    )
    assert np.isclose(gaps["sex"]["largest_gap_points"], want)


@settings(max_examples=50, deadline=None)
@given(
    cats=st.lists(st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=40),
    flips=st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_with_equal_weights_the_gaps_are_the_unweighted_ones(
    cats: list[str | None], flips: list[bool]
) -> None:
    pub = [("a" if f else c) for c, f in zip(cats, flips, strict=False)]
    raw_t, pub_t = pd.DataFrame({"q": cats}), pd.DataFrame({"q": pub})
    got = share_gaps(raw_t, pub_t, None, np.full(len(cats), 3.5))
    # a missing value is a category of its own (a label, not NaN: NaN keys never match)
    raw_s = raw_t["q"].fillna("<missing>").value_counts(normalize=True)
    pub_s = pub_t["q"].fillna("<missing>").value_counts(normalize=True)
    want = max(
        (
            100 * abs(pub_s.get(c, 0.0) - raw_s.get(c, 0.0))
            for c in set(raw_s.index) | set(pub_s.index)
        ),
        default=None,
    )
    if want is None:
        assert got == {}
    else:
        assert np.isclose(got["q"]["largest_gap_points"], want)
