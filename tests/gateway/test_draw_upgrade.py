"""A state written by the version before draw derivations were recorded keeps its HMAC draws
(issue 33, item 3): republication after the upgrade is byte-identical, and so are the fresh
draws of new and changed respondents on that state (one derivation per deployment).

The state and what that version publishes on it were written by its own code (07fd6de) and
kept in tests/gateway/data/draw_upgrade/ (``make.py`` there writes them again from git).
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

import gateway.engine.records as current
from gateway.engine.engine import Engine
from gateway.engine.shards import ShardedEngine
from gateway.keyed.draw_derivation import META_NAME, DrawDerivation
from gateway.keyed.keyed import Keyring
from gateway.policy import policy_from_yaml
from state.sqlite_store import SQLiteStore

DATA = Path(__file__).resolve().parent / "data" / "draw_upgrade"
SECRET = b"upgrade-test-secret-0123456789ab"
POLICY = """
input: {respondent_id: rid}
window: {max_records: 100000, max_seconds: 1, max_hold_seconds: 10, on_hold_timeout: suppress}
microaggregation: {k: 3}
attributes:
  age: {role: quasi_identifier, type: numeric, method: microaggregation}
  sex: {role: quasi_identifier, type: categorical, method: microaggregation, categories: [F, M]}
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [a, b, c, d]
    rr: {mode: uniform, retention: 0.5}
  pay: {role: sensitive, type: numeric, method: noise, noise: {ratio: 0.1}}
"""


def waves() -> list[dict[str, dict[str, Any]]]:
    """Wave 1: 300 respondents; wave 2: all back, 60 with a changed occupation, pay or age,
    and 40 new ones (fresh draws on the old state)."""
    rng = np.random.default_rng(33)

    def person() -> dict[str, Any]:
        return {
            "age": int(rng.integers(18, 90)),
            "sex": str(rng.choice(["F", "M"])),
            "occ": str(rng.choice(list("abcd"))),
            "pay": round(float(rng.uniform(1000, 90000)), 2),
        }

    first = {f"r{i}": person() for i in range(300)}
    second = {rid: dict(v) for rid, v in first.items()}
    for j, rid in enumerate(rng.choice(list(second), 60, replace=False)):
        field = ("occ", "pay", "age")[j % 3]
        second[str(rid)][field] = person()[field]
    second.update({f"n{i}": person() for i in range(40)})
    return [first, second]


def _records(module: Any, truth: dict[str, dict[str, Any]], offset: int) -> list[Any]:
    return [
        module.ValidRecord(rid, v, module.SourceRef("in", 0, offset + i), 0.0)
        for i, (rid, v) in enumerate(truth.items())
    ]


def _new_engines(paths: list[Path]) -> tuple[Any, list[SQLiteStore]]:
    policy = policy_from_yaml(POLICY)
    stores = [SQLiteStore(p) for p in paths]
    if len(stores) == 1:
        return Engine(policy, keyring=Keyring(SECRET), store=stores[0]), stores
    engines = [Engine(policy, keyring=Keyring(SECRET), store=s, measure_risk=False) for s in stores]
    return ShardedEngine(engines), stores


def _restore(shards: int, into: Path) -> list[Path]:
    """The wave-1 state the previous version wrote, from its SQL dump."""
    into.mkdir()
    paths = []
    for i in range(shards):
        path = into / f"shard-{i}.db"
        with contextlib.closing(sqlite3.connect(path)) as con:
            con.executescript((DATA / f"shards-{shards}" / f"shard-{i}.sql").read_text())
        paths.append(path)
    return paths


@pytest.mark.parametrize("shards", [1, 2])
def test_state_of_the_previous_version_republishes_byte_identical_with_hmac_draws(
    tmp_path: Path, shards: int
) -> None:
    first, second = waves()
    expected = orjson.loads((DATA / f"shards-{shards}" / "expected.json").read_bytes())
    upgraded = _restore(shards, tmp_path / "upgraded")
    fresh = [tmp_path / "fresh" / p.name for p in upgraded]
    (tmp_path / "fresh").mkdir()

    new, stores = _new_engines(upgraded)
    assert new.draws is DrawDerivation.HMAC_SHA256
    assert [s.meta(META_NAME) for s in stores] == [None] * shards  # until its first window
    got = new.protect_window(_records(current, second, 1000), now=1.0, flush_all=True)
    assert [s.meta(META_NAME) for s in stores] == ["hmac-sha256"] * shards
    assert new.metadata()[META_NAME] == "hmac-sha256"
    for s in stores:
        s.close()

    assert got.report.sticky_hits == expected["sticky_hits"] > 0
    assert [p.record_id for p in got.published] == expected["record_ids"]
    assert [p.value.decode() for p in got.published] == expected["values"]

    # a new deployment draws with the new derivation: its fresh draws differ, so the equality
    # above says the upgraded state kept HMAC for its new and changed respondents too
    other, stores = _new_engines(fresh)
    assert other.draws is DrawDerivation.AES_CBC_MAC
    other.protect_window(_records(current, first, 0), now=0.0, flush_all=True)
    elsewhere = other.protect_window(_records(current, second, 1000), now=1.0, flush_all=True)
    assert [s.meta(META_NAME) for s in stores] == ["aes-256-cbc-mac"] * shards
    for s in stores:
        s.close()
    assert [p.value.decode() for p in elsewhere.published] != expected["values"]
