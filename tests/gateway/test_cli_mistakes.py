"""User mistakes on the file commands: each one exits 2 with one line naming the setting and the
fix, before any work and without any data value (never `internal error`, exit 70)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import orjson
import pytest

from gateway.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"
SECRET_VALUE = "Zq9"  # a cell value that must never appear in a message


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.err


def assert_clear(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("privgw: error: "), err
    assert "internal error" not in err and "Traceback" not in err
    assert SECRET_VALUE not in err
    for needle in needles:
        assert needle in err, err


def add_column(table: Path, name: str, value: str, *, row_7: str) -> None:
    """Append column ``name`` to a CSV: ``value`` in every data row but the 7th, ``row_7``."""
    lines = table.read_text().splitlines()
    values = [value] * (len(lines) - 1)
    values[6] = row_7
    rows = [f"{line},{v}" for line, v in zip(lines[1:], values, strict=True)]
    table.write_text("\n".join([f"{lines[0]},{name}", *rows]) + "\n")


@pytest.fixture
def adult(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small Adult extract in its own directory (the cwd of the test)."""
    lines = (ROOT.parent / "shared" / "data" / "adult.csv").read_text().splitlines()[:301]
    path = tmp_path / "adult.csv"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    return path


@pytest.mark.parametrize(
    ("command", "out", "needles"),
    [
        ("protect", "out.txt", ("-o out.txt", "must end in one of .csv")),
        ("protect", "afile/out.csv", ("-o afile/out.csv", "afile is a file, not a directory")),
        ("protect", "adir.csv", ("-o adir.csv is a directory",)),
        ("microaggregate", "out.xlsx", ("-o out.xlsx", "must end in one of .csv")),
        ("microaggregate", "afile/m.csv", ("afile is a file, not a directory",)),
        ("ru-map", "ru.txt", ("-o ru.txt", "must end in one of .pdf, .png, .svg")),
        ("ru-map", "afile/ru.png", ("afile is a file, not a directory",)),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_up_front(
    capsys: pytest.CaptureFixture[str],
    adult: Path,
    command: str,
    out: str,
    needles: tuple[str, ...],
) -> None:
    (adult.parent / "afile").write_text("")
    (adult.parent / "adir.csv").mkdir()
    extra = {
        "protect": ["--policy", POLICY],
        "microaggregate": ["--k", "3"],
        "ru-map": ["--policy", POLICY, "--k", "2,3"],
    }[command]
    code, err = run(capsys, command, adult.name, *extra, "-o", out)
    assert_clear(code, err, *needles)


@pytest.mark.parametrize("how", ["same", "relative", "symlink", "hardlink", "missing-dir"])
@pytest.mark.parametrize("command", ["protect", "microaggregate"])
def test_an_output_that_is_the_input_is_refused(
    capsys: pytest.CaptureFixture[str], adult: Path, how: str, command: str
) -> None:
    before = adult.read_bytes()
    if how == "symlink":
        (adult.parent / "link.csv").symlink_to(adult)
    if how == "hardlink":  # issue 45, item 2: the same inode under another name was rewritten
        (adult.parent / "link.csv").hardlink_to(adult)
        assert (adult.parent / "link.csv").stat().st_ino == adult.stat().st_ino
    out = {
        "same": adult.name,
        "relative": f"../{adult.parent.name}/./adult.csv",
        "missing-dir": "nonexistent/../adult.csv",  # issue 32, item 4: written over the input
    }.get(how, "link.csv")
    extra = ["--policy", POLICY] if command == "protect" else ["--k", "3", "--columns", "age"]
    code, err = run(capsys, command, adult.name, *extra, "-o", out)
    assert_clear(code, err, f"-o {Path(out)}", "is the input file", "another file")
    assert adult.read_bytes() == before
    assert not (adult.parent / "nonexistent").exists()  # refused before any work


@pytest.mark.parametrize("target", ["input", "policy"])
def test_a_meta_file_that_is_an_input_is_refused(
    capsys: pytest.CaptureFixture[str], adult: Path, tmp_path: Path, target: str
) -> None:
    """Issue 32, item 4: OUT.meta.json was never checked against the inputs (a symlink there,
    or an input of that name, was overwritten with the metadata)."""
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY.read_text())
    victim = adult if target == "input" else policy
    before = victim.read_bytes()
    (adult.parent / "out.csv.meta.json").symlink_to(victim)
    code, err = run(capsys, "protect", adult.name, "--policy", policy, "-o", "out.csv")
    assert_clear(code, err, "out.csv.meta.json is the input file", "another file")
    assert victim.read_bytes() == before and not (adult.parent / "out.csv").exists()


@pytest.mark.parametrize("p", ["0", "150", "nan", "-5"])
def test_evaluate_p_outside_0_100_is_refused(
    capsys: pytest.CaptureFixture[str], adult: Path, p: str
) -> None:
    code, err = run(capsys, "evaluate", adult, adult, "--p", p)
    assert_clear(code, err, "--p must be a percentage in (0, 100]")


def test_protect_negative_seed_is_refused(capsys: pytest.CaptureFixture[str], adult: Path) -> None:
    code, err = run(capsys, "protect", adult, "--policy", POLICY, "-o", "o.csv", "--seed", "-1")
    assert_clear(code, err, "--seed must be a whole number ≥ 0")
    assert not Path("o.csv").exists()


def test_evaluate_files_without_common_columns_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("age,hours\n" + "".join(f"{i},{i + 1}\n" for i in range(20)))
    b.write_text("Age,Hours\n" + "".join(f"{i},{i + 1}\n" for i in range(20)))
    code, err = run(capsys, "evaluate", a, b)
    assert_clear(code, err, "no numeric column in common", "same header")


def test_microaggregate_refuses_a_numeric_column_with_a_typo(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    src = tmp_path / "census.csv"
    rows = [f"{20 + i},{1000 + 7 * i},{i % 3}" for i in range(30)]
    rows[17] = f"37,{SECRET_VALUE},2"  # one mistyped cell makes the column text
    src.write_text("age,income,size\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out.csv"
    code, err = run(capsys, "microaggregate", src, "--k", "3", "-o", out)
    assert_clear(code, err, "column 'income'", "data row 18", "--columns")
    assert not out.exists()  # not published with the column unchanged


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        (f"1,2,{SECRET_VALUE}\n3,4\n5,6,7\n", ("line 3 has fewer cells (2)", "header (3)")),
        (f"1,2,{SECRET_VALUE}\n3,4,5,6\n", ("line 3 has more cells (4)",)),
    ],
)
def test_csv_rows_of_the_wrong_length_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, body: str, needles: tuple[str, ...]
) -> None:
    src = tmp_path / "rows.csv"
    src.write_text("a,b,c\n" + body)
    code, err = run(capsys, "microaggregate", src, "--k", "2", "-o", tmp_path / "o.csv")
    assert_clear(code, err, *needles)


def test_a_header_naming_a_column_twice_is_refused(
    capsys: pytest.CaptureFixture[str], adult: Path, tmp_path: Path
) -> None:
    lines = adult.read_text().splitlines()
    dup = tmp_path / "dup.csv"
    dup.write_text("\n".join([lines[0] + ",age"] + [line + ",99" for line in lines[1:]]) + "\n")
    code, err = run(capsys, "protect", dup, "--policy", POLICY, "-o", tmp_path / "o.csv")
    assert_clear(code, err, "the header names column(s) twice: age")


def test_a_jsonl_line_naming_a_field_twice_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"age": 30, "hours": 40}\n{"age": 500, "hours": 41, "age": 39}\n')
    code, err = run(capsys, "microaggregate", src, "--k", "2", "-o", tmp_path / "o.jsonl")
    assert_clear(code, err, "line 2 names a field twice")


FINE_GRAIN = """
attributes:
  c:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [a, b, c, d, e, f]
    rr: {mode: fine_grain, gamma: 4}
"""


def test_check_policy_shows_the_invertible_matrix_protect_uses(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Skewed data, fine grain without weights: `protect` weighs by the data's frequencies.
    The matrix must stay invertible (else reconstruct prints nan/inf), and check-policy
    --data must show that very matrix."""
    policy = tmp_path / "p.yaml"
    policy.write_text(FINE_GRAIN)
    rng = np.random.default_rng(2)
    values = rng.choice(list("abcdef"), size=3000, p=[0.9, 0.05, 0.02, 0.01, 0.01, 0.01])
    src = tmp_path / "skewed.csv"
    src.write_text("c\n" + "\n".join(values) + "\n")
    out = tmp_path / "out.csv"
    assert main(["protect", str(src), "--policy", str(policy), "-o", str(out), "--seed", "1"]) == 0
    meta = orjson.loads(out.with_name("out.csv.meta.json").read_bytes())
    used = np.array(meta["randomized_response"]["c"]["matrix"])
    assert np.linalg.matrix_rank(used) == 6
    capsys.readouterr()

    assert main(["check-policy", str(policy), "--data", str(src), "--json"]) == 0
    shown = orjson.loads(capsys.readouterr().out)["attributes"]["c"]
    np.testing.assert_allclose(np.array(shown["matrix"]), used, atol=1e-6)
    assert "skewed.csv's value frequencies" in shown["note"]
    assert main(["check-policy", str(policy), "--json"]) == 0
    equal = orjson.loads(capsys.readouterr().out)["attributes"]["c"]
    assert "equal weights, the matrix `privgw run` uses" in equal["note"]

    assert main(["reconstruct", str(out), "--policy", str(policy), "--json"]) == 0
    est = orjson.loads(capsys.readouterr().out)["c"]
    assert np.all(np.isfinite(est["inversion"])) and np.all(np.isfinite(est["em"]))
    assert abs(est["inversion"][0] - 0.9) < 0.05


# -- issue 32, item 9: what ended as "internal error" (exit 70) -------------------------------


def test_protect_on_fewer_than_k_rows_is_refused_before_writing(
    capsys: pytest.CaptureFixture[str], adult: Path
) -> None:
    few = adult.parent / "few.csv"
    few.write_text("\n".join(adult.read_text().splitlines()[:4]) + "\n")
    code, err = run(capsys, "protect", few, "--policy", POLICY, "-o", "out.csv")
    assert_clear(code, err, "3 data rows, fewer than k = 5", "at least 5 rows")
    assert not (adult.parent / "out.csv").exists()


@pytest.mark.parametrize("meta", [b"{bad", b"[1, 2]"])
def test_reconstruct_with_a_corrupt_meta_file_names_it(
    capsys: pytest.CaptureFixture[str], adult: Path, meta: bytes
) -> None:
    code, _ = run(capsys, "protect", adult, "--policy", POLICY, "-o", "p.csv", "--seed", "1")
    assert code == 0
    (adult.parent / "p.csv.meta.json").write_bytes(meta)
    code, err = run(capsys, "reconstruct", "p.csv", "--policy", POLICY)
    assert_clear(code, err, "p.csv.meta.json is not the JSON object", "protect the data again")


def test_secret_create_under_a_file_names_it(
    capsys: pytest.CaptureFixture[str], adult: Path
) -> None:
    (adult.parent / "afile").write_text("")
    code, err = run(capsys, "secret", "create", "afile/x.key")
    assert_clear(code, err, "afile is not a directory", "x.key")


# -- issue 45, item 1: a valid timestamp with no UTC instant ended as "internal error" ---------


@pytest.mark.parametrize("text", ["9999-12-31T23:00:00-01:00", "0001-01-01T00:30:00+01:00"])
def test_protect_refuses_a_timestamp_outside_utc_naming_column_and_row(
    capsys: pytest.CaptureFixture[str], adult: Path, tmp_path: Path, text: str
) -> None:
    policy = tmp_path / "hourly.yaml"
    policy.write_text(POLICY.read_text().replace("coarsen: {unit: day}", "coarsen: {unit: hour}"))
    add_column(adult, "submitted_at", "2024-05-06T04:10:00+02:00", row_7=text)
    code, err = run(capsys, "protect", adult, "--policy", policy, "-o", "out.csv")
    assert_clear(code, err, "column 'submitted_at'", "representable range", "first at data row 7")
    assert text not in err and not (adult.parent / "out.csv").exists()


def test_a_policy_read_from_dev_zero_is_refused_naming_the_cap(
    capsys: pytest.CaptureFixture[str], adult: Path
) -> None:
    """Issue 45, item 9: it ran out of memory (exit 70, or killed)."""
    code, err = run(capsys, "protect", adult, "--policy", "/dev/zero", "-o", "out.csv")
    assert_clear(code, err, "policy file /dev/zero is larger than the 1024 KiB")


def test_a_policy_not_in_utf8_is_refused_naming_the_byte(
    capsys: pytest.CaptureFixture[str], adult: Path, tmp_path: Path
) -> None:
    policy = tmp_path / "latin1.yaml"
    policy.write_bytes(POLICY.read_bytes().replace(b"adult-survey", b"caf\xe9-survey", 1))
    code, err = run(capsys, "protect", adult, "--policy", policy, "-o", "out.csv")
    assert_clear(code, err, f"policy file {policy} is not UTF-8 text (byte ", "save it as UTF-8")


# -- values no squared distance survives, and a file whose every key is suppressed -------------


@pytest.mark.parametrize("value", ["1e308", "-1e150", "inf", "-Infinity"])
@pytest.mark.parametrize("command", ["protect", "microaggregate"])
def test_a_value_whose_square_overflows_is_refused_naming_column_and_row(
    capsys: pytest.CaptureFixture[str], adult: Path, value: str, command: str
) -> None:
    lines = adult.read_text().splitlines()
    lines[7] = value + lines[7][lines[7].index(",") :]  # data row 7's age
    adult.write_text("\n".join(lines) + "\n")
    args = ["--policy", POLICY] if command == "protect" else ["--k", "3", "--columns", "age"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning on the way to the message
        code, err = run(capsys, command, adult, *args, "-o", "out.csv")
    what = "1 infinite value(s)" if "inf" in value.lower() else "1 value(s) beyond ±1e+100"
    assert_clear(code, err, f"column 'age' has {what}, first at data row 7")
    assert value not in err.replace("infinite", "") and not (adult.parent / "out.csv").exists()


def test_protect_reports_a_file_whose_every_key_is_suppressed(
    capsys: pytest.CaptureFixture[str], adult: Path
) -> None:
    """A numeric quasi-identifier missing in every row: every key is suppressed, the file is
    written, and the summary says no key was published to link (it ended as internal error)."""
    lines = adult.read_text().splitlines()
    adult.write_text(
        "\n".join([lines[0], *("?" + line[line.index(",") :] for line in lines[1:])]) + "\n"
    )
    code = main(["protect", str(adult), "--policy", str(POLICY), "-o", "out.csv", "--seed", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"protected {len(lines) - 1} of {len(lines) - 1} records" in out
    assert f"{len(lines) - 1} suppressed" in out
    assert "whole-key record linkage: none published" in out
    rows = (adult.parent / "out.csv").read_text().splitlines()
    header = rows[0].split(",")
    assert len(rows) == len(lines)
    for row in rows[1:]:
        cells = dict(zip(header, row.split(","), strict=True))
        assert cells["age"] == cells["sex"] == cells["race"] == ""


@pytest.mark.parametrize("command", ["protect", "risk"])
@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("", "empty (no header row)"),
        ("LONG", "a field is longer than 131,072 characters"),
    ],
)
def test_an_empty_file_or_an_overlong_field_is_named(
    capsys: pytest.CaptureFixture[str], adult: Path, command: str, content: str, said: str
) -> None:
    if content == "LONG":  # e.g. a quote left open: the rest of the file is one field
        lines = adult.read_text().splitlines()
        lines[1] = lines[1].replace("United-States", SECRET_VALUE * 50_000)
        content = "\n".join(lines) + "\n"
    adult.write_text(content)
    args = ["--policy", POLICY, "-o", "out.csv"] if command == "protect" else ["--keys", "sex"]
    code, err = run(capsys, command, adult, *args)
    assert_clear(code, err, f"adult.csv: {said}")


@pytest.mark.parametrize(
    ("wave", "said"),
    [
        ("1.5", "is the wave number but has 1 value(s) that are not whole numbers"),
        ("2147483648", "has 1 value(s) outside the policy's range [0, 2147483647]"),
        ("-1", "has 1 value(s) outside the policy's range [0, 2147483647]"),
    ],
)
def test_a_wave_that_is_no_wave_number_is_refused_naming_column_and_row(
    capsys: pytest.CaptureFixture[str], adult: Path, wave: str, said: str
) -> None:
    add_column(adult, "wave", "1", row_7=wave)
    code, err = run(capsys, "protect", adult, "--policy", POLICY, "-o", "out.csv")
    assert_clear(code, err, f"column 'wave' {said}, first at data row 7")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("risk", "HEADER", "--keys", "sex,race"), "adult.csv: no data rows, no key to count"),
        (("risk", "HEADER", "--keys", "sex", "--weight", "fnlwgt"), "no data rows"),
        (("evaluate", "HEADER", "HEADER"), "adult.csv: no data rows to evaluate"),
        (("evaluate", "HEADER", "HEADER", "--policy", POLICY), "no data rows to evaluate"),
    ],
)
def test_a_file_of_a_header_only_is_named(
    capsys: pytest.CaptureFixture[str], adult: Path, args: tuple[str | Path, ...], said: str
) -> None:
    adult.write_text(adult.read_text().splitlines()[0] + "\n")
    code, err = run(capsys, *(adult if a == "HEADER" else a for a in args))
    assert_clear(code, err, said)


@pytest.mark.parametrize("command", ["risk", "kanon"])
@pytest.mark.parametrize("cell", [{"v": SECRET_VALUE}, [SECRET_VALUE, 1]])
def test_a_key_cell_that_is_a_json_object_or_array_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, cell: object
) -> None:
    rows = [{"a": "x", "b": i % 3} for i in range(9)]
    rows[5]["a"] = cell  # type: ignore[assignment]
    src = tmp_path / "keys.jsonl"
    src.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    extra = ["--k", "3", "-o", tmp_path / "o.jsonl"] if command == "kanon" else []
    code, err = run(capsys, command, src, "--keys", "a,b", *extra)
    assert_clear(code, err, "column 'a' holds a JSON object or array at data row 6")


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, Path]:
    """A publication history of two waves and its ground truth (record_id -> respondent)."""
    hist, truth = [], []
    for i in range(12):
        for wave in (1, 2):
            rid = f"r{i}_{wave}"
            hist.append({"record_id": rid, "wave": wave, "occ": "ab"[i % 2], "age": 30 + i % 3})
            truth.append({"record_id": rid, "respondent_id": f"p{i}", "occ": "ab"[i % 2]})
    paths = tmp_path / "hist.jsonl", tmp_path / "truth.jsonl"
    for path, rows in zip(paths, (hist, truth), strict=True):
        path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    return paths


def _rewrite(path: Path, row: int, change: dict[str, object], drop: str | None = None) -> None:
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    rows[row].update(change)
    if drop is not None:
        del rows[row][drop]
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")


@pytest.mark.parametrize(
    ("args", "edit", "said"),
    [
        (("--t", "abc"), None, "--t must be whole numbers ≥ 1 separated by commas"),
        (("--t", "0,-1"), None, "--t: every number of releases must be ≥ 1"),
        (("--k", "0"), None, "--k must be ≥ 2, got 0"),
        (("--k", "-3"), None, "--k must be ≥ 2, got -3"),
        (("--qi", "NOPE"), None, "no column 'NOPE' in the history; fix the name"),
        (("--attribute", "NOPE"), None, "no column 'NOPE' in the history"),
        (("--sticky", "NOPE"), None, "no column 'NOPE' in the history"),
        ((), ("hist", 3, {}, "record_id"), "the history: row 4 has no record_id"),
        ((), ("truth", 0, {}, "respondent_id"), "--truth: row 1 has no respondent_id"),
        ((), ("hist", 5, {"wave": "two"}, None), "the history's waves mix numbers and text"),
        ((), ("hist", 6, {"age": {"v": SECRET_VALUE}}, None), "'age' holds a JSON object"),
        ((), ("hist", 2, {"wave": [1, SECRET_VALUE]}, None), "'wave' holds a JSON object"),
        ((), ("truth", 1, {"respondent_id": {"v": SECRET_VALUE}}, None), "'respondent_id' holds"),
    ],
)
def test_attack_settings_and_histories_it_cannot_read_are_named(
    capsys: pytest.CaptureFixture[str],
    history: tuple[Path, Path],
    args: tuple[str, ...],
    edit: tuple[str, int, dict[str, object], str | None] | None,
    said: str,
) -> None:
    hist, truth = history
    if edit is not None:
        _rewrite(hist if edit[0] == "hist" else truth, *edit[1:])
    base = ["--truth", truth, "--attribute", "occ", "--qi", "age"]
    code, err = run(capsys, "attack", hist, *base, *args)
    assert_clear(code, err, said)


@pytest.mark.parametrize("args", [("--sticky", "occ"), ("--truth", "TRUTH")])
def test_attack_without_quasi_identifiers_says_so_rather_than_skipping_the_intruder(
    capsys: pytest.CaptureFixture[str], history: tuple[Path, Path], args: tuple[str, ...]
) -> None:
    """A file history carries no release metadata: the sticky-value and intersection intruders
    need --qi, and running without them would print a history's size and nothing it found."""
    hist, truth = history
    given = [truth if a == "TRUTH" else a for a in args]
    code, err = run(capsys, "attack", hist, *given)
    assert_clear(code, err, "the history names no quasi-identifier columns")
    code, err = run(capsys, "attack", hist, *given, "--qi", "age")
    assert code == 0, err


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("retention: 1.0", "attributes.income.rr.retention must be in [1/m, 1)"),
        ("epsilon: 1000", "attributes.income.rr.epsilon must be ≤ 700"),
    ],
)
def test_a_randomized_attributes_impossible_mechanism_names_the_attribute(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, setting: str, said: str
) -> None:
    """The Adult policy randomizes two attributes: an error in one's rr says which."""
    text = POLICY.read_text()
    income = "rr: {mode: uniform, retention: 0.75}"
    assert text.count(income) == 1, "the Adult policy changed: update this test"
    policy = tmp_path / "p.yaml"
    policy.write_text(text.replace(income, "rr: {mode: uniform, " + setting + "}"))
    code, err = run(capsys, "check-policy", policy)
    assert_clear(code, err, said)
