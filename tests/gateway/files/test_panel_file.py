"""`privgw protect --state-dir`: a panel file's waves published as successive releases on a
state a later file continues, as the stream publishes them. Checked on the command's own
output files against the panel's promise: every member in every wave, k within each wave and
over the history for every member's linked set, the same published randomized answer for an
unchanged true one, and a decided wave published again as it was, never decided twice."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import clikit
import numpy as np
import orjson
import pandas as pd
import pytest

from gateway.keyed.keyed import Keyring, load_secret
from gateway.panel.output import panel_record_ids
from gateway.policy import load_policy
from stream_jobs.commands.simulator import PanelSurvey, load_rows

ROOT = Path(__file__).resolve().parents[3]
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"
K = 5


@pytest.fixture(scope="module")
def panel(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three waves of 300 respondents, 30 % skipping each later wave, in two files (waves 1-2,
    then 3), protected on one state."""
    d = tmp_path_factory.mktemp("panel")
    secret = d / "secret.key"
    assert clikit.privgw("secret", "create", secret).returncode == 0
    survey = PanelSurvey(respondents=300, waves=3, change_share=0.1, new_share=0.05, seed=5,
                         rows=load_rows())  # fmt: skip
    df = pd.DataFrame(list(survey.records()))
    rng = np.random.default_rng(8)
    df = df[~((df.wave > 1) & (rng.random(len(df)) < 0.3))]
    env = {"PRIVGW_SECRET_FILE": str(secret)}
    outs = []
    for name, rows in (("w12", df[df.wave <= 2]), ("w3", df[df.wave == 3])):
        rows.to_csv(d / f"{name}.csv", index=False)
        out = d / f"{name}.out.csv"
        proc = clikit.privgw("protect", d / f"{name}.csv", "--policy", POLICY, "-o", out,
                             "--state-dir", d / "state", env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        outs.append(pd.read_csv(out, keep_default_na=False, dtype=str))
    keys = Keyring(load_secret({"PRIVGW_SECRET_FILE": str(secret)})).respondent_keys(
        sorted(df.respondent_id.astype(str).unique())
    )
    owner = {}
    for rid, key in zip(sorted(df.respondent_id.astype(str).unique()), keys, strict=True):
        for wave in (1, 2, 3):
            owner[panel_record_ids([key], wave)[0]] = rid
    return {"dir": d, "env": env, "input": df, "out": pd.concat(outs), "owner": owner}


def test_every_member_is_published_once_in_every_wave(panel: dict[str, Any]) -> None:
    out, owner, df = panel["out"], panel["owner"], panel["input"]
    assert out.record_id.map(owner).notna().all()  # every record a member's (keyed ids)
    members: set[str] = set()
    for wave in (1, 2, 3):
        members |= set(df[df.wave == wave].respondent_id.astype(str))
        published = out[out.wave == str(wave)].record_id.map(owner)
        assert published.is_unique and set(published) == members, wave  # absent: imputed
    assert (out.weight != "").all()


def test_k_holds_within_each_wave_and_for_every_linked_set(panel: dict[str, Any]) -> None:
    out, owner = panel["out"], panel["owner"]
    qi = list(load_policy(POLICY).k_claim)
    linked: dict[str, set[str]] = {}
    for _, release in out.groupby("wave"):
        classes = release.groupby(qi).record_id.agg(lambda ids: {owner[i] for i in ids})
        assert classes.map(len).min() >= K
        for members in classes:
            for m in members:
                linked[m] = linked[m] & members if m in linked else set(members)
    assert min(len(s) for s in linked.values()) >= K


def test_an_unchanged_answer_publishes_the_same_randomized_value(panel: dict[str, Any]) -> None:
    out, owner, df = panel["out"], panel["owner"], panel["input"]
    rows = zip(out.record_id, out.wave, out.income, strict=True)
    published = {(owner[r], w): v for r, w, v in rows}
    truth: dict[str, dict[int, str]] = defaultdict(dict)
    for rid, wave, income in zip(df.respondent_id.astype(str), df.wave, df.income, strict=True):
        truth[rid][int(wave)] = income
    pairs = [
        (published[(rid, str(a))], published[(rid, str(b))])
        for rid, answers in truth.items()
        for a, b in ((1, 2), (2, 3), (1, 3))
        if a in answers and b in answers and answers[a] == answers[b]
    ]
    assert len(pairs) > 100
    assert all(x == y for x, y in pairs)  # 25 % of them would differ with fresh draws


def test_a_decided_wave_is_published_again_as_it_was(panel: dict[str, Any]) -> None:
    """Output lost after the state was written (a full disk) is recovered by running the same
    file again: the waves are republished from the state, byte for byte, and nothing else in
    the state changes."""
    d = panel["dir"]
    for name in ("w12", "w3"):
        again = d / f"{name}.again.csv"
        proc = clikit.privgw("protect", d / f"{name}.csv", "--policy", POLICY, "-o", again,
                             "--state-dir", d / "state", env=panel["env"])  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "decided before: published again as it was" in proc.stdout
        assert again.read_bytes() == (d / f"{name}.out.csv").read_bytes()


def test_a_wave_older_than_the_outcomes_kept_is_refused(tmp_path: Path) -> None:
    env = {"PRIVGW_SECRET_FILE": str(tmp_path / "secret.key")}
    assert clikit.privgw("secret", "create", tmp_path / "secret.key").returncode == 0
    survey = PanelSurvey(respondents=60, waves=6, seed=2, rows=load_rows())
    df = pd.DataFrame(list(survey.records()))
    df.to_csv(tmp_path / "all.csv", index=False)
    df[df.wave == 1].to_csv(tmp_path / "w1.csv", index=False)
    run = ("--policy", POLICY, "--state-dir", tmp_path / "state")
    proc = clikit.privgw("protect", tmp_path / "all.csv", "-o", tmp_path / "all.out.csv", *run,
                         env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    before = (tmp_path / "state" / "state.db").read_bytes()
    proc = clikit.privgw("protect", tmp_path / "w1.csv", "-o", tmp_path / "w1.out.csv", *run,
                         env=env)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "wave 1 was decided in" in proc.stderr and "too long ago" in proc.stderr
    assert "protect the waves after 6" in proc.stderr
    assert (tmp_path / "state" / "state.db").read_bytes() == before
    assert not (tmp_path / "w1.out.csv").exists()


@pytest.mark.parametrize(
    ("extra", "env", "said"),
    [
        (["--seed", "1"], True, "--seed and --state-dir exclude each other"),
        ([], False, "PRIVGW_SECRET"),
    ],
)
def test_a_state_run_without_its_secret_or_with_a_seed_is_refused(
    panel: dict[str, Any], tmp_path: Path, extra: list[str], env: bool, said: str
) -> None:
    proc = clikit.privgw("protect", panel["dir"] / "w12.csv", "--policy", POLICY, "-o",
                         tmp_path / "o.csv", "--state-dir", tmp_path / "state", *extra,
                         env=panel["env"] if env else {"PRIVGW_SECRET_FILE": ""})  # fmt: skip
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "o.csv").exists()


def test_without_a_state_a_file_repeating_respondents_is_refused(
    panel: dict[str, Any], tmp_path: Path
) -> None:
    # one release counted k in rows (a respondent's waves filled its own class) and drew each
    # row's answers afresh, which a majority vote over the waves undid
    proc = clikit.privgw("protect", panel["dir"] / "w12.csv", "--policy", POLICY, "-o",
                         tmp_path / "o.csv")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "row(s) repeat a respondent ('respondent_id'), first at data row 301" in proc.stderr
    assert "--state-dir" in proc.stderr and not (tmp_path / "o.csv").exists()


def test_the_metadata_gives_each_waves_counts_and_how_to_analyse_it(panel: dict[str, Any]) -> None:
    """OUT.meta.json has each wave's counts (its imputed members among them, as the stream's
    metrics give them) and the weights' total, which covers every active member's sampling
    weight: an analyst estimates from it without the command's printout."""
    df, d = panel["input"], panel["dir"]
    meta = orjson.loads((d / "w3.out.csv.meta.json").read_bytes())
    assert "analysis" in meta["republication"] and list(meta["waves"]) == ["3"]
    wave3 = meta["waves"]["3"]
    active = set(df.respondent_id)  # nobody retires within three waves
    answered = set(df[df.wave == 3].respondent_id)
    assert wave3["answered"] == len(answered)
    assert wave3["imputed"] == len(active - answered) > 0
    assert wave3["published"] == len(active)
    # each member's last sampling weight (an absent member is carried with its own)
    last = df.sort_values("wave").groupby("respondent_id").fnlwgt.last()
    assert wave3["weight_total"] == pytest.approx(last.sum(), rel=0.01)
    # the noise sd the wave applied, at least the policy's floor
    assert wave3["noise_sd_applied"]["capital_gain"] >= meta["noise"]["capital_gain"]["sd"]
    earlier = orjson.loads((d / "w12.out.csv.meta.json").read_bytes())["waves"]
    assert [earlier[w]["imputed"] > 0 for w in ("1", "2")] == [False, True]


def _evaluate(original: Path, release: Path, env: dict[str, str]) -> Any:
    return clikit.privgw("evaluate", original, release, "--policy", POLICY, "--json", env=env)


def test_evaluate_pairs_a_panel_release_with_its_original_by_record_id(
    panel: dict[str, Any], tmp_path: Path
) -> None:
    """The release is in record-id order and holds the imputed members: evaluate pairs each
    original row with its own published record (by the secret), as pairing them by hand does,
    and leaves the imputed records out, counted. By position, wave 1's rows met other
    respondents' and its disclosure risk read a few hundredths of what it is."""
    df, out, owner, env = panel["input"], panel["out"], panel["owner"], panel["env"]
    wave1 = df[df.wave == 1]
    release = out[out.wave == "1"]
    wave1.to_csv(tmp_path / "w1.csv", index=False)
    release.to_csv(tmp_path / "w1.out.csv", index=False)
    by_hand = release.set_index(release.record_id.map(owner)).loc[wave1.respondent_id.astype(str)]
    by_hand.drop(columns="record_id").to_csv(tmp_path / "w1.paired.csv", index=False)
    done = _evaluate(tmp_path / "w1.csv", tmp_path / "w1.out.csv", env)
    assert done.returncode == 0, done.stderr
    paired = _evaluate(tmp_path / "w1.csv", tmp_path / "w1.paired.csv", env)
    got, want = orjson.loads(done.stdout), orjson.loads(paired.stdout)
    assert got["paired_by"] == "record_id" and got["imputed_rows_excluded"] == 0
    for measure in ("sse_sst_pct", "dld", "interval_disclosure"):
        assert got[measure] == pytest.approx(want[measure]), measure
    # waves 1-2: the imputed members of wave 2 have no original row
    both = _evaluate(panel["dir"] / "w12.csv", panel["dir"] / "w12.out.csv", env)
    assert both.returncode == 0, both.stderr
    result = orjson.loads(both.stdout)
    assert result["records"] == len(df[df.wave <= 2])
    imputed = len(set(df[df.wave == 1].respondent_id) - set(df[df.wave == 2].respondent_id))
    assert result["imputed_rows_excluded"] == imputed > 0
    # the pairs are keyed: without the secret, a clear refusal
    refused = _evaluate(tmp_path / "w1.csv", tmp_path / "w1.out.csv", {"PRIVGW_SECRET_FILE": ""})
    assert refused.returncode == 2 and "needs the deployment secret" in refused.stderr


def _run(tmp_path: Path, name: str, rows: pd.DataFrame) -> Any:
    rows.to_csv(tmp_path / f"{name}.csv", index=False)
    env = {"PRIVGW_SECRET_FILE": str(tmp_path / "secret.key")}
    return clikit.privgw("protect", tmp_path / f"{name}.csv", "--policy", POLICY, "-o",
                         tmp_path / f"{name}.out.csv", "--state-dir", tmp_path / "state",
                         env=env)  # fmt: skip


@pytest.mark.parametrize("case", ["split", "gap", "mistyped", "no_id"])
def test_rows_a_decided_wave_never_had_or_a_wave_out_of_order_are_refused(
    tmp_path: Path, case: str
) -> None:
    """A wave is decided once, whole: the rest of a wave split over two files would be answers
    it imputed (republishing the imputed records told which they were), a skipped wave given
    later can no longer be decided, and a mistyped wave number would be decided with everyone
    imputed and close the real waves. Each is refused before the state is written."""
    assert clikit.privgw("secret", "create", tmp_path / "secret.key").returncode == 0
    df = pd.DataFrame(
        list(PanelSurvey(respondents=60, waves=4, seed=4, rows=load_rows()).records())
    )
    third = df[df.wave == 3]
    first, later, said = {
        "split": (pd.concat([df[df.wave <= 2], third.iloc[:30]]), third.iloc[30:],
                  f"without the answers of {third.respondent_id.nunique() - 30} respondent(s)"),
        "gap": (df[df.wave.isin([1, 2, 4])], third, "wave 3 comes before wave 4"),
        "mistyped": (df[df.wave == 1],
                     pd.concat([df[df.wave == 2], third.iloc[:1].assign(wave=1000)]),
                     "wave 1000 has 1 respondent(s), fewer than k = 5"),
        "no_id": (df[df.wave == 1], df[df.wave == 2].assign(respondent_id=""),
                  f"{(df.wave == 2).sum()} row(s) without a respondent id, first at data row 1"),
    }[case]  # fmt: skip
    assert _run(tmp_path, "first", first).returncode == 0
    before = (tmp_path / "state" / "state.db").read_bytes()
    proc = _run(tmp_path, "later", later)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert (tmp_path / "state" / "state.db").read_bytes() == before
    assert not (tmp_path / "later.out.csv").exists()


def test_a_changed_policy_or_secret_names_what_protect_takes(tmp_path: Path) -> None:
    """The refusals named `run`'s flags (--rotate-secret, PRIVGW_ROTATE_SECRET), which protect
    did not have: a changed policy is accepted with protect's own --policy-upgrade, a changed
    secret is refused with the way out a file has."""
    assert clikit.privgw("secret", "create", tmp_path / "secret.key").returncode == 0
    df = pd.DataFrame(
        list(PanelSurvey(respondents=60, waves=2, seed=4, rows=load_rows()).records())
    )
    assert _run(tmp_path, "w1", df[df.wave == 1]).returncode == 0
    lower = tmp_path / "k3.yaml"
    lower.write_text(POLICY.read_text().replace("  k: 5\n", "  k: 3\n"))
    version = load_policy(lower).version
    (tmp_path / "w2.csv").write_text(df[df.wave == 2].to_csv(index=False))
    env = {"PRIVGW_SECRET_FILE": str(tmp_path / "secret.key")}
    run = ("protect", tmp_path / "w2.csv", "--policy", lower, "-o", tmp_path / "w2.out.csv",
           "--state-dir", tmp_path / "state")  # fmt: skip
    refused = clikit.privgw(*run, env=env)
    assert refused.returncode == 2 and f"--policy-upgrade {version}" in refused.stderr
    assert clikit.privgw(*run, "--policy-upgrade", version, env=env).returncode == 0
    assert clikit.privgw("secret", "create", tmp_path / "other.key").returncode == 0
    other = clikit.privgw(*run, env={"PRIVGW_SECRET_FILE": str(tmp_path / "other.key")})
    assert other.returncode == 2 and "new --state-dir" in other.stderr, other.stderr
    assert "rotate" not in other.stderr.lower()


def test_a_wave_publishes_the_same_whatever_the_files_row_order(tmp_path: Path) -> None:
    """MDAV's ties and the donors followed the file's row order: the same rows sorted another
    way gave other cohorts and weights (1,622 of 1,728 weights differed in the probe)."""
    df = pd.DataFrame(
        list(PanelSurvey(respondents=400, waves=2, seed=6, rows=load_rows()).records())
    )
    df = df[~((df.wave == 2) & (np.random.default_rng(1).random(len(df)) < 0.3))]
    outs = []
    for name, rows in (("sorted", df), ("shuffled", df.sample(frac=1.0, random_state=3))):
        d = tmp_path / name
        d.mkdir()
        assert clikit.privgw("secret", "create", d / "secret.key").returncode == 0
        (d / "secret.key").write_bytes((tmp_path / "sorted" / "secret.key").read_bytes())
        assert _run(d, "panel", rows).returncode == 0
        outs.append((d / "panel.out.csv").read_bytes())
    assert outs[0] == outs[1]


def test_reconstruct_estimates_the_gross_change_of_a_linked_panel(tmp_path: Path) -> None:
    """With a published pseudonym, `reconstruct --change 1,2` links each member's two records
    and estimates how many changed their income under sticky draws: within its standard error
    of the truth, where the share of published answers that changed is well below it."""
    assert clikit.privgw("secret", "create", tmp_path / "secret.key").returncode == 0
    policy = tmp_path / "hmac.yaml"
    policy.write_text(POLICY.read_text().replace("  pseudonym: drop", "  pseudonym: hmac"))
    rng = np.random.default_rng(21)
    rows = load_rows()
    one = pd.DataFrame([rows[i] for i in rng.choice(len(rows), 1500, replace=False)])
    one = one.assign(respondent_id=[f"m{i}" for i in range(len(one))], wave=1)
    two = one.assign(wave=2)
    flip = rng.random(len(two)) < 0.25
    two.loc[flip, "income"] = np.where(two.income[flip] == ">50K", "<=50K", ">50K")
    pd.concat([one, two]).to_csv(tmp_path / "panel.csv", index=False)
    env = {"PRIVGW_SECRET_FILE": str(tmp_path / "secret.key")}
    proc = clikit.privgw("protect", tmp_path / "panel.csv", "--policy", policy, "-o",
                         tmp_path / "out.csv", "--state-dir", tmp_path / "state",
                         env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    done = clikit.privgw("reconstruct", tmp_path / "out.csv", "--policy", policy,
                         "--change", "1,2", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    est = orjson.loads(done.stdout)["income"]
    weights = two.fnlwgt.astype(float)
    truth = float(np.sum(weights[flip]) / weights.sum())  # the weights stand for fnlwgt
    assert est["pairs"] == 1500
    assert abs(est["gross_change"] - truth) < 4 * est["gross_change_se"], (est, truth)
    out = pd.read_csv(tmp_path / "out.csv", dtype=str, keep_default_na=False)
    shown = out.pivot(index="pseudonym", columns="wave", values="income")
    assert (shown["1"] != shown["2"]).mean() < truth - 4 * est["gross_change_se"]
    # without the pseudonym nothing links the waves (record ids are keyed per wave)
    out.drop(columns="pseudonym").to_csv(tmp_path / "unlinked.csv", index=False)
    meta = (tmp_path / "out.csv.meta.json").read_bytes()
    (tmp_path / "unlinked.csv.meta.json").write_bytes(meta)
    refused = clikit.privgw("reconstruct", tmp_path / "unlinked.csv", "--policy", policy,
                            "--change", "1,2")  # fmt: skip
    assert refused.returncode == 2 and "'pseudonym' column" in refused.stderr


def test_attack_reads_the_metadata_beside_a_protected_file(panel: dict[str, Any]) -> None:
    """`attack --help` says --qi and --k default from the metadata: a file's history has its
    OUT.meta.json, which attack did not read ("no release metadata comes with a file")."""
    d = panel["dir"]
    done = clikit.privgw("attack", d / "w12.out.csv", d / "w3.out.csv",
                         "--sticky", "income,occupation,capital_gain,capital_loss",
                         "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    chains = orjson.loads(done.stdout)["sticky_linkage"]
    assert chains["k"] == K and chains["chains"] > 0
