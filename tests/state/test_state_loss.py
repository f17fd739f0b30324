"""Losing the state store between two waves (issue: reliability, scenario "state loss").

Randomized response stays identical (keyed draws do not need state); respondents whose stored
centroid is gone are microaggregated again, only among themselves and only in groups of at
least k. The test reports how many were regrouped.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from test_policy_upgrade import ADULT as ADULT_REGROUP

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy
from gateway.validation import Validator
from state.sqlite_store import SQLiteStore
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

ROOT = Path(__file__).resolve().parents[2]
QIS = tuple(load_policy(ROOT / "deploy" / "policies" / "adult.yaml").k_claim)
KEY = Keyring(b"state-loss-test-secret-0123456789")


def wave_records(policy_path: Path, wave: int, panel: list[dict]) -> list[ValidRecord]:
    validator = Validator(load_policy(policy_path))
    out = []
    for i, rec in enumerate(r for r in panel if r["wave"] == wave):
        key, value = encode(rec)
        rid, values = validator.decode_and_validate(value, key)  # type: ignore[misc]
        out.append(ValidRecord(rid, values, SourceRef("in", 0, wave * 100_000 + i), 0.0))
    return out


def protect(policy_path: Path, db: Path, records: list[ValidRecord]) -> dict[str, dict]:
    """Publish one wave with a SQLite store at ``db``; respondent id -> published row."""
    policy = load_policy(policy_path)
    with SQLiteStore(db) as store:
        res = Engine(policy, keyring=KEY, store=store).protect_window(
            records, now=0.0, flush_all=True
        )
    by_record = {r.source.record_id: r.respondent_id for r in records if r.source}
    return {str(by_record[row["record_id"]]): row for row in res.rows}


def test_state_loss_keeps_rr_and_regroups_only_in_groups_of_k(tmp_path: Path) -> None:
    # the regroup mode this was written for: a lost state is grouped afresh, wave by wave
    policy_path = tmp_path / "adult_regroup.yaml"
    policy_path.write_text(ADULT_REGROUP)
    k = load_policy(policy_path).microaggregation.k
    panel = list(
        PanelSurvey(
            respondents=1500, waves=2, seed=8, change_share=0.0, new_share=0.0, rows=load_rows()
        ).records()
    )
    db = tmp_path / "state.db"
    first = protect(policy_path, db, wave_records(policy_path, 1, panel))
    for f in tmp_path.glob("state.db*"):
        f.unlink()  # the state store is lost between the waves
    second = protect(policy_path, db, wave_records(policy_path, 2, panel))

    assert set(first) == set(second)
    for rid in first:  # nobody changed: keyed draws give the same randomized values
        assert first[rid]["occupation"] == second[rid]["occupation"]
        assert first[rid]["income"] == second[rid]["income"]
    regrouped = [
        rid for rid in first if [first[rid][q] for q in QIS] != [second[rid][q] for q in QIS]
    ]
    members: dict[tuple, set[str]] = defaultdict(set)
    for rows in (first, second):
        for rid, row in rows.items():
            if any(row[q] is not None for q in QIS):  # fully suppressed rows left out
                members[tuple(row[q] for q in QIS)].add(rid)
    assert min(len(m) for m in members.values()) >= k
    print(f"state loss: {len(regrouped)} of {len(first)} respondents regrouped (groups >= {k})")
    assert regrouped  # state really was lost: the same records formed new groups


def test_a_rotation_drops_the_entries_of_the_old_secret(tmp_path: Path) -> None:
    """Issue 30 (item 7), taken by issue 32: after --rotate-secret the entries keyed by the old
    secret were kept, unreachable (2,198 -> 2,698 respondents in the state)."""
    from gateway.state_store.state_api import KeyFingerprintCheck, check_key_fingerprint  # noqa: PLC0415
    from state.sqlite_store import SQLiteStore  # noqa: PLC0415

    with SQLiteStore(tmp_path / "s.db") as store:
        store.put_many({bytes([i]) * 32: b"\x80" for i in range(50)})
        store.set_key_fingerprint("aaaaaaaaaaaaaaaa")
        result = check_key_fingerprint(store, "bbbbbbbbbbbbbbbb", rotate=True, where="here")
        assert result.outcome is KeyFingerprintCheck.ROTATED and result.dropped == 50
        assert store.count() == 0 and store.key_fingerprints() == ["bbbbbbbbbbbbbbbb"]
        store.put_many({b"\x07" * 32: b"\x80"})
    with SQLiteStore(tmp_path / "s.db") as again:  # durable
        assert again.count() == 1 and again.key_fingerprints() == ["bbbbbbbbbbbbbbbb"]
