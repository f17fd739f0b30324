"""The utility report: one self-contained page, opened in a real browser (headless Chromium)."""

from __future__ import annotations

import contextlib
import html
import io
import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from gateway.commands.cli import main
from gateway.files.analysis import reconstruct_file
from gateway.measures.published import mechanisms_from_meta
from gateway.policy import MISSING_LABEL, load_policy

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"
BAR_BLUE = np.array([0x4C, 0x72, 0xB0]) / 255  # the "raw" bars of every marginal plot
BAR_GREEN = np.array([0x55, 0xA8, 0x68]) / 255  # the "reconstructed" bars
SHOT_HEIGHT = 6000  # the summary, the what-changed box and the marginals


@dataclass(frozen=True)
class Run:
    """The files of one protect + evaluate --report run, and what protect printed."""

    src: Path
    out: Path
    page: Path
    protect_stdout: str


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    if not (DATA / "adult.csv").exists():
        pytest.skip("reference data not found: adult.csv")
    tmp = tmp_path_factory.mktemp("report")
    src, out, page = tmp / "adult.csv", tmp / "adult.p.csv", tmp / "report.html"
    pd.read_csv(DATA / "adult.csv", dtype=str, keep_default_na=False).head(2000).to_csv(
        src, index=False
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["protect", str(src), "--policy", str(POLICY), "-o", str(out), "--seed", "1"])
    assert code == 0
    assert (
        main(["evaluate", str(src), str(out), "--policy", str(POLICY), "--report", str(page)]) == 0
    )
    return Run(src, out, page, printed.getvalue())


@pytest.fixture(scope="module")
def report(run: Run) -> Path:
    return run.page


def test_report_is_one_self_contained_page(report: Path) -> None:
    text = report.read_text(encoding="utf-8")
    sources = re.findall(r"src='([^']*)'", text) + re.findall(r'src="([^"]*)"', text)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    links = re.findall(r"href='([^']*)'", text) + re.findall(r'href="([^"]*)"', text)
    assert all(link.startswith("#") for link in links)  # links within the page only
    assert "http" not in text.split("<body>")[1]  # nothing to fetch
    for anchor in {link[1:] for link in links}:
        assert f"id='{anchor}'" in text  # every link has its target
    for heading in (
        "Summary",
        "Marginals",
        "Two-way table",
        "Correlation matrices",
        "Regression",
        "privgw evaluate",
    ):
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
        [*flags, f"--window-size=1200,{SHOT_HEIGHT}", f"--screenshot={shot}", report.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    import matplotlib.image as mpimg  # noqa: PLC0415

    pixels = mpimg.imread(shot)[..., :3]
    assert pixels.shape[:2] == (SHOT_HEIGHT, 1200)
    ink = (pixels < 0.9).any(axis=2).mean()
    assert ink > 0.03  # text, table rules and plots, not a blank page
    bars = (np.abs(pixels - BAR_BLUE) < 0.03).all(axis=2).sum()
    assert bars > 2000  # the marginal plots are drawn: their "raw" bars are on screen
    green = (np.abs(pixels - BAR_GREEN) < 0.03).all(axis=2).sum()
    assert green > 1000  # and the reconstructions of the randomized attributes


# -- the figures, read from the page as the browser renders it, against independent sums --


@pytest.fixture(scope="module")
def dom(report: Path) -> str:
    exe = _chromium()
    return subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


def _rows(table: str) -> list[list[str]]:
    return [
        [
            html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)
        ]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)
    ]


def _table_after(dom: str, heading: str) -> list[list[str]]:
    """The rows (header first) of the first table after ``heading``."""
    at = dom.index(heading)
    m = re.search(r"<table[^>]*>(.*?)</table>", dom[at:], re.S)
    assert m is not None, f"no table after {heading}"
    return _rows(m.group(1))


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


def _sse_sst_pct(x: np.ndarray, xm: np.ndarray) -> float:
    """100·SSE/SST on the original's standardisation, written out plainly."""
    mean, sd = x.mean(axis=0), x.std(axis=0, ddof=1)
    z, zm = (x - mean) / sd, (xm - mean) / sd
    return 100 * float(((z - zm) ** 2).sum()) / float(((z - z.mean(axis=0)) ** 2).sum())


def test_summary_labels_name_the_columns_their_figures_cover(run: Run, dom: str) -> None:
    policy = load_policy(POLICY)
    orig, prot = pd.read_csv(run.src), pd.read_csv(run.out)
    rows = re.findall(
        r'<tr data-figure="([^"]*)" data-columns="([^"]*)"><td>([^<]*)</td><td[^>]*>([^<]*)</td>'
        r"<td>([^<]*)</td></tr>",
        dom,
    )
    assert rows, "the browser rendered no summary rows"
    sse = {}
    for figure, cols, label, shown, value in rows:
        named = [c for c in cols.split(",") if c]
        assert shown.replace(" ", "") == cols  # the visible columns are the covered ones
        if "numeric quasi-identifiers" in label:
            assert named == policy.numeric_claim, label
        if m := re.search(r"all (\d+) numeric attributes", label):
            assert len(named) == int(m.group(1)), label
        if "the k claim" in label:
            assert named == policy.k_claim, label
        if figure == "sse_sst_pct":
            x, xm = orig[named].to_numpy(float), prot[named].to_numpy(float)
            assert _number(value) == pytest.approx(_sse_sst_pct(x, xm), abs=6e-5), label
            sse[label] = _number(value)
    assert len(sse) == 2  # the quasi-identifiers' and every compared numeric attribute's
    # protect prints the same figure for the same columns under the same name
    qi = ", ".join(policy.numeric_claim)
    printed = re.search(
        rf"sse_sst_pct \(numeric quasi-identifiers: {re.escape(qi)}\): ([0-9.]+)",
        run.protect_stdout,
    )
    assert printed is not None, run.protect_stdout
    assert sse["SSE/SST (%), numeric quasi-identifiers"] == pytest.approx(
        float(printed.group(1)), abs=1e-4
    )


def test_em_shares_are_reconstructs_renormalised_with_their_standard_errors(
    run: Run, dom: str
) -> None:
    policy = load_policy(POLICY)
    rec = reconstruct_file(run.out, policy)["occupation"]  # what `privgw reconstruct` prints
    cats, em = rec["categories"], np.array(rec["em"])
    miss = cats.index(MISSING_LABEL)
    rows = _table_after(dom, "occupation: all ")
    header, body = rows[0], rows[1:]
    assert header[3] == f"EM (privgw reconstruct, renormalised without {MISSING_LABEL})"
    assert len(body) == len(cats) - 1
    # the SEs of the renormalised shares r = π_S / (1 − π_missing): the observed information
    # of the likelihood reparametrised in (r_1..r_{m-2}, π_missing), inverted
    meta = orjson.loads((Path(str(run.out) + ".meta.json")).read_bytes())
    mech = mechanisms_from_meta(meta)["occupation"]
    counts = np.array(rec["observed"]) * rec["n"]
    order = [i for i in range(len(cats)) if i != miss] + [miss]
    p = mech.matrix[:, order]  # columns: the answered categories, then the missing one
    pi = em[order]
    r = pi[:-1] / (1 - pi[-1])

    def loglik(theta: np.ndarray) -> float:
        rr = np.append(theta[:-1], 1.0 - theta[:-1].sum())
        v = np.append(rr * (1 - theta[-1]), theta[-1])
        return float(counts @ np.log(p @ v))

    theta0 = np.append(r[:-1], pi[-1])
    k, h = theta0.size, 1e-5
    hess = np.empty((k, k))
    for a in range(k):
        for b in range(k):
            ea, eb = np.eye(k)[a] * h, np.eye(k)[b] * h
            hess[a, b] = (
                loglik(theta0 + ea + eb)
                - loglik(theta0 + ea - eb)
                - loglik(theta0 - ea + eb)
                + loglik(theta0 - ea - eb)
            ) / (4 * h * h)
    cov_free = np.linalg.inv(-hess)[:-1, :-1]
    jac = np.vstack([np.eye(k - 1), -np.ones((1, k - 1))])
    se = np.sqrt(np.diag(jac @ cov_free @ jac.T))
    answered = [cats[i] for i in order[:-1]]
    for row in body:
        i = answered.index(row[0])
        assert _number(row[3]) == pytest.approx(r[i], abs=6e-5), row
        assert _number(row[4]) == pytest.approx(se[i], abs=2e-4), row
    # the shown rows are the same numbers, and say how many are cut
    shown = _table_after(dom, "<h3>occupation</h3>")
    assert shown[1:] == body[: len(shown) - 1]
    assert f"{len(shown) - 1} of {len(body)} categories shown" in dom
    assert 'href="#full-occupation"' in dom and 'id="full-occupation"' in dom


def test_weighted_estimates_and_coefficients_carry_standard_errors(run: Run, dom: str) -> None:
    orig, prot = pd.read_csv(run.src), pd.read_csv(run.out)
    w = orig["fnlwgt"].to_numpy(float)
    n = len(w)
    rows = _table_after(dom, "<h2>Weighted estimates</h2>")
    assert rows[0][:7] == [
        "attribute",
        "mean original",
        "± SE",
        "mean published",
        "± SE",
        "difference / SE(original)",
        "flag",
    ]
    for row in rows[1:]:
        for col, at in ((orig[row[0]], 1), (prot[row[0]], 3)):
            y = col.to_numpy(float)
            mean = math.fsum(w * y) / math.fsum(w)
            # linearised variance of a ratio of two Horvitz-Thompson totals
            lin = [wi * (yi - mean) for wi, yi in zip(w, y, strict=True)]
            var = n / (n - 1) * math.fsum(v * v for v in lin) / math.fsum(w) ** 2
            assert _number(row[at]) == pytest.approx(mean, abs=6e-5)
            assert _number(row[at + 1]) == pytest.approx(math.sqrt(var), abs=6e-5)
        z = (_number(row[3]) - _number(row[1])) / _number(row[2])
        assert _number(row[5]) == pytest.approx(z, abs=2e-3)
        assert (row[6] == "moved > 2 SE") == (abs(z) > 2)
    # the regression: the sandwich SE of OLS on √w-scaled data (the weighted fit's HC1 SE)
    rows = _table_after(dom, "<h2>Regression: ")
    model = re.search(r"<h2>Regression: (\w+) ~ ([^<(]*)", dom)
    assert model is not None
    y_name, preds = model.group(1), [t.strip() for t in model.group(2).split("+")]
    for frame, at in ((orig, 1), (prot, 3)):
        sw = np.sqrt(w)
        xs = np.column_stack([np.ones(n), frame[preds].to_numpy(float)]) * sw[:, None]
        ys = frame[y_name].to_numpy(float) * sw
        beta = np.linalg.lstsq(xs, ys, rcond=None)[0]
        e = ys - xs @ beta
        bread = np.linalg.pinv(xs.T @ xs)
        meat = sum(ei * ei * np.outer(xi, xi) for xi, ei in zip(xs, e, strict=True))
        se = np.sqrt(np.diag(bread @ meat @ bread) * n / (n - xs.shape[1]))
        for i, row in enumerate(rows[1:]):
            assert _number(row[at]) == pytest.approx(beta[i], rel=1e-3, abs=6e-5), row
            assert _number(row[at + 1]) == pytest.approx(se[i], rel=1e-3, abs=6e-5), row
    for row in rows[1:]:
        z = (_number(row[3]) - _number(row[1])) / _number(row[2])
        assert (row[7] == "moved > 2 SE") == (abs(_number(row[6])) > 2)
        assert _number(row[6]) == pytest.approx(z, rel=0.05, abs=0.05)  # from rounded cells
    assert any(row[7] for row in rows[1:])  # capital_gain's coefficient moves (top-coding)


def test_the_changes_box_counts_what_protection_did(run: Run, dom: str) -> None:
    policy = load_policy(POLICY)
    orig = pd.read_csv(run.src, dtype=str, keep_default_na=False)
    prot = pd.read_csv(run.out, dtype=str, keep_default_na=False)
    rows = _table_after(dom, 'id="changes"')
    found = {(r[0], r[1]): (int(r[2]), int(r[3])) for r in rows[1:]}
    for name in ("capital_gain", "capital_loss"):
        coding = policy.attributes[name].coding
        assert coding is not None and coding.top is not None
        x = pd.to_numeric(orig[name]).to_numpy()
        assert found[name, f"top-coded at {coding.top:g}"] == (int((x > coding.top).sum()), len(x))
    summary = dict(
        re.findall(
            r'data-figure="changed_categories" data-columns="(\w+)">.*?<td>([0-9.]+)</td></tr>', dom
        )
    )
    assert summary
    for name, share in summary.items():
        changed, of = found[name, "category changed by the microaggregation"]
        assert changed / of == pytest.approx(float(share), abs=6e-5)
        missing = MISSING_LABEL if policy.attributes[name].missing_is_category else None
        a = orig[name].map(lambda v, m=missing: m if v in ("?", "") else v)
        b = prot[name].map(lambda v, m=missing: m if v in ("?", "") else v)
        if policy.attributes[name].hierarchy is not None:
            a = a.map(lambda v, h=policy.attributes[name].hierarchy.levels[0]: h.get(v, v))
        both = a.notna() & b.notna()
        assert changed == int((a[both] != b[both]).sum()), name
    dropped = [n for n, a in policy.attributes.items() if a.method.value == "drop" and n in orig]
    for name in dropped:
        assert found[name, "not published"] == (len(orig), len(orig))


def test_cut_tables_say_so_and_link_the_full_table(run: Run, dom: str) -> None:
    orig = pd.read_csv(run.src, dtype=str, keep_default_na=False)
    countries = orig["native_country"][~orig["native_country"].isin(["?", ""])].nunique()
    assert countries > 12
    assert f"12 of {countries} categories shown" in dom
    full = _table_after(dom, 'id="full-native_country"')
    assert len(full) - 1 == countries
    shown = _table_after(dom, "<h3>native_country</h3>")
    assert len(shown) - 1 == 12 and shown[1:] == full[1:13]
    assert "of 2 sex categories × 6 of " in dom  # the two-way table's cut


def test_the_correlation_scale_is_centred_and_spans_the_correlations() -> None:
    from gateway.files.report_plots import correlation_limit  # noqa: PLC0415

    c = np.array([[1.0, 0.07, -0.12], [0.07, 1.0, 0.03], [-0.12, 0.03, 1.0]])
    assert correlation_limit(c, c * 0.5) == pytest.approx(0.15)  # not ±1: colours show
    assert correlation_limit(np.eye(3)) == pytest.approx(0.05)
