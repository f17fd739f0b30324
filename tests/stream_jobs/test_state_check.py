"""`privgw state-check`: group live counts in a real SQLite state file, checked and repaired."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import orjson
import pytest

from gateway.commands.cli import main
from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.engine.shards import ShardedEngine
from gateway.keyed.keyed import Keyring
from gateway.panel.carried import CarryBlock
from gateway.panel.roster import Roster, Sealer, roster_entries, roster_key
from gateway.policy import policy_from_yaml
from gateway.state_store.live_counts import audit_live_counts
from gateway.state_store.state_codec import decode_state
from state.layout import shard_paths
from state.sqlite_store import SQLiteStore

POLICY = policy_from_yaml(
    """
input: {respondent_id: rid}
window: {max_records: 1000, max_seconds: 1, max_hold_seconds: 10, on_hold_timeout: suppress}
microaggregation: {k: 3}
attributes:
  age:   {role: quasi_identifier, type: numeric, method: microaggregation}
  hours: {role: quasi_identifier, type: numeric, method: microaggregation}
"""
)


def _records() -> list[ValidRecord]:
    rng = np.random.default_rng(3)
    return [
        ValidRecord(
            f"r{i}",
            {"age": int(rng.integers(18, 80)), "hours": int(rng.integers(1, 60))},
            SourceRef("in", 0, i),
            0.0,
        )
        for i in range(40)
    ]


KEYRING = Keyring(b"state-check-secret-0123456789")


def _fill(state_dir: Path) -> None:
    with SQLiteStore(state_dir / "state.db") as store:
        engine = Engine(POLICY, keyring=KEYRING, store=store)
        engine.protect_window(_records(), now=0.0)


def _drift(state_dir: Path, name: str = "state.db") -> None:
    """What an earlier version could leave behind: one group counted one member too many."""
    with SQLiteStore(state_dir / name) as store:
        key, raw = next((k, v) for k, v in store.items() if k.startswith(b"group:"))
        store.put_many({key: orjson.dumps({"live": decode_state(raw)["live"] + 1})})  # old format


def test_consistent_state_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(tmp_path)
    assert main(["state-check", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "40 respondents" in out and "consistent" in out


def test_drift_is_reported_then_repaired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fill(tmp_path)
    _drift(tmp_path)
    assert main(["state-check", "--state-dir", str(tmp_path)]) == 1
    assert "live counts differ from the members in 1 group (by 1 in all)" in capsys.readouterr().out
    with SQLiteStore(tmp_path / "state.db") as store:
        assert not audit_live_counts(store.items()).consistent  # a check writes nothing

    assert main(["state-check", "--state-dir", str(tmp_path), "--repair"]) == 0
    assert "rewrote the live counts of 1 group" in capsys.readouterr().out
    with SQLiteStore(tmp_path / "state.db") as store:
        assert audit_live_counts(store.items()).consistent
    assert main(["state-check", "--state-dir", str(tmp_path)]) == 0


def test_missing_state_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["state-check", "--state-dir", str(tmp_path / "nowhere")]) == 2
    assert "no state file" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()  # nothing created


def test_every_shard_of_a_sharded_state_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stores = [SQLiteStore(p) for p in shard_paths(tmp_path, 2)]
    engines = [Engine(POLICY, keyring=KEYRING, store=s, measure_risk=False) for s in stores]
    ShardedEngine(engines).protect_window(_records(), now=0.0)
    for store in stores:
        store.close()
    _drift(tmp_path, "state.shard-1-of-2.db")
    assert main(["state-check", "--state-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "state.shard-0-of-2.db" in out and "state.shard-1-of-2.db" in out
    assert out.count("live counts: consistent") == 1
    assert main(["state-check", "--state-dir", str(tmp_path), "--repair"]) == 0
    assert "rewrote the live counts of 1 group" in capsys.readouterr().out
    assert main(["state-check", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("live counts: consistent") == 2


def test_a_panel_roster_whose_parts_do_not_match_its_head_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed "consistent", and the worker then stopped at its next wave with a message
    withheld: the roster's parts are read back as the worker reads them."""
    roster = Roster()
    members = 60
    roster.add_many(
        [i.to_bytes(32, "big") for i in range(members)],
        [i // 3 for i in range(members)],
        wave=1,
        claim=[[float(i) for i in range(members)]],
        carry=CarryBlock(roster.carried.names_id(["occ"]), [["x" * 20] * members]),
        sampling=[1.0] * members,
    )
    key = roster_key(None)
    entries = roster_entries(roster, Sealer(b"k" * 32), key, part_bytes=256)
    assert len(entries) > 2  # a head and its parts
    with SQLiteStore(tmp_path / "state.db") as store:
        store.put_many(entries)
    assert main(["state-check", "--state-dir", str(tmp_path)]) == 0
    assert f"{members} panel members" in capsys.readouterr().out
    part = next(k for k in entries if k != key)
    con = sqlite3.connect(tmp_path / "state.db")
    with con:
        con.execute("DELETE FROM state WHERE key = ?", (part,))
    con.close()
    assert main(["state-check", "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "state.db: the panel roster's parts do not match its head" in err, err
    assert "Restore the state directory from a backup" in err
