"""The `privgw` file workflow, run as a user runs it: a subprocess on real files."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from statistics import NormalDist

import clikit
import orjson
import pandas as pd
import pytest

from gateway.engine.engine import Engine
from gateway.errors import PolicyError
from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy, policy_from_yaml
from state.memory_store import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"


privgw = functools.partial(clikit.privgw, check=True)  # a failed command fails the test


@pytest.fixture(scope="module")
def adult_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("adult") / "adult.csv"
    pd.read_csv(DATA / "adult.csv", dtype=str, keep_default_na=False).head(3000).to_csv(
        path, index=False
    )
    return path


@pytest.fixture(scope="module")
def protected(adult_sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("out") / "adult.protected.csv"
    privgw("protect", adult_sample, "--policy", POLICY, "-o", out, "--seed", "1")
    return out


def test_help_lists_every_command_with_an_example() -> None:
    top = privgw("--help").stdout
    commands = ["protect", "microaggregate", "evaluate", "ru-map", "check-policy", "reconstruct"]
    for cmd in commands:
        assert cmd in top
        assert "example:" in privgw(cmd, "--help").stdout


def test_protect_writes_protected_file_and_metadata(adult_sample: Path, protected: Path) -> None:
    orig = pd.read_csv(adult_sample, dtype=str, keep_default_na=False)
    prot = pd.read_csv(protected)
    assert len(prot) == len(orig)
    assert "education" not in prot.columns and "fnlwgt" not in prot.columns
    # k-anonymity on the whole quasi-identifier tuple, as published (missing as its own value)
    claim = load_policy(POLICY).k_claim
    groups = prot[claim].fillna("<missing>").astype(str).groupby(claim).size()
    assert groups.min() >= 5
    assert set(prot["marital_status"].dropna()) <= {
        "Married",
        "Never-married",
        "Previously-married",
    }
    # sensitive amounts: coded, noised, then rounded to 1000 (canary below): a true 0 still
    # publishes 0 only when its noise stays within ±500, with probability 2Φ(500/sd) − 1
    # for the window's sd = max(500, √0.1·S) (the sample is one window)
    coded = pd.to_numeric(orig["capital_gain"]).clip(0, 20000)
    sd = max(500.0, math.sqrt(0.1) * coded.std(ddof=1))
    p = 2 * NormalDist().cdf(500 / sd) - 1
    zeros = prot["capital_gain"][coded == 0]
    kept = float((zeros == 0).mean())
    assert abs(kept - p) < 4 * math.sqrt(p * (1 - p) / len(zeros))
    meta = orjson.loads(protected.with_name(protected.name + ".meta.json").read_bytes())
    assert set(meta["randomized_response"]) == {"occupation", "income"}


def test_protect_with_the_same_seed_is_reproducible(adult_sample: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    privgw("protect", adult_sample, "--policy", POLICY, "-o", a, "--seed", "5")
    privgw("protect", adult_sample, "--policy", POLICY, "-o", b, "--seed", "5")
    assert a.read_bytes() == b.read_bytes()
    assert len(a.read_bytes().splitlines()) == 3000


def test_evaluate_json_has_the_documented_keys(adult_sample: Path, protected: Path) -> None:
    out = privgw("evaluate", adult_sample, protected, "--policy", POLICY, "--json").stdout
    result = orjson.loads(out)
    for key in ["sse_sst_pct", "il1s", "il2", "il3", "dld", "interval_disclosure", "dr", "score"]:
        assert key in result, key
    assert 0 < result["sse_sst_pct"] < 100
    assert set(result["retention"]) == {"occupation", "income"}
    assert 0 < result["retention"]["income"] < 1


@pytest.mark.parametrize(
    ("setting", "said"), [("", "(unrounded)"), (", round_to: 50", "(rounded to 50)")]
)
def test_check_policy_names_a_published_weight(tmp_path: Path, setting: str, said: str) -> None:
    """A published sampling weight sits beside the k claim like role other, and is often unique
    (15,330 of Adult's 32,561): check-policy says so."""
    dropped = "fnlwgt:    {role: weight, type: numeric, method: drop}"
    policy = tmp_path / "weight.yaml"
    policy.write_text(
        POLICY.read_text().replace(dropped, dropped.replace("drop}", f"keep{setting}}}"))
    )
    text = privgw("check-policy", policy).stdout
    line = next(x for x in text.splitlines() if "(the sampling weight)" in x)
    assert f"fnlwgt {said}" in line and "round_to" in line
    assert (
        orjson.loads(privgw("check-policy", policy, "--json").stdout)["published_weight"]
        == "fnlwgt"
    )


@pytest.mark.parametrize(("slack", "said"), [(0, "never retires"), (2, "retires while")])
def test_check_policy_says_whether_a_panel_member_can_retire(
    tmp_path: Path, slack: int, said: str
) -> None:
    """Under slack 0 cohorts are of exactly k for the most part, and a member of one never
    retires: a panel losing members for good imputed them in every later wave (47 % of wave
    30's records in a probe) while the policy's retire_after_waves suggested otherwise."""
    policy = tmp_path / "slack.yaml"
    policy.write_text(
        POLICY.read_text().replace(
            "retire_after_waves: 3,", f"retire_after_waves: 3, slack: {slack},"
        )
    )
    line = next(x for x in privgw("check-policy", policy).stdout.splitlines() if "retirement:" in x)
    assert said in line
    statement = orjson.loads(privgw("check-policy", policy, "--json").stdout)["republication"]
    assert said in statement["retirement"]


def test_reconstruct_and_check_policy(protected: Path) -> None:
    est = orjson.loads(privgw("reconstruct", protected, "--policy", POLICY, "--json").stdout)
    assert abs(sum(est["income"]["em"]) - 1) < 1e-9
    text = privgw("check-policy", POLICY).stdout
    assert "epsilon" in text and "rho1=0.2" in text
    # what the k claim does not cover is said, not left to be inferred
    beside = next(line for line in text.splitlines() if line.startswith("published beside"))
    assert "wave (keep)" in beside and "submitted_at (coarsen)" in beside
    assert "education" not in beside and "fnlwgt" not in beside  # dropped: not published
    report = orjson.loads(privgw("check-policy", POLICY, "--json").stdout)
    assert report["published_outside_k_claim"] == ["wave", "submitted_at"]
    assert report["published_weight"] is None and "sampling weight" not in text
    income = report["attributes"]["income"]
    assert abs(income["gamma"] - 3.0) < 1e-9  # P[i][i] = 0.75 over 2 values: 0.75/0.25
    # noised amounts rounded to a reporting step: said, with what the analyst adds, and done
    assert "then rounded to a multiple of 1000" in text and "1000²/12 = 83,333" in text
    steps = {a: report["attributes"][a]["round_to"] for a in ("capital_gain", "capital_loss")}
    assert steps == {"capital_gain": 1000.0, "capital_loss": 200.0}
    published = pd.read_csv(protected)
    for name, step in steps.items():
        assert (published[name].dropna() % step == 0).all()
    # the input topic's retention a panel needs: its wave's records wait up to a week
    wait = report["longest_wait"]
    assert wait == {
        "seconds": 604_800.0,
        "setting": "republication.max_wave_seconds",
        "input_retention_ms": 2 * 604_800_000,
    }
    line = next(x for x in text.splitlines() if x.startswith("input topic:"))
    assert "7 days (republication.max_wave_seconds)" in line and "1209600000" in line


def test_microaggregate_census_like_sdcmicro(tmp_path: Path) -> None:
    out = tmp_path / "census.k3.csv"
    text = privgw("microaggregate", DATA / "census.csv", "--k", "3", "-o", out).stdout
    assert "k=3" in text
    masked = pd.read_csv(out)
    sizes = masked.groupby(list(masked.columns)).size()
    assert sizes.min() >= 3


def test_ru_map_draws_a_picture(adult_sample: Path, tmp_path: Path) -> None:
    png = tmp_path / "ru.png"
    text = privgw("ru-map", adult_sample, "--policy", POLICY, "--k", "2,5,10", "-o", png).stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len([line for line in text.splitlines() if line.strip()[:2] in {"2 ", "5 ", "10"}]) == 3


CANARY = "Zebra-Canary-77"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        ("missing_file", "input file not found"),
        ("semicolons", "separated by something else"),
        ("drop_column", "lacks: hours_per_week"),
        (
            "non_numeric",
            "column 'age' is numeric in the policy but has 1 non-numeric value(s), "
            "first at data row 3",
        ),
        (
            "unknown_category",
            "column 'occupation' has 1 value(s) outside the policy's categories, "
            "first at data row 2",
        ),
        ("extra_column", "column(s) not in the policy: notes"),
    ],
)
def test_bad_input_is_one_clear_error_without_values(
    adult_sample: Path, tmp_path: Path, mutate: str, expected: str
) -> None:
    df = pd.read_csv(adult_sample, dtype=str, keep_default_na=False).head(50)
    src = tmp_path / "in.csv"
    if mutate == "semicolons":
        df.to_csv(src, index=False, sep=";")
    elif mutate == "drop_column":
        df.drop(columns=["hours_per_week"]).to_csv(src, index=False)
    elif mutate == "non_numeric":
        df.loc[2, "age"] = CANARY
        df.to_csv(src, index=False)
    elif mutate == "unknown_category":
        df.loc[1, "occupation"] = CANARY
        df.to_csv(src, index=False)
    elif mutate == "extra_column":
        df["notes"] = CANARY
        df.to_csv(src, index=False)
    proc = privgw("protect", src, "--policy", POLICY, "-o", tmp_path / "o.csv", check=False)
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert CANARY not in proc.stderr + proc.stdout


def test_bad_policy_exits_2_with_the_key(tmp_path: Path, adult_sample: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text(POLICY.read_text().replace("  k: 5\n", "  k: 1\n"))
    proc = privgw("protect", adult_sample, "--policy", bad, "-o", tmp_path / "o.csv", check=False)
    assert proc.returncode == 2
    assert "microaggregation.k: k must be ≥ 2, got 1" in proc.stderr


def test_reconstruct_counts_a_release_published_again_once(protected: Path, tmp_path: Path) -> None:
    # a panel republishes every respondent's randomized answer, drawn once, in every wave: the
    # rows of three waves are one sample, not three (before, the SE shrank by sqrt(3))
    table = pd.read_csv(protected)
    assert "wave" not in table.columns, "adult.csv has no waves: update this test"
    waves = tmp_path / "waves.csv"
    pd.concat([table.assign(wave=w) for w in (1, 2, 3)]).to_csv(waves, index=False)
    waves.with_name("waves.csv.meta.json").write_bytes(
        protected.with_name(protected.name + ".meta.json").read_bytes()
    )

    def estimate(path: Path, *extra: str) -> dict:
        done = privgw("reconstruct", path, "--policy", POLICY, "--json", *extra)
        return orjson.loads(done.stdout)["income"]

    once, pooled, second = estimate(protected), estimate(waves), estimate(waves, "--wave", "2")
    for field in ("em", "em_se", "inversion", "inversion_se"):
        assert pooled[field] == pytest.approx(once[field], rel=1e-9)
        assert second[field] == pytest.approx(once[field], rel=1e-9)
    assert pooled["releases"] == 3 and "releases" not in second
    assert any("3 releases" in note for note in pooled["notes"])
    text = privgw("reconstruct", waves, "--policy", POLICY).stdout
    assert "the rows span 3 releases" in text and "--wave N" in text
    missing = clikit.privgw("reconstruct", waves, "--policy", POLICY, "--wave", "9")
    assert missing.returncode == 2
    assert "has no row of wave 9 (its waves: 1, 2, 3)" in missing.stderr
    bad = clikit.privgw("reconstruct", waves, "--policy", POLICY, "--wave", "1.5")
    assert bad.returncode == 2 and "--wave: must be a wave number" in bad.stderr
    unwaved = clikit.privgw("reconstruct", protected, "--policy", POLICY, "--wave", "1")
    assert unwaved.returncode == 2 and "has no wave column (wave)" in unwaved.stderr


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            "consistency: {mode: sticky}",
            "consistency: {mode: none}",
            "the stream, which republishes, refuses it",
        ),
        # the engine refused these only when a worker started (check-policy passed them)
        (
            "  algorithm: mdav\n",
            "  algorithm: mdav\n  strata: [race]\n  small_strata: suppress\n",
            "republication.mode panel does not form cohorts within strata",
        ),
        (
            "mode: panel,",
            "mode: regroup, slack: 1,",
            None,
        ),
        (
            "  algorithm: mdav\n",
            "  algorithm: mdav\n  strata: [race]\n  small_strata: merge\n",
            "microaggregation.small_strata merge pools the strata",
        ),
    ],
)
def test_check_policy_says_what_the_stream_refuses(
    tmp_path: Path, old: str, new: str, said: str | None
) -> None:
    policy = tmp_path / "p.yaml"
    text = POLICY.read_text()
    assert old in text
    policy.write_text(text.replace(old, new))
    out = privgw("check-policy", policy).stdout
    report = orjson.loads(privgw("check-policy", policy, "--json").stdout)
    refused = [line for line in out.splitlines() if "`privgw run` refuses this policy" in line]
    if said is None:
        assert refused == [] and report["stream_refusal"] is None, out
        return
    assert len(refused) == 1 and said in refused[0], out
    assert said in report["stream_refusal"]
    parsed = policy_from_yaml(policy.read_text())
    with pytest.raises(PolicyError, match=r"refuses it|does not form|merge pools"):
        Engine(parsed, keyring=Keyring(b"k" * 32), store=MemoryStore())  # what run builds
