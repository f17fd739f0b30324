"""A state written by the version before draw derivations were recorded keeps its HMAC draws
(issue 33, item 3): republication after the upgrade is byte-identical, and so are the fresh
draws of new and changed respondents on that state (one derivation per deployment).

The state is written by that version's own code: ``gateway`` and ``state`` at ``BASE``,
exported from git and imported side by side under other package names (as
bench/engine_ab.py does).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

import gateway.engine as current
from gateway.draw_derivation import META_NAME, DrawDerivation
from gateway.engine import Engine
from gateway.keyed import Keyring
from gateway.policy import policy_from_yaml
from gateway.shards import ShardedEngine
from state.sqlite_store import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
BASE = "07fd6de"  # main before draw derivations: its states record none
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


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """``gateway`` and ``state`` of BASE as ``base33_gateway`` and ``base33_state``."""
    root = tmp_path_factory.mktemp("base")
    known = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{BASE}^{{commit}}"],
        check=False,
        capture_output=True,
    )
    if known.returncode != 0:  # a shallow clone: the version that wrote the state is missing
        pytest.fail(f"this test runs {BASE}'s code: fetch the history (git fetch --unshallow)")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", BASE, "gateway", "state"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    imports = re.compile(r"\b(from|import) (gateway|state)\b")
    for pkg in ("gateway", "state"):
        for path in (root / pkg).rglob("*.py"):
            path.write_text(imports.sub(r"\1 base33_\2", path.read_text()))
        (root / pkg).rename(root / f"base33_{pkg}")
    sys.path.insert(0, str(root))
    try:
        mods: dict[str, ModuleType] = {
            name: __import__(f"base33_{name}", fromlist=["_"])
            for name in ("gateway.engine", "gateway.keyed", "gateway.policy", "gateway.shards")
        }
        store = __import__("base33_state.sqlite_store", fromlist=["_"])
        yield SimpleNamespace(
            engine=mods["gateway.engine"],
            keyed=mods["gateway.keyed"],
            policy=mods["gateway.policy"],
            shards=mods["gateway.shards"],
            store=store,
        )
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith("base33_")]:
            del sys.modules[name]
        shutil.rmtree(root, ignore_errors=True)


def _waves() -> list[dict[str, dict[str, Any]]]:
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


def _old_engines(base: SimpleNamespace, paths: list[Path]) -> tuple[Any, list[Any]]:
    policy = base.policy.policy_from_yaml(POLICY)
    ring = base.keyed.Keyring(SECRET)
    stores = [base.store.SQLiteStore(p) for p in paths]
    if len(stores) == 1:
        return base.engine.Engine(policy, keyring=ring, store=stores[0]), stores
    engines = [
        base.engine.Engine(policy, keyring=ring, store=s, measure_risk=False) for s in stores
    ]
    return base.shards.ShardedEngine(engines), stores


def _new_engines(paths: list[Path]) -> tuple[Any, list[SQLiteStore]]:
    policy = policy_from_yaml(POLICY)
    stores = [SQLiteStore(p) for p in paths]
    if len(stores) == 1:
        return Engine(policy, keyring=Keyring(SECRET), store=stores[0]), stores
    engines = [Engine(policy, keyring=Keyring(SECRET), store=s, measure_risk=False) for s in stores]
    return ShardedEngine(engines), stores


def _copy(paths: list[Path], into: Path) -> list[Path]:
    into.mkdir()
    return [Path(shutil.copy(p, into / p.name)) for p in paths]


@pytest.mark.parametrize("shards", [1, 2])
def test_state_of_the_previous_version_republishes_byte_identical_with_hmac_draws(
    base: SimpleNamespace, tmp_path: Path, shards: int
) -> None:
    waves = _waves()
    written = [tmp_path / "old" / f"shard-{i}.db" for i in range(shards)]
    old, stores = _old_engines(base, written)
    old.protect_window(_records(base.engine, waves[0], 0), now=0.0, flush_all=True)
    for s in stores:
        s.close()  # checkpointed: the file is the whole state
    upgraded = _copy(written, tmp_path / "upgraded")
    fresh = [tmp_path / "fresh" / p.name for p in written]

    old, stores = _old_engines(base, written)  # the previous version goes on ...
    expected = old.protect_window(_records(base.engine, waves[1], 1000), now=1.0, flush_all=True)
    for s in stores:
        s.close()
    new, stores = _new_engines(upgraded)  # ... and the upgraded one on a copy of its state
    assert new.draws is DrawDerivation.HMAC_SHA256
    assert [s.meta(META_NAME) for s in stores] == [None] * shards  # until its first window
    got = new.protect_window(_records(current, waves[1], 1000), now=1.0, flush_all=True)
    assert [s.meta(META_NAME) for s in stores] == ["hmac-sha256"] * shards
    assert new.metadata()[META_NAME] == "hmac-sha256"
    for s in stores:
        s.close()

    assert expected.report.sticky_hits == got.report.sticky_hits > 0
    assert [p.record_id for p in got.published] == [p.record_id for p in expected.published]
    assert [p.value for p in got.published] == [p.value for p in expected.published]

    # a new deployment draws with the new derivation: its fresh draws differ, so the equality
    # above says the upgraded state kept HMAC for its new and changed respondents too
    other, stores = _new_engines(fresh)
    assert other.draws is DrawDerivation.AES_CBC_MAC
    other.protect_window(_records(current, waves[0], 0), now=0.0, flush_all=True)
    elsewhere = other.protect_window(_records(current, waves[1], 1000), now=1.0, flush_all=True)
    assert [s.meta(META_NAME) for s in stores] == ["aes-256-cbc-mac"] * shards
    for s in stores:
        s.close()
    assert [p.value for p in elsewhere.published] != [p.value for p in expected.published]
