"""Writes this folder's fixture with the code of the version before draw derivations were
recorded (``BASE``), so that tests/gateway/test_draw_upgrade.py needs no git history:

    .venv/bin/python tests/gateway/data/draw_upgrade/make.py

For 1 and 2 shards: the SQLite state after wave 1 as an SQL dump (``shards-N/shard-I.sql``)
and what BASE publishes for wave 2 on it (``shards-N/expected.json``). BASE's ``gateway`` and
``state`` are exported from git and imported under other package names (as
bench/engine_ab.py does).
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
BASE = "07fd6de"  # main before draw derivations: its states record none
sys.path.insert(0, str(ROOT / "tests" / "gateway"))
sys.path.insert(0, str(HERE.parent))

from base_export import export_base  # noqa: E402
from test_draw_upgrade import POLICY, SECRET, waves  # noqa: E402


def _base(root: Path) -> dict[str, ModuleType]:
    mod = export_base(BASE, root, "base33")
    names = (
        "gateway.engine.engine",
        "gateway.keyed.keyed",
        "gateway.policy",
        "gateway.engine.shards",
    )
    mods = {n: mod(n) for n in (*names, "state.sqlite_store")}
    return mods


def _records(engine: Any, truth: dict[str, dict[str, Any]], offset: int) -> list[Any]:
    return [
        engine.ValidRecord(rid, v, engine.SourceRef("in", 0, offset + i), 0.0)
        for i, (rid, v) in enumerate(truth.items())
    ]


def _engines(mods: dict[str, ModuleType], paths: list[Path]) -> tuple[Any, list[Any]]:
    policy = mods["gateway.policy"].policy_from_yaml(POLICY)
    ring = mods["gateway.keyed.keyed"].Keyring(SECRET)
    stores = [mods["state.sqlite_store"].SQLiteStore(p) for p in paths]
    make = mods["gateway.engine.engine"].Engine
    if len(stores) == 1:
        return make(policy, keyring=ring, store=stores[0]), stores
    engines = [make(policy, keyring=ring, store=s, measure_risk=False) for s in stores]
    return mods["gateway.engine.shards"].ShardedEngine(engines), stores


def main() -> None:
    first, second = waves()
    with tempfile.TemporaryDirectory() as tmp:
        mods = _base(Path(tmp))
        engine = mods["gateway.engine.engine"]
        for shards in (1, 2):
            out = HERE / f"shards-{shards}"
            out.mkdir(exist_ok=True)
            paths = [Path(tmp) / f"s{shards}" / f"shard-{i}.db" for i in range(shards)]
            paths[0].parent.mkdir()
            old, stores = _engines(mods, paths)
            old.protect_window(_records(engine, first, 0), now=0.0, flush_all=True)
            for s in stores:
                s.close()  # checkpointed: the file is the whole state
            for i, p in enumerate(paths):
                with contextlib.closing(sqlite3.connect(p)) as con:
                    dump = "\n".join(con.iterdump()) + "\n"
                (out / f"shard-{i}.sql").write_text(dump)
            old, stores = _engines(mods, paths)
            got = old.protect_window(_records(engine, second, 1000), now=1.0, flush_all=True)
            for s in stores:
                s.close()
            expected = {
                "base": BASE,
                "sticky_hits": got.report.sticky_hits,
                "record_ids": [p.record_id for p in got.published],
                "values": [p.value.decode() for p in got.published],
            }
            (out / "expected.json").write_bytes(orjson.dumps(expected, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
