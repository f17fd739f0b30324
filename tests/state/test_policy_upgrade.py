"""Policy upgrades on an existing state (issue 30, item 2), with the real engine and SQLite
state: a panel's wave 1 protected under the Adult policy, then the policy changes — k up and
down, a category added to a randomized attribute, a new quasi-identifier, a changed matrix.
Each change is refused without a migration (one line naming it and its class); with one, the
next waves are what the new policy promises: 0 classes below a raised k, fresh draws equal
to what the new mechanism draws for a new state (keyed, so comparable), the upgrade counted
and announced.
"""

from __future__ import annotations

import re
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import TEST_SECRET

from gateway.engine.engine import Engine
from gateway.engine.records import ValidRecord
from gateway.keyed.keyed import Keyring
from gateway.policy import Policy, load_policy, policy_from_yaml
from gateway.policy.upgrade import UpgradeAction, diff
from gateway.state_store.state_codec import decode_state
from gateway.validation import Validator
from state.policy_record import Outcome, PolicyChangedError, check_policy, policy_facets
from state.sqlite_store import SQLiteStore
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "policies" / "adult.yaml"
# the shipped policy with the regroup mode it had when these upgrades were written: what they
# check is how groups are re-formed (a panel's roster is left alone by a migration:
# tests/gateway/test_panel_roster.py)
ADULT = re.sub(
    r"^republication: \{mode: panel.*?\}\n",
    "republication: {mode: regroup, wave_attribute: wave, pool: release}\n",
    SHIPPED.read_text(),
    flags=re.MULTILINE | re.DOTALL,
)
K_LINE = "microaggregation:\n  k: 5\n"
INCOME = 'categories: ["<=50K", ">50K"]\n    rr: {mode: uniform, retention: 0.75}'
COUNTRY = (
    "  native_country:\n    role: quasi_identifier\n    type: categorical\n"
    "    method: microaggregation\n"
)


def variant(*edits: tuple[str, str]) -> Policy:
    text = ADULT
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    return policy_from_yaml(text)


BASE = variant()
K6 = variant((K_LINE, K_LINE.replace("k: 5", "k: 6")))
K4 = variant((K_LINE, K_LINE.replace("k: 5", "k: 4")))
INCOME_CATEGORY = variant((INCOME, INCOME.replace('">50K"]', '">50K", "refused"]')))
INCOME_MATRIX = variant((INCOME, INCOME.replace("0.75", "0.8")))
# the country outside the k claim (published as it is, declared unprotected), then inside it
NO_COUNTRY = variant((COUNTRY, COUNTRY.replace("microaggregation", "keep\n    unprotected: true")))


def panel() -> list[list[dict[str, Any]]]:
    survey = PanelSurvey(respondents=600, waves=3, change_share=0.05, new_share=0.05, seed=11,
                         rows=load_rows())  # fmt: skip
    waves: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in survey.records():
        waves[int(record["wave"])].append(record)
    return [waves[w] for w in sorted(waves)]


WAVES = panel()


def protect(policy: Policy, state: Path, wave: list[dict[str, Any]]) -> list[dict]:
    """One wave as one window through the sticky engine (nothing held: flush_all); the
    published rows, each with its respondent (from the input, for the checks)."""
    validator = Validator(policy)
    records = []
    for r in wave:
        key, value = encode(r)
        rid, values = validator.decode_and_validate(value, key)  # type: ignore[misc]
        records.append(ValidRecord(rid, values, None, 0.0))
    with SQLiteStore(state / "state.db") as store:
        engine = Engine(policy, keyring=Keyring(TEST_SECRET.encode()), store=store)
        result = engine.protect_window(records, now=0.0, flush_all=True)
    rows = []
    for pub, r in zip(result.published, wave, strict=True):
        row = orjson.loads(pub.value)
        row["_respondent"] = r["respondent_id"]
        rows.append(row)
    return rows


def classes(rows: list[dict], claim: list[str]) -> dict[tuple, set[str]]:
    out: dict[tuple, set[str]] = defaultdict(set)
    for row in rows:
        key = tuple(row[a] for a in claim)
        if all(v is None for v in key):
            continue
        out[key].add(row["_respondent"])
    return out


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """Wave 1 protected under the Adult policy (k = 5), its policy recorded."""
    path = tmp_path / "state"
    path.mkdir()
    assert check_policy(path, "sqlite", None, BASE, accept=None).outcome is Outcome.NEW
    protect(BASE, path, WAVES[0])
    return path


def refused(state: Path, policy: Policy, *needles: str) -> str:
    with pytest.raises(PolicyChangedError) as info:
        check_policy(state, "sqlite", None, policy, accept=None)
    message = str(info.value)
    assert "\n" not in message and f"--policy-upgrade {policy.version}" in message
    for needle in needles:
        assert needle in message, message
    return message


def upgraded(state: Path, policy: Policy) -> Any:
    check = check_policy(state, "sqlite", None, policy, accept=policy.version)
    assert check.outcome is Outcome.UPGRADED
    assert check_policy(state, "sqlite", None, policy, accept=None).outcome is Outcome.SAME
    event = check.announcement()["policy_upgrades"][-1]
    assert event["from"] == BASE.version and event["to"] == policy.version
    return check


def test_k_up_regroups_small_groups_and_nothing_below_the_new_k_is_published(
    state: Path, tmp_path: Path
) -> None:
    refused(state, K6, "k 5 -> 6 (needs re-grouping)")
    claim = list(K6.k_claim)
    # the control: the same state run under k = 6 without a migration. The deferred mode
    # republished groups of 5 under k = 6 (the finding); the regroup mode the policy
    # names never republishes a group formed below the current k (it re-forms it), so the
    # migration is what records the upgrade, not what keeps the classes at k
    control = tmp_path / "control"
    shutil.copytree(state, control)
    rows = protect(K6, control, WAVES[1])
    assert min(len(r) for r in classes(rows, claim).values()) >= 6

    check = upgraded(state, K6)
    assert check.report.groups_reformed > 0 and check.report.memberships_dropped > 0
    assert check.record.counts()["regroup"] == 1
    assert not check.upgrade.fresh_draws
    published = protect(K6, state, WAVES[1]) + protect(K6, state, WAVES[2])
    sizes = [len(r) for r in classes(published, claim).values()]
    assert min(sizes) >= 6, f"{sum(s < 6 for s in sizes)} classes below the new k"
    # every group left in the state was formed with >= 6 (or lives on with none of the old)
    with SQLiteStore(state / "state.db") as store:
        live_small = [
            d for k, v in store.items() if k.startswith(b"group:")
            for d in [decode_state(v)] if d["live"] and d.get("size", 0) < 6
        ]  # fmt: skip
    assert not live_small


def test_k_down_is_safe_and_republishes_identically(state: Path, tmp_path: Path) -> None:
    refused(state, K4, "k 5 -> 4 (safe as it is)")
    control = tmp_path / "control"
    shutil.copytree(state, control)
    check = upgraded(state, K4)
    assert check.report.groups_reformed == 0 and check.report.memberships_dropped == 0
    assert check.record.counts() == {"safe": 1, "regroup": 0, "fresh_draws": 0}
    # the state untouched: wave 2 under k = 4 equals wave 2 under k = 5 for everyone who
    # kept a group (k only decides how new groups form)
    a = {r["record_id"]: r for r in protect(K4, state, WAVES[1])}
    b = {r["record_id"]: r for r in protect(BASE, control, WAVES[1])}
    same = [rid for rid in a if a[rid]["age"] == b[rid]["age"]]
    assert len(same) > 0.8 * len(a)
    assert all(a[rid]["occupation"] == b[rid]["occupation"] for rid in a)


def _fresh_draws_equal_a_new_state(policy: Policy, attr: str, state: Path, tmp: Path) -> None:
    """After the migration the attribute's republished values are exactly what the new
    mechanism draws for a new state (keyed draws: same secret, same respondent and value);
    the other randomized attribute is republished as before."""
    before = {r["record_id"]: r for r in protect(BASE, tmp / "copy", WAVES[1])}
    after = {r["record_id"]: r for r in protect(policy, state, WAVES[1])}
    fresh_dir = tmp / "fresh"
    fresh_dir.mkdir()
    fresh = {r["record_id"]: r for r in protect(policy, fresh_dir, WAVES[1])}
    assert all(after[rid][attr] == fresh[rid][attr] for rid in after)
    assert any(after[rid][attr] != before[rid][attr] for rid in after), "nothing drawn again"
    other = "occupation" if attr == "income" else "income"
    assert all(after[rid][other] == before[rid][other] for rid in after)


@pytest.mark.parametrize(
    ("policy", "what"),
    [
        (INCOME_CATEGORY, "income: categories added ['refused']"),
        (INCOME_MATRIX, "income: randomized-response matrix changed"),
    ],
    ids=["added-category", "changed-matrix"],
)
def test_a_new_mechanism_draws_afresh_counted_as_a_privacy_event(
    state: Path, tmp_path: Path, policy: Policy, what: str
) -> None:
    refused(state, policy, f"{what} (fresh draws: a privacy event)")
    shutil.copytree(state, tmp_path / "copy")
    check = upgraded(state, policy)
    assert check.upgrade.fresh_draws == ["income"]
    assert check.report.draws_dropped["income"] == len({r["respondent_id"] for r in WAVES[0]})
    assert check.record.counts()["fresh_draws"] == 1
    assert check.announcement()["policy_upgrades"][-1]["fresh_draws"] == ["income"]
    with SQLiteStore(state / "state.db") as store:
        docs = [decode_state(v) for k, v in store.items() if not k.startswith(b"group:")]
    assert not [d for d in docs if "income" in d.get("rr", {})]
    assert all("occupation" in d.get("rr", {}) for d in docs)
    _fresh_draws_equal_a_new_state(policy, "income", state, tmp_path)


def test_a_panels_draws_of_a_new_mechanism_are_dropped_from_its_roster(tmp_path: Path) -> None:
    """The shipped panel policy keeps its members' draws with the roster: the migration drops
    the attribute's draws there (counted, one a respondent), wave 2 then draws it as a new
    state does, and the other randomized attribute republishes as before."""
    base = policy_from_yaml(SHIPPED.read_text())
    new = policy_from_yaml(
        SHIPPED.read_text().replace(INCOME, INCOME.replace('">50K"]', '">50K", "refused"]'))
    )
    assert base.republication.mode.value == "panel" and new.version != base.version
    state, copy, fresh = (tmp_path / name for name in ("state", "copy", "fresh"))
    for path in (state, fresh):
        path.mkdir()
    assert check_policy(state, "sqlite", None, base, accept=None).outcome is Outcome.NEW
    protect(base, state, WAVES[0])
    shutil.copytree(state, copy)
    check = check_policy(state, "sqlite", None, new, accept=new.version)
    assert check.outcome is Outcome.UPGRADED and check.upgrade.fresh_draws == ["income"]
    assert check.report.draws_dropped["income"] == len({r["respondent_id"] for r in WAVES[0]})
    before = {r["record_id"]: r for r in protect(base, copy, WAVES[1])}
    after = {r["record_id"]: r for r in protect(new, state, WAVES[1])}
    drawn = {r["record_id"]: r for r in protect(new, fresh, WAVES[1])}
    both = after.keys() & drawn.keys()
    assert len(both) > 0.9 * len(WAVES[1])
    assert all(after[rid]["income"] == drawn[rid]["income"] for rid in both)
    assert any(after[rid]["income"] != before[rid]["income"] for rid in both)
    assert all(after[rid]["occupation"] == before[rid]["occupation"] for rid in after)


def test_a_new_quasi_identifier_regroups_everyone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    check_policy(state, "sqlite", None, NO_COUNTRY, accept=None)
    protect(NO_COUNTRY, state, WAVES[0])
    refused(state, BASE, "k-claim quasi-identifiers added native_country (needs re-grouping)")
    control = tmp_path / "control"
    shutil.copytree(state, control)
    # without a migration the stored groups lack the new attribute: the deferred mode failed
    # on every window; the regroup mode groups everyone afresh, at k
    rows = protect(BASE, control, WAVES[1])
    assert min(len(r) for r in classes(rows, list(BASE.k_claim)).values()) >= 5
    check = check_policy(state, "sqlite", None, BASE, accept=BASE.version)
    assert check.report.groups_reformed == check.report.groups > 0
    assert check.report.memberships_dropped == len({r["respondent_id"] for r in WAVES[0]})
    published = protect(BASE, state, WAVES[1])
    sizes = [len(r) for r in classes(published, list(BASE.k_claim)).values()]
    assert min(sizes) >= 5


def test_what_changes_nothing_the_state_depends_on_runs_as_it_is(state: Path) -> None:
    windows = variant(("max_records: 5000", "max_records: 2000"))
    assert windows.version != BASE.version
    check = check_policy(state, "sqlite", None, windows, accept=None)
    assert check.outcome is Outcome.VERSION_ONLY and not check.record.events


def test_a_flag_accepts_one_version_only(state: Path) -> None:
    with pytest.raises(PolicyChangedError, match=f"but this policy is {K6.version}"):
        check_policy(state, "sqlite", None, K6, accept=K4.version)


def test_an_interrupted_migration_blocks_other_starts_and_is_finished_by_its_own(
    state: Path,
) -> None:
    from state.policy_record import RECORD, PolicyRecord  # noqa: PLC0415

    with SQLiteStore(state / "state.db") as store:
        rec = PolicyRecord.from_text(store.meta(RECORD) or "")
        store.set_meta(RECORD, PolicyRecord(rec.facets, rec.events, K6.version).to_text())
    with pytest.raises(PolicyChangedError, match="was being migrated to policy version"):
        check_policy(state, "sqlite", None, BASE, accept=None)
    assert check_policy(state, "sqlite", None, K6, accept=K6.version).outcome is Outcome.UPGRADED


def test_classification_table() -> None:
    base = policy_facets(BASE)
    actions = {
        "k up": (K6, {UpgradeAction.REGROUP}),
        "k down": (K4, {UpgradeAction.SAFE}),
        "added RR category": (INCOME_CATEGORY, {UpgradeAction.FRESH_DRAWS}),
        "changed RR matrix": (INCOME_MATRIX, {UpgradeAction.FRESH_DRAWS}),
        "new quasi-identifier": (NO_COUNTRY, {UpgradeAction.REGROUP}),
    }
    for name, (policy, expected) in actions.items():
        got = {c.action for c in diff(base, policy_facets(policy)).changes}
        assert got == expected, name
    noise = variant(("noise: {ratio: 0.1, sd: 500}", "noise: {ratio: 0.2, sd: 500}"))
    assert diff(base, policy_facets(noise)).fresh_draws == ["capital_gain"]
    # a quasi-identifier randomized from now on, and an attribute first published randomized:
    # both were silent (the move read as a removed quasi-identifier, the new one as nothing)
    race = (
        "  race:\n    role: quasi_identifier\n    type: categorical\n    method: microaggregation\n"
    )
    randomized = race.replace("quasi_identifier", "sensitive").replace(
        "microaggregation", "randomized_response\n    rr: {mode: uniform, retention: 0.8}"
    )
    moved = diff(base, policy_facets(variant((race, randomized)))).changes
    assert [c.detail for c in moved if c.facet == "race"] == [
        "race published in the k claim -> by randomized response"
    ]
    education = "education: {role: other, type: categorical, method: drop}"
    added = variant(
        (
            education,
            "education: {role: sensitive, type: categorical, method: randomized_response,\n"
            "              categories: [HS-grad, Bachelors, Other], rr: {mode: uniform, "
            "retention: 0.8}}",
        )
    )
    upgrade = diff(base, policy_facets(added))
    assert [(c.detail, c.action) for c in upgrade.changes] == [
        ("education published from now on, by randomized response", UpgradeAction.SAFE)
    ]
    assert not upgrade.same and not upgrade.fresh_draws  # first draws: nothing drawn again
    shipped = load_policy(SHIPPED)  # BASE is the shipped policy but for its republication mode
    assert (shipped.attributes, shipped.microaggregation) == (
        BASE.attributes,
        BASE.microaggregation,
    )


def test_the_commands_an_operator_uses(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.commands.cli import main  # noqa: PLC0415

    k6 = tmp_path / "k6.yaml"
    k6.write_text(ADULT.replace(K_LINE, K_LINE.replace("k: 5", "k: 6")))
    adult = str(tmp_path / "adult_regroup.yaml")
    Path(adult).write_text(ADULT)
    assert main(["policy", "diff", "--from", adult, "--policy", str(k6)]) == 1
    out = capsys.readouterr().out
    assert "regroup      k 5 -> 6" in out and f"--policy-upgrade {K6.version}" in out
    assert main(["policy", "diff", "--from", adult, "--policy", adult]) == 0
    assert "nothing the state depends on changed" in capsys.readouterr().out
    assert main(["policy", "diff", "--state-dir", str(state), "--policy", str(k6), "--json"]) == 1
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["from"] == BASE.version and doc["changes"][0]["action"] == "regroup"
    args = ["state", "migrate", "--state-dir", str(state), "--policy", str(k6)]
    assert main([*args, "--dry-run"]) == 0
    assert "would migrate" in capsys.readouterr().out
    assert check_policy(state, "sqlite", None, BASE, accept=None).outcome is Outcome.SAME
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "migrated" in out and "groups re-formed" in out
    assert check_policy(state, "sqlite", None, K6, accept=None).outcome is Outcome.SAME
    assert main(["state", "migrate", "--state-dir", str(tmp_path / "none"), "--policy", adult]) == 2
    assert "state directory" in capsys.readouterr().err


def _snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` and its bytes: what a refused command must leave as it was."""
    return {str(f.relative_to(path)): f.read_bytes() for f in path.rglob("*") if f.is_file()}


def _partitioned_state(path: Path) -> Path:
    """A partitioned backend's state directory as a worker leaves it: a restored partition's
    local store and the policy record of the Adult policy."""
    from state.partitioned_store import PartitionedStore  # noqa: PLC0415

    store = PartitionedStore(path / "partitions")
    store.open_partition(0).set_key_fingerprint(Keyring(TEST_SECRET.encode()).fingerprint())
    store.close()
    assert check_policy(path, "partitioned", None, BASE, accept=None).outcome is Outcome.ADOPTED
    return path


def test_state_commands_find_the_backend_in_the_directory_and_refuse_the_other(
    state: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 45, item 4: `policy diff`, `state migrate` and `state-check` read the backend from
    the state directory; the other backend named is refused, and nothing is written."""
    from gateway.commands.cli import main  # noqa: PLC0415

    monkeypatch.setenv("PRIVGW_SECRET", TEST_SECRET)
    k6 = tmp_path / "k6.yaml"
    k6.write_text(ADULT.replace(K_LINE, K_LINE.replace("k: 5", "k: 6")))
    part = _partitioned_state(tmp_path / "part")
    for directory, other in ((state, "partitioned"), (part, "sqlite")):
        before = _snapshot(directory)
        for command in (["policy", "diff"], ["state", "migrate"]):
            args = [*command, "--state-dir", str(directory), "--policy", str(k6)]
            assert main([*args, "--state-backend", other]) == 2
            err = capsys.readouterr().err
            assert f"--state-backend {'sqlite' if other == 'partitioned' else 'partitioned'}" in (
                err
            ), err
            assert "Nothing was written" in err
            assert _snapshot(directory) == before, "a refused command wrote"
        # `privgw run` with the other backend: refused before it writes or needs a broker
        run = ["run", "--policy", str(ROOT / "deploy" / "policies" / "adult.yaml")]
        run += ["--state-dir", str(directory), "--bootstrap", "127.0.0.1:9"]
        assert main([*run, "--state-backend", other]) == 2
        assert f"holds the {'sqlite' if other == 'partitioned' else 'partitioned'}" in (
            capsys.readouterr().err
        )
        assert _snapshot(directory) == before, "a refused start wrote"

    # the partitioned directory without the flag: diff, migrate (no state.db appears), check
    assert main(["policy", "diff", "--state-dir", str(part), "--policy", str(k6)]) == 1
    assert "regroup      k 5 -> 6" in capsys.readouterr().out
    assert main(["state", "migrate", "--state-dir", str(part), "--policy", str(k6)]) == 0
    out = capsys.readouterr().out
    assert f"migrated {part}: policy {BASE.version} -> {K6.version}" in out
    assert "as a worker started on this directory restores it" in out
    assert sorted(p.name for p in part.iterdir()) == ["partitions", "policy-record.json"]
    assert check_policy(part, None, None, K6, accept=None).outcome is Outcome.SAME
    assert main(["state-check", "--state-dir", str(part)]) == 2
    assert "partitioned backend's state" in capsys.readouterr().err

    # a directory without any state: nothing to migrate, and nothing created there
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["state", "migrate", "--state-dir", str(empty), "--policy", str(k6)]) == 2
    assert "holds no privgw state" in capsys.readouterr().err
    assert list(empty.iterdir()) == []


@pytest.mark.parametrize("damage", ["{", "", "null", "[]", '{"facets": null}', "{}"])
def test_a_damaged_policy_record_is_named_not_an_internal_error(
    state: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    damage: str,
) -> None:
    """A policy record truncated, emptied or edited (either backend): `policy diff`, `state
    migrate` and `run` say where it lies and the fix, exit 2, and write nothing."""
    import sqlite3  # noqa: PLC0415

    from gateway.commands.cli import main  # noqa: PLC0415

    monkeypatch.setenv("PRIVGW_SECRET", TEST_SECRET)
    adult = str(tmp_path / "adult_regroup.yaml")
    Path(adult).write_text(ADULT)
    db = tmp_path / "sqlite"
    shutil.copytree(state, db)
    with sqlite3.connect(db / "state.db") as conn:
        conn.execute("update privgw_meta set value = ? where name = 'policy'", (damage,))
    part = _partitioned_state(tmp_path / "part")
    (part / "policy-record.json").write_text(damage)

    def files(directory: Path) -> dict[str, bytes]:  # a reader rewrites SQLite's wal index
        return {name: data for name, data in _snapshot(directory).items() if "-shm" not in name}

    for directory in (db, part):
        before = files(directory)
        for command in (["policy", "diff"], ["state", "migrate", "--dry-run"], ["run"]):
            args = [*command, "--state-dir", str(directory), "--policy", adult]
            if command == ["run"]:
                args += ["--bootstrap", "127.0.0.1:9"]
                args += ["--state-backend", "partitioned"] if directory == part else []
            assert main(args) == 2, capsys.readouterr().err
            err = capsys.readouterr().err
            assert "the policy record cannot be read" in err and "restore the file" in err, err
            assert files(directory) == before, "a refused command wrote"


COHORT = variant(("{mode: regroup,", "{mode: cohort,"))


def test_another_republication_mode_regroups_everyone(state: Path) -> None:
    """A panel's cohorts (its roster) and the other modes' groups (the registry) are not read
    by another mode: switching modes grouped everyone again without a word (panel to cohort left
    297 of 421 respondents' linked sets below k). It is a change that needs the upgrade."""
    refused(state, COHORT, "republication.mode regroup -> cohort", "needs re-grouping")
    change = diff(policy_facets(BASE), policy_facets(COHORT))
    assert change.regroup_all and [c.facet for c in change.changes] == ["republication"]
    # a record written before the mode was a facet is not compared on it (nothing to compare)
    old = policy_facets(BASE).to_json()
    del old["republication"]
    assert diff(type(change.old).from_json(old), policy_facets(COHORT)).same
