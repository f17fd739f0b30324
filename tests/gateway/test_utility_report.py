"""The utility report: one self-contained page, opened in a real browser (headless Chromium)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gateway.cli import main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"
BAR_BLUE = np.array([0x4C, 0x72, 0xB0]) / 255  # the "raw" bars of every marginal plot


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (DATA / "adult.csv").exists():
        pytest.skip("reference data not found: adult.csv")
    tmp = tmp_path_factory.mktemp("report")
    src, out, page = tmp / "adult.csv", tmp / "adult.p.csv", tmp / "report.html"
    pd.read_csv(DATA / "adult.csv", dtype=str, keep_default_na=False).head(2000).to_csv(
        src, index=False
    )
    assert main(["protect", str(src), "--policy", str(POLICY), "-o", str(out), "--seed", "1"]) == 0
    assert main(["evaluate", str(src), str(out), "--policy", str(POLICY), "--report",
                 str(page)]) == 0  # fmt: skip
    return page


def test_report_is_one_self_contained_page(report: Path) -> None:
    text = report.read_text(encoding="utf-8")
    sources = re.findall(r"src='([^']*)'", text) + re.findall(r'src="([^"]*)"', text)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "href=" not in text and "http" not in text.split("<body>")[1]  # nothing to fetch
    for heading in ("Summary", "Marginals", "Two-way table", "Correlation matrices",
                    "Regression", "privgw evaluate"):  # fmt: skip
        assert heading in text


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip(
            "headless Chromium is not installed (scripts/test installs Debian's chromium when "
            "run as root); the browser check of the report needs it"
        )
    return exe


def test_report_renders_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    exe = _chromium()
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        [*flags, "--dump-dom", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    body = re.search(r"<body ([^>]*)>", dom)
    assert body is not None, "the browser rendered no body"
    attrs = dict(re.findall(r'data-([a-z-]+)="(\d+)"', body.group(1)))
    assert int(attrs["images"]) >= 5 and attrs["images-loaded"] == attrs["images"]
    assert int(attrs["tables"]) >= 5
    shot = tmp_path / "report.png"
    subprocess.run(
        [*flags, "--window-size=1200,2400", f"--screenshot={shot}", report.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    import matplotlib.image as mpimg  # noqa: PLC0415

    pixels = mpimg.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2400, 1200)
    ink = (pixels < 0.9).any(axis=2).mean()
    assert ink > 0.03  # text, table rules and plots, not a blank page
    bars = (np.abs(pixels - BAR_BLUE) < 0.03).all(axis=2).sum()
    assert bars > 2000  # the marginal plots are drawn: their "raw" bars are on screen
