"""`protect`'s OUT.meta.json gives each noised attribute's noise sd as applied: the policy's
sd is only its floor (the larger of it and √ratio·S is drawn with), and an analyst
deconvolving a published distribution needs the sd itself."""

from __future__ import annotations

from pathlib import Path

import clikit
import numpy as np
import orjson
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT.parent / "shared" / "data"
ADULT = ROOT / "deploy" / "policies" / "adult.yaml"


def test_the_published_sd_is_the_sd_of_the_noise_drawn(tmp_path: Path) -> None:
    policy = tmp_path / "unrounded.yaml"
    text = ADULT.read_text()
    assert "    round_to: 1000\n" in text
    policy.write_text(text.replace("    round_to: 1000\n", ""))  # capital_gain: noise alone
    src, out = tmp_path / "adult.csv", tmp_path / "out.csv"
    pd.read_csv(DATA / "adult.csv", dtype=str, keep_default_na=False).head(6000).to_csv(
        src, index=False
    )
    proc = clikit.privgw("protect", src, "--policy", policy, "-o", out, "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    meta = orjson.loads(out.with_name("out.csv.meta.json").read_bytes())
    sd = meta["noise_sd_applied"]["capital_gain"]
    assert sd > meta["noise"]["capital_gain"]["sd"]  # the window's spread sets it here
    true = np.clip(pd.read_csv(src)["capital_gain"].to_numpy(float), 0, 20000)  # coded
    noise = pd.read_csv(out)["capital_gain"].to_numpy(float) - true
    n = noise.size
    # (n-1)·s²/σ² is χ² with n-1 degrees of freedom for Gaussian noise of sd σ
    statistic = (n - 1) * noise.var(ddof=1) / sd**2
    assert stats.chi2.ppf(0.0005, n - 1) < statistic < stats.chi2.ppf(0.9995, n - 1)


def test_blocks_publish_each_blocks_sd_with_its_rows(tmp_path: Path) -> None:
    """Beyond the memory budget each block applies noise at its own values' sd; the metadata
    gave none (the last block's engine's). Now each block's sd with its rows: the published
    noise is their mixture, whose sum of squares the sds predict."""
    policy = tmp_path / "unrounded.yaml"
    policy.write_text(ADULT.read_text().replace("    round_to: 1000\n", ""))
    src, out = tmp_path / "adult.csv", tmp_path / "out.csv"
    pd.read_csv(DATA / "adult.csv", dtype=str, keep_default_na=False).head(9000).to_csv(
        src, index=False
    )
    proc = clikit.privgw("protect", src, "--policy", policy, "-o", out, "--seed", "3",
                         "--block-rows", "3000")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    meta = orjson.loads(out.with_name("out.csv.meta.json").read_bytes())
    blocks = meta["noise_sd_applied_by_block"]
    assert len(blocks) > 1 and sum(b["rows"] for b in blocks) == 9000
    variances = np.array([b["capital_gain"] ** 2 for b in blocks])
    rows = np.array([b["rows"] for b in blocks])
    true = np.clip(pd.read_csv(src)["capital_gain"].to_numpy(float), 0, 20000)
    noise = pd.read_csv(out)["capital_gain"].to_numpy(float) - true
    # Σe² has mean Σ n_b σ_b² and variance 2 Σ n_b σ_b⁴ (Gaussian noise, independent draws)
    z = (np.sum(noise**2) - rows @ variances) / np.sqrt(2 * rows @ variances**2)
    assert abs(z) < 3.5, z
