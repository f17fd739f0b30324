"""What one file command writes, the next reads: a protected file is evaluated and
reconstructed under the policy that protected it (categories coded as numbers, missing and
suppressed cells, recoded keys), its metadata describes that policy, and `privgw
microaggregate` changes the columns it groups and no other cell (real data, in-process CLI)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.commands.cli import main
from gateway.policy import load_policy

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT.parent / "shared" / "data"
RECODE = ROOT / "deploy" / "policies" / "adult_recode.yaml"
ADULT = ROOT / "deploy" / "policies" / "adult.yaml"

# sdcMicro's testdata: every category a number (water 1..9, sex 1..2), as surveys code them
CODED = """name: coded
input: {topic: t.in, extra_fields: ignore, missing_tokens: [""]}
output: {topic: t.out}
microaggregation: {k: 3, algorithm: mdav, standardize: true}
attributes:
  age: {role: quasi_identifier, type: numeric, method: microaggregation}
  income: {role: quasi_identifier, type: numeric, method: microaggregation}
  sex: {role: quasi_identifier, type: categorical, method: microaggregation,
        categories: ["1", "2"]}
  water: {role: sensitive, type: categorical, method: randomized_response,
          categories: ["1", "2", "3", "4", "5", "6", "7", "9"],
          rr: {mode: uniform, retention: 0.7}}
"""


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def coded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    tmp = tmp_path_factory.mktemp("coded")
    (tmp / "coded.yaml").write_text(CODED)
    frame = pd.read_csv(DATA / "testdata.csv", dtype=str, keep_default_na=False)
    return tmp, frame[["age", "income", "sex", "water"]].head(600)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    water=st.lists(st.integers(0, 599), max_size=5, unique=True),
    age=st.lists(st.integers(0, 599), max_size=3, unique=True),
)
def test_a_protected_file_with_coded_categories_reads_back_whatever_cells_are_missing(
    coded: tuple[Path, pd.DataFrame],
    capsys: pytest.CaptureFixture[str],
    water: list[int],
    age: list[int],
) -> None:
    """Missing answers (water) and a record suppressed for its missing age leave empty cells
    in the protected file; the codes must still read as the policy's categories, not 3.0."""
    tmp, frame = coded
    frame = frame.copy()
    frame.loc[water, "water"] = ""
    frame.loc[age, "age"] = ""
    src, out, policy = tmp / "in.csv", tmp / "out.csv", tmp / "coded.yaml"
    frame.to_csv(src, index=False)
    assert run(capsys, "protect", src, "--policy", policy, "-o", out, "--seed", "1")[0] == 0
    code, text, err = run(capsys, "reconstruct", out, "--policy", policy, "--json")
    assert code == 0, err
    published = pd.read_csv(out, dtype=str, keep_default_na=False)
    answered = int((published["water"] != "").sum())
    assert orjson.loads(text)["water"]["n"] == answered
    code, text, err = run(capsys, "evaluate", src, out, "--policy", policy, "--json")
    assert code == 0, err
    assert 0.0 <= orjson.loads(text)["retention"]["water"] <= 1.0


def test_reconstruct_with_no_randomized_value_says_so(
    coded: tuple[Path, pd.DataFrame], capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed nothing and exited 0: a file whose randomized column is all missing."""
    tmp, frame = coded
    src, out, policy = tmp / "unanswered.csv", tmp / "unanswered.out.csv", tmp / "coded.yaml"
    frame.assign(water="").to_csv(src, index=False)
    assert run(capsys, "protect", src, "--policy", policy, "-o", out, "--seed", "1")[0] == 0
    code, _, err = run(capsys, "reconstruct", out, "--policy", policy)
    assert code == 2
    assert (
        f"{out}: no randomized value to reconstruct from (600 rows; randomized attributes: water)"
        in err
    )


@pytest.fixture(scope="module")
def recoded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    tmp = tmp_path_factory.mktemp("recoded")
    adult = pd.read_csv(DATA / "adult.csv", dtype=str, keep_default_na=False).head(2000)
    src, out = tmp / "adult.csv", tmp / "out.csv"
    adult.to_csv(src, index=False)
    assert main(["protect", str(src), "--policy", str(RECODE), "-o", str(out), "--seed", "1"]) == 0
    return src, out, str(RECODE)


def test_a_recoded_file_carries_its_own_policy_and_reconstructs(
    recoded: tuple[Path, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The engine publishes a recoding's other attributes under a policy of its own; the
    metadata must still name the file's policy, its claim and its methods."""
    _, out, policy_path = recoded
    policy = load_policy(policy_path)
    meta = orjson.loads(Path(f"{out}.meta.json").read_bytes())
    assert meta["policy_version"] == policy.version
    assert meta["microaggregation"] == "recode_suppress"
    assert meta["k_claim"]["k"] == policy.microaggregation.k
    assert meta["microaggregated"] == policy.k_claim
    assert set(meta["quasi_identifier_kinds"]) == set(policy.k_claim)
    assert not set(meta["unprotected_quasi_identifiers"]) & set(policy.k_claim)
    assert {n: meta["methods"][n] for n in policy.attributes} == {
        n: a.method.value for n, a in policy.attributes.items()
    }
    code, _, err = run(capsys, "reconstruct", out, "--policy", policy_path)
    assert code == 0, err


def test_protect_counts_the_key_cells_it_suppressed(
    recoded: tuple[Path, Path, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    src, _, policy_path = recoded
    out = tmp_path / "again.csv"
    code, text, err = run(capsys, "protect", src, "--policy", policy_path, "-o", out, "--seed", "1")
    assert code == 0, err
    cells = int(text.split("keys recoded, ")[1].split(" key cells suppressed")[0])
    keys = load_policy(policy_path).k_claim
    before = pd.read_csv(src, dtype=str, keep_default_na=False)[keys]
    after = pd.read_csv(out, dtype=str, keep_default_na=False)[keys]
    # every key cell that had an answer and is published empty was suppressed
    emptied = int(((after == "") & ~before.isin(["", "?"])).to_numpy().sum())
    assert emptied > 0 and cells >= emptied


def test_evaluate_measures_a_recoded_file_by_the_means_of_its_intervals(
    recoded: tuple[Path, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/policy.md: each published interval stands for the mean of its originals, a
    suppressed number for the overall mean."""
    src, out, policy_path = recoded
    code, text, err = run(capsys, "evaluate", src, out, "--policy", policy_path, "--json")
    assert code == 0, err
    figure = orjson.loads(text)["numeric_quasi_identifiers"]
    names = figure["columns"]
    x = pd.read_csv(src)[names].astype(float)
    published = pd.read_csv(out, dtype=str, keep_default_na=False)[names]
    stand = pd.DataFrame(index=x.index)
    for name in names:
        label = published[name]
        means = x[name].groupby(label).transform("mean")
        stand[name] = np.where(label == "", x[name].mean(), means)
    sd = x.std(ddof=1)  # on the standardized columns [DM02]
    sse = (((x - stand) / sd) ** 2).to_numpy().sum()
    sst = (((x - x.mean()) / sd) ** 2).to_numpy().sum()
    assert figure["sse_sst_pct"] == pytest.approx(100 * sse / sst, rel=1e-9)
    assert 0 < figure["sse_sst_pct"] < 100


def test_microaggregate_leaves_every_other_cell_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Leading zeros, "NA"-like text and number spellings in the columns not grouped are
    published as read, byte for byte."""
    rng = np.random.default_rng(7)
    n = 40
    odd = ["NA", "N/A", "null", "nan", "None", "#N/A", "", "1e3", "1.50", " lead"]
    frame = pd.DataFrame(
        {
            "zip": [f"{i:05d}" for i in rng.integers(0, 999, n)],
            "note": [odd[i % len(odd)] for i in range(n)],
            "big": [str(12345678901234567890 + i) for i in range(n)],
            "x": [f"{v:.6f}" for v in rng.normal(size=n)],
            "y": [str(v) for v in rng.integers(0, 100, n)],
        }
    )
    src, out = tmp_path / "in.csv", tmp_path / "out.csv"
    frame.to_csv(src, index=False)
    code, _, err = run(capsys, "microaggregate", src, "--k", "3", "--columns", "x,y", "-o", out)
    assert code == 0, err
    after = pd.read_csv(out, dtype=str, keep_default_na=False)
    before = pd.read_csv(src, dtype=str, keep_default_na=False)
    pd.testing.assert_frame_equal(after[["zip", "note", "big"]], before[["zip", "note", "big"]])
    assert (after[["x", "y"]] != before[["x", "y"]]).to_numpy().any()


@pytest.mark.parametrize(
    ("cell", "needle"),
    [("true", "is numeric but for 1 value(s), first at data row 3"), ('"9"', None)],
)
def test_microaggregate_leaves_no_numeric_column_out_unsaid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cell: str, needle: str | None
) -> None:
    """JSON's true in a column of numbers, or every number written as a string, must not drop
    the column from "all numeric columns" (it would be published raw)."""
    rows = [{"age": 20 + i, "income": 1000 * i} for i in range(12)]
    lines = [orjson.dumps(r).decode() for r in rows]
    if needle is None:  # every age a string
        lines = [orjson.dumps({**r, "age": str(r["age"])}).decode() for r in rows]
    else:
        lines[2] = lines[2].replace('"age":22', f'"age":{cell}')
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    code, _, err = run(capsys, "microaggregate", src, "--k", "3", "-o", tmp_path / "o.jsonl")
    assert code == 2 and "column 'age'" in err, err
    assert needle is None or needle in err
    if needle is not None:  # named: true is not the number 1
        named = ("--k", "3", "--columns", "age", "-o", tmp_path / "p.jsonl")
        code, _, err = run(capsys, "microaggregate", src, *named)
        assert code == 2 and "column 'age' has 1 non-numeric value(s)" in err, err


def test_evaluate_names_a_column_it_cannot_measure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    census = pd.read_csv(DATA / "census.csv", dtype=str, keep_default_na=False).head(200)
    src = tmp_path / "census.csv"
    census.to_csv(src, index=False)
    typo, empty = census.copy(), census.copy()
    typo.loc[17, "AGI"] = "x7"
    empty["AGI"] = ""
    typo.to_csv(tmp_path / "typo.csv", index=False)
    empty.to_csv(tmp_path / "empty.csv", index=False)
    code, _, err = run(capsys, "evaluate", src, tmp_path / "typo.csv")
    assert code == 2 and "column 'AGI' has 1 non-numeric value(s)" in err, err
    code, text, err = run(capsys, "evaluate", src, tmp_path / "empty.csv", "--json")
    assert code == 0, err
    result = orjson.loads(text)
    assert result["columns_without_values"] == ["AGI"] and "AGI" not in result["columns"]
    assert result["excluded_incomplete_rows"] == 0


def test_protect_says_a_file_of_several_waves_is_one_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    adult = pd.read_csv(DATA / "adult.csv", dtype=str, keep_default_na=False).head(200)
    src = tmp_path / "waves.csv"
    for waves, expect in ((["1"], False), (["1", "2"], True)):
        adult.assign(wave=[waves[i % len(waves)] for i in range(len(adult))]).to_csv(
            src, index=False
        )
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="gateway.files.protect"):
            code, _, err = run(capsys, "protect", src, "--policy", ADULT, "-o", tmp_path / "o.csv")
        assert code == 0, err
        said = any("is protected as one release" in r.getMessage() for r in caplog.records)
        assert said is expect
