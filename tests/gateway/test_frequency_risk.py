"""Frequency risk and SUDA2 against sdcMicro 5.8.1.

Every expected figure here comes from outside gateway.measures.frequency_risk and .suda:
* an independent computation in this file from the published formulas (pandas group sizes
  for fk and Fk; the Benedetti-Franconi approximation written out per record with math.log;
  MSUs by brute force over all subsets with Python tuples and Counters), or
* sdcMicro's own published outputs: its unit tests (tests/testthat/test_indivRisk.R,
  test_suda2.R) and the SDC practice guide's print of testdata (k-anonymity violations).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.commands.cli import main
from gateway.files.risk_files import file_risk
from gateway.measures.frequency_risk import MISSING, key_codes, measure_risk, sample_frequencies
from gateway.measures.suda import msu_weight, suda2

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
KEYS = ["urbrur", "roof", "walls", "water", "electcon", "relat", "sex"]
RTOL = 1e-9


@pytest.fixture(scope="module")
def testdata() -> pd.DataFrame:
    path = DATA / "testdata.csv"
    if not path.exists():
        pytest.skip(f"reference data not found: {path}")
    return pd.read_csv(path)


@pytest.fixture(scope="module")
def testdata_risk(testdata: pd.DataFrame):
    return file_risk(testdata, KEYS, weight="sampling_weight", k=3)


def _approx_risk(fk: float, pop_fk: float) -> float:
    """Franconi & Polettini (2004) approximation of the Benedetti-Franconi individual risk."""
    if fk == pop_fk:
        return 1.0 / fk
    p = fk / pop_fk
    if fk == 1:
        return p / (1 - p) * math.log(1 / p)
    if fk == 2:
        return p / (1 - p) - (p / (1 - p)) ** 2 * math.log(1 / p)
    return p / (fk - (1 - p))


def test_fk_population_fk_risk_and_global_figures_on_testdata(testdata, testdata_risk) -> None:
    freq, _, summary = testdata_risk
    groups = testdata.groupby(KEYS)
    fk = groups[KEYS[0]].transform("size").to_numpy(dtype=float)
    pop_fk = groups["sampling_weight"].transform("sum").to_numpy(dtype=float)
    np.testing.assert_allclose(freq.fk, fk, rtol=RTOL)
    np.testing.assert_allclose(freq.pop_fk, pop_fk, rtol=RTOL)
    risk = np.array([_approx_risk(a, b) for a, b in zip(fk, pop_fk, strict=True)])
    np.testing.assert_allclose(freq.risk, risk, rtol=RTOL)
    er = math.fsum(risk)
    assert summary["expected_reidentifications"] == pytest.approx(er, rel=RTOL)
    assert summary["global_risk"] == pytest.approx(er / len(testdata), rel=RTOL)
    assert summary["global_risk_pct"] == pytest.approx(100 * er / len(testdata), rel=RTOL)
    # sdcMicro's print of this file's sdcMicroObj (SDC practice guide, "sdcMicro" chapter):
    # "Number of observations violating - 2-anonymity: 157 - 3-anonymity: 281"
    assert summary["k_anonymity_violations"] == {"2": 157, "3": 281}
    assert summary["sample_uniques"] == int((fk == 1).sum())


# sdcMicro tests/testthat/test_indivRisk.R: freqCalc(sample_Data, keyVars=1:3, w=4) and
# indivRisk(method="approx", qual=1, survey=TRUE); published to 8-9 digits (expect_equal)
_SAMPLE = [2, 3, 2, 2, 3, 3, 1, 2, 3, 3, 3, 3, 3, 3, 4, 3, 1, 3, 1, 2, 1, 1, 1, 1]
_WEIGHTS = [18.0, 45.5, 39.0, 17.0, 92.0, 8.0, 123.5, 51]


def _sample(missing: bool) -> pd.DataFrame:
    vals = np.array(_SAMPLE, dtype=float)
    if missing:
        vals[[7, 18, 22]] = np.nan  # sdcMicro's NA positions in the column-major array
    frame = pd.DataFrame(vals.reshape(3, 8).T, columns=["A", "B", "C"])
    frame["weight"] = _WEIGHTS
    return frame


@pytest.mark.parametrize(
    ("missing", "published"),
    [
        (False, [0.01369863, 0.08579129, 0.01369863, 0.17707583, 0.01877883, 0.01877883,
                 0.03931625, 0.01369863]),
        (True, [0.013698630, 0.085791288, 0.010554090, 0.032466112, 0.009836066,
                0.009836066, 0.039316254, 0.005973716]),
    ],
)  # fmt: skip
def test_individual_risk_matches_sdcmicros_published_tests(
    missing: bool, published: list[float]
) -> None:
    risk = measure_risk(_sample(missing), ["A", "B", "C"], "weight").risk
    np.testing.assert_allclose(risk, published, rtol=0, atol=1.5e-8)
    unweighted = measure_risk(_sample(missing), ["A", "B", "C"]).risk  # survey = FALSE: 1/fk
    expected = [1 / 3, 1, 1 / 4, 1 / 2, 1 / 3, 1 / 3, 1, 1 / 5] if missing else None
    if expected is not None:
        np.testing.assert_allclose(unweighted, expected, rtol=RTOL)


def _compatible_counts(rows: list[tuple[int, ...]], w: list[float]) -> tuple[list, list]:
    """Brute force: records equal to row r wherever both have a value (missing = -1)."""
    fk, pop_fk = [], []
    for r in rows:
        match = [
            i
            for i, q in enumerate(rows)
            if all(a == b for a, b in zip(r, q, strict=True) if a != -1 and b != -1)
        ]
        fk.append(len(match))
        pop_fk.append(sum(w[i] for i in match))
    return fk, pop_fk


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda p: st.lists(
            st.tuples(st.tuples(*[st.integers(-1, 2)] * p), st.floats(1.0, 50.0, allow_nan=False)),
            min_size=1,
            max_size=25,
        )
    )
)
def test_missing_matches_anything(rows) -> None:
    keys = [r for r, _ in rows]
    w = [x for _, x in rows]
    fk, pop_fk = sample_frequencies(np.array(keys, dtype=np.int64), np.array(w))
    bf_fk, bf_pop = _compatible_counts(keys, w)
    np.testing.assert_array_equal(fk, bf_fk)
    np.testing.assert_allclose(pop_fk, bf_pop, rtol=1e-12)


def _brute_msus(rows: list[tuple], max_size: int) -> list[Counter]:
    """MSU sizes per record, by the definition: unique on S, no proper subset unique."""
    n, att = len(rows), len(rows[0])
    unique: dict[tuple[int, ...], set[int]] = {}
    out = [Counter() for _ in range(n)]
    for size in range(1, max_size + 1):
        for cols in combinations(range(att), size):
            counts = Counter(tuple(r[c] for c in cols) for r in rows)
            uniq = {i for i, r in enumerate(rows) if counts[tuple(r[c] for c in cols)] == 1}
            unique[cols] = uniq
            for i in uniq:
                if not any(
                    i in unique[sub] for s in range(1, size) for sub in combinations(cols, s)
                ):
                    out[i][size] += 1
    return out


def test_suda2_scores_on_testdata_by_brute_force(testdata, testdata_risk) -> None:
    _, suda, _ = testdata_risk
    rows = [tuple(r) for r in testdata[KEYS].itertuples(index=False)]
    att = len(KEYS)
    expected = [
        sum(math.factorial(att - size) * c for size, c in msus.items())
        for msus in _brute_msus(rows, att)
    ]
    np.testing.assert_allclose(suda.score, expected, rtol=RTOL)
    # DIS (Skinner & Elliot 2002), in double precision: U/Dis - U = P(1-f)/f
    sizes = testdata.groupby(KEYS)[KEYS[0]].transform("size").to_numpy()
    pairs, f = int((sizes == 2).sum()), 0.01
    q = 1 + (8 - att) / 20
    scored = np.asarray(expected) > 0
    adj = np.sum(np.asarray(expected)[scored] ** -q)
    dis = np.zeros(len(rows))
    dis[scored] = 1 / (1 + pairs * (1 - f) / f / (np.asarray(expected)[scored] ** q * adj))
    # sdcMicro computes the DIS terms in single precision: agreement to float32's 6e-8
    np.testing.assert_allclose(suda.dis, dis, rtol=1e-6)


def test_max_msu_size_follows_the_published_weight() -> None:
    # ATT = 4: with m = ATT the weights are (ATT - k)! (sdcMicro); with m = 3 they are
    # prod_{i=k}^{m} (ATT - i) (SDC practice guide): 6, 2, 1
    assert [msu_weight(k, 4, 4) for k in (1, 2, 3, 4)] == [6, 2, 1, 1]
    assert [msu_weight(k, 4, 3) for k in (1, 2, 3)] == [6, 2, 1]
    assert [msu_weight(k, 4, 2) for k in (1, 2)] == [6, 2]
    rows = [(1, 1, 1, 1), (1, 2, 1, 1), (2, 2, 1, 1), (1, 1, 2, 2), (2, 1, 3, 1)]
    codes = np.array(rows, dtype=np.int64)
    for m in (1, 2, 3):
        got = suda2(codes, max_msu=m).score
        brute = [
            sum(msu_weight(size, 4, m) * c for size, c in msus.items())
            for msus in _brute_msus(rows, m)
        ]
        np.testing.assert_array_equal(got, brute)


def test_suda2_matches_sdcmicros_published_tests() -> None:
    # tests/testthat/test_suda2.R, "suda2 book example" and "suda2 sdc guideline"
    book = pd.DataFrame(
        {
            "age": ["20s"] * 7 + ["60s"],
            "gender": ["male"] * 4 + ["female"] * 3 + ["male"],
            "income": ["50k+", "50k+"] + ["50k-"] * 6,
            "education": ["highschool"] * 4
            + ["university", "highschool", "middleschool", "university"],
        }
    )
    assert suda2(key_codes(book, list(book.columns))).score[4:8].tolist() == [4, 2, 6, 8]
    guide = pd.DataFrame(
        {
            "Residence": ["U", "U", "U", "U", "R", "U", "U", "U", "U", "U"],
            "Gender": ["F", "F", "F", "M", "F", "M", "F", "M", "F", "F"],
            "Education": ["SI", "SI", "PI", "SC", "SC", "SC", "PC", "PS", "SI", "SI"],
            "Labor": ["E", "E", "N", "E", "U", "E", "N", "U", "N", "N"],
        }
    )
    assert suda2(key_codes(guide, list(guide.columns))).score.tolist() == [
        0, 0, 6, 0, 12, 0, 6, 10, 0, 0
    ]  # fmt: skip


def test_suda2_on_testdata2_matches_sdcmicros_published_tests() -> None:
    path = DATA / "testdata2.csv"
    if not path.exists():
        pytest.skip(f"reference data not found: {path}")
    d2 = pd.read_csv(path)
    five = ["urbrur", "roof", "walls", "water", "sex"]
    assert suda2(key_codes(d2, five)).score[0] == 2  # "suda2 data frame"
    assert suda2(key_codes(d2, KEYS)).score[0] == 180  # "suda2 sdcObject original scores"


def test_missing_values_take_part_in_no_msu() -> None:
    codes = np.array([[0, 0, 0], [0, 1, MISSING], [1, 1, 0], [1, 0, 0]], dtype=np.int64)
    s = suda2(codes)
    # record 1 lacks the third value: its MSUs come from the first two columns only
    assert s.msu_counts[1].tolist() == [0, 1, 0]


def test_risk_command_writes_one_row_per_record_in_input_order(testdata, tmp_path) -> None:
    out = tmp_path / "risk.csv"
    src = DATA / "testdata.csv"
    assert main(["risk", str(src), "--keys", ",".join(KEYS), "--weight",
                 "sampling_weight", "-o", str(out)]) == 0  # fmt: skip
    table = pd.read_csv(out)
    assert list(table.columns) == ["fk", "Fk", "risk", "suda2_score", "suda2_dis"]
    assert len(table) == len(testdata)
    fk = testdata.groupby(KEYS)[KEYS[0]].transform("size").to_numpy()
    np.testing.assert_array_equal(table["fk"], fk)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--keys", "urbrur,nosuch"], "no column 'nosuch'"),
        (["--keys", "urbrur,sex", "--weight", "sex"], "also a key"),
        (["--keys", "urbrur,sex", "--weight", "income", "--max-msu", "3"], "--max-msu"),
        (["--keys", "urbrur,sex", "--weight", "savings"], "weight column"),
        (["--keys", "urbrur,urbrur"], "twice"),
    ],
)
def test_risk_command_refuses_bad_settings(argv, message, tmp_path, capsys) -> None:
    src = tmp_path / "in.csv"
    pd.DataFrame(
        {"urbrur": [1, 2, 1], "sex": [1, 1, 2], "income": [1.0, 2.0, 3.0], "savings": [1, 0, 2]}
    ).to_csv(src, index=False)
    assert main(["risk", str(src), *argv]) == 2
    assert message in capsys.readouterr().err


WITHOUT_EACH_KEY = (
    Path(__file__).resolve().parent / "data" / "sdcmicro" / ("testdata_risk_without_each_key.json")
)


def test_risk_by_variable_gives_the_reduced_keys_figures(testdata, tmp_path, capsys) -> None:
    # stored figures of each reduced key (their provenance is in the file)
    reference = json.loads(WITHOUT_EACH_KEY.read_text())["without"]
    src, out = DATA / "testdata.csv", tmp_path / "r.csv"
    combos = [["roof", "sex"], ["water", "relat", "sex"]]
    argv = ["risk", str(src), "--keys", ",".join(KEYS), "--weight", "sampling_weight"]
    assert main([*argv, "--by-variable", "--combinations", "roof+sex,water+relat+sex",
                 "--json", "-o", str(out)]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    full = report["full"]
    assert [e["left_out"] for e in report["by_variable"]] == KEYS
    for entry in report["by_variable"]:
        want = reference[entry["left_out"]]
        assert {name: entry[name] for name in want} == want  # exactly
        d = entry["change"]
        assert d["sample_uniques"] == want["sample_uniques"] - full["sample_uniques"]
        assert d["expected_reidentifications"] == pytest.approx(
            want["expected_reidentifications"] - full["expected_reidentifications"], abs=1e-12
        )
        for kk, v in want["k_anonymity_violations"].items():
            assert d["k_anonymity_violations"][kk] == v - full["k_anonymity_violations"][kk]
    # a combination is reported as the plain command reports its key set
    for entry, combo in zip(report["combinations"], combos, strict=True):
        assert main(["risk", str(src), "--keys", ",".join(combo), "--weight",
                     "sampling_weight", "--json"]) == 0  # fmt: skip
        assert entry == json.loads(capsys.readouterr().out)
    # per record: each key set's columns; fk of a reduced key by pandas group sizes
    table = pd.read_csv(out)
    assert len(table) == len(testdata)
    assert list(table.columns[:5]) == ["fk", "Fk", "risk", "suda2_score", "suda2_dis"]
    for name in KEYS:
        rest = [c for c in KEYS if c != name]
        fk = testdata.groupby(rest)[rest[0]].transform("size").to_numpy()
        np.testing.assert_array_equal(table[f"fk[without {name}]"], fk)
    fk = testdata.groupby(["roof", "sex"])["roof"].transform("size").to_numpy()
    np.testing.assert_array_equal(table["fk[roof+sex]"], fk)
    assert main([*argv, "--by-variable"]) == 0
    text = capsys.readouterr().out
    relat = reference["relat"]
    assert (
        f"without relat: sample uniques {relat['sample_uniques']} "
        f"({relat['sample_uniques'] - full['sample_uniques']:+d})"
    ) in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--keys", "urbrur", "--by-variable"], "--by-variable needs at least 2"),
        (["--keys", "urbrur,sex", "--combinations", "urbrur+income"], "not in --keys"),
        (["--keys", "urbrur,sex", "--combinations", "urbrur+urbrur"], "twice"),
    ],
)
def test_risk_by_variable_refuses_bad_settings(argv, message, tmp_path, capsys) -> None:
    src = tmp_path / "in.csv"
    pd.DataFrame({"urbrur": [1, 2, 1], "sex": [1, 1, 2], "income": [1, 2, 3]}).to_csv(src)
    assert main(["risk", str(src), *argv]) == 2
    assert message in capsys.readouterr().err


def test_missing_tokens_match_any_category(tmp_path) -> None:
    src, out = tmp_path / "in.csv", tmp_path / "r.csv"
    pd.DataFrame({"a": ["x", "x", "?"], "b": [1, 2, 1]}).to_csv(src, index=False)
    assert main(["risk", str(src), "--keys", "a,b", "-o", str(out)]) == 0
    assert pd.read_csv(out)["fk"].tolist() == [1, 1, 1]  # "?" a category of its own
    assert main(["risk", str(src), "--keys", "a,b", "--missing", "?", "-o", str(out)]) == 0
    assert pd.read_csv(out)["fk"].tolist() == [2, 1, 2]  # "?" matches x
