"""Benchmark of the state backends and of the keyed digests, with same-run baselines.

    .venv/bin/python bench/state_store.py            # 1,000,000 respondents, batches of 5,000
    .venv/bin/python bench/state_store.py --n 200000 --cases sqlite,rocks

Each case runs in its own subprocess, so "max RSS" is that backend's own peak. Keys are 32-byte
respondent digests (Keyring), values ~200-byte orjson state dicts like the engine's; generating
them is not timed. Puts are ``put_many`` of consecutive batches (fresh respondents), gets are
``get_many`` of random batches of stored keys. Targets: >= 100,000 respondents/s, RSS < 1 GiB.

Baselines (same data, same run): a plain dict; raw sqlite3 ``executemany`` of a plain INSERT
into a table keyed by the digest (``key BLOB PRIMARY KEY``, same pragmas: what SQLite costs
with an on-disk key index, the layout SQLiteStore used before its in-memory key map); raw
sqlite3 upsert on the WITHOUT ROWID layout (the other indexed alternative).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.keyed.keyed import KeyedSource, Keyring
from state.rocks_store import RocksStore
from state.sqlite_store import SQLiteStore

SECRET = b"bench-secret-0123456789abcdef"
CASES = ["dict", "sqlite-raw-insert", "sqlite-without-rowid", "sqlite", "rocks"]
GET_BATCHES = 40


class _Store(Protocol):
    def get_many(self, keys: Sequence[bytes]) -> Mapping[bytes, bytes]: ...
    def put_many(self, entries: Mapping[bytes, bytes]) -> None: ...
    def close(self) -> None: ...


def _value(i: int) -> bytes:
    """A realistic engine state: group/digest ids, waves, a sticky centroid (~200 bytes)."""
    h = hashlib.blake2b(i.to_bytes(8, "big"), digest_size=24).hexdigest()
    gid = "g" + h[:15]
    # copied: a bytes object from orjson.dumps keeps ~4 KiB of heap (measured), which would
    # inflate the dict baseline's RSS 20x; the stores do not keep the caller's objects
    return bytes(
        memoryview(
            _dumps(
                {
                    "current": [gid, h[16:48]],
                    "first_wave": i % 7,
                    "last_wave": i % 7 + 3,
                    "qi": {h[8:40]: [gid, [20.0 + i % 60 + 0.25, 35.5 + i % 20]]},
                    "rr": {"occupation": h[:8]},
                },
            )
        )
    )


def _dumps(obj: object) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


class _DictStore:
    def __init__(self) -> None:
        self.d: dict[bytes, bytes] = {}

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        d = self.d
        return {k: d[k] for k in keys if k in d}

    def put_many(self, entries: Mapping[bytes, bytes]) -> None:
        self.d.update(entries)

    def close(self) -> None:
        pass


class _RawSQLite:
    """sqlite3 straight: same pragmas as SQLiteStore, one transaction per batch."""

    def __init__(self, path: Path, *, without_rowid: bool, upsert: bool) -> None:
        self.con = sqlite3.connect(path, isolation_level=None)
        for pragma in (
            "locking_mode = EXCLUSIVE",
            "journal_mode = WAL",
            "synchronous = FULL",
            "cache_size = -131072",
            "wal_autocheckpoint = 16384",
        ):
            self.con.execute(f"PRAGMA {pragma}")
        suffix = " WITHOUT ROWID" if without_rowid else ""
        self.con.execute(
            f"CREATE TABLE respondent (key BLOB PRIMARY KEY NOT NULL, value BLOB NOT NULL){suffix}"
        )
        self.sql = "INSERT INTO respondent (key, value) VALUES (?, ?)" + (
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value" if upsert else ""
        )

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        out: dict[bytes, bytes] = {}
        for start in range(0, len(keys), 4096):
            part = list(keys[start : start + 4096])
            marks = ",".join("?" * len(part))
            q = f"SELECT key, value FROM respondent WHERE key IN ({marks})"
            out.update(self.con.execute(q, part).fetchall())
        return out

    def put_many(self, entries: Mapping[bytes, bytes]) -> None:
        self.con.execute("BEGIN IMMEDIATE")
        self.con.executemany(self.sql, entries.items())
        self.con.execute("COMMIT")

    def close(self) -> None:
        self.con.close()


def _open(case: str, where: Path) -> _Store:
    if case == "dict":
        return _DictStore()
    if case == "sqlite":
        return SQLiteStore(where / "state.db")
    if case == "sqlite-raw-insert":
        return _RawSQLite(where / "raw.db", without_rowid=False, upsert=False)
    if case == "sqlite-without-rowid":
        return _RawSQLite(where / "wor.db", without_rowid=True, upsert=True)
    if case == "rocks":
        return RocksStore(where / "rocks")
    raise SystemExit(f"unknown case {case}")


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_case(case: str, n: int, batch: int) -> dict[str, Any]:
    ring = Keyring(SECRET)
    ids = [f"R{i:09d}" for i in range(n)]
    with tempfile.TemporaryDirectory(prefix="privgw-bench-") as tmp:
        where = Path(tmp)
        store = _open(case, where)
        put_s = 0.0
        for start in range(0, n, batch):
            stop = min(n, start + batch)
            entries = dict(
                zip(
                    ring.respondent_keys(ids[start:stop]),
                    [_value(i) for i in range(start, stop)],
                    strict=True,
                )
            )
            t0 = time.perf_counter()
            store.put_many(entries)
            put_s += time.perf_counter() - t0
        rng = np.random.default_rng(7)
        get_s, got_n = 0.0, 0
        for _ in range(GET_BATCHES):
            pick = np.unique(rng.integers(0, n, size=batch))
            keys = ring.respondent_keys([ids[i] for i in pick])
            t0 = time.perf_counter()
            got = store.get_many(keys)
            get_s += time.perf_counter() - t0
            if len(got) != len(keys):
                raise SystemExit(f"{case}: get_many returned {len(got)} of {len(keys)}")
            got_n += len(keys)
        store.close()
        size = _dir_bytes(where)
        shutil.rmtree(where / "rocks", ignore_errors=True)
    return {
        "case": case,
        "put_per_s": n / put_s,
        "get_per_s": got_n / get_s,
        "file_mib": size / 2**20,
        "max_rss_mib": _max_rss_mib(),
    }


def run_keyed(n: int) -> dict[str, Any]:
    ring = Keyring(SECRET)
    src = KeyedSource(ring)
    ids = [f"R{i:09d}" for i in range(n)]
    enc = [s.encode() for s in ids]

    def best(f: Callable[[], object]) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        return n / min(times)

    prefix = b"privgw/v1/respondent\x00"
    rkeys = ring.respondent_keys(ids)
    vd = ring.value_digest("occupation", "nurse")
    draw_keys = [k + vd for k in rkeys]
    return {
        "case": "keyed",
        "n": n,
        "sha256_loop": best(lambda: [hashlib.sha256(prefix + e).digest() for e in enc]),
        "hmac_new_loop": best(
            lambda: [hmac.new(SECRET, prefix + e, hashlib.sha256).digest() for e in enc]
        ),
        "hmac_digest_loop": best(lambda: [hmac.digest(SECRET, prefix + e, "sha256") for e in enc]),
        "respondent_keys": best(lambda: ring.respondent_keys(ids)),
        "value_digests": best(lambda: ring.value_digests("occupation", ids)),
        "uniform": best(lambda: src.uniform("rr/occupation", n, draw_keys)),
        "max_rss_mib": _max_rss_mib(),
    }


def _child(args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--cases", default=",".join([*CASES, "keyed"]))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "keyed":
        print(json.dumps(run_keyed(100_000)))
        return
    if args.child:
        print(json.dumps(run_case(args.child, args.n, args.batch)))
        return

    cases = args.cases.split(",")
    print(
        f"state stores: {args.n:,} respondents, batches of {args.batch:,}; "
        f"gets: {GET_BATCHES} random batches; python {sys.version.split()[0]}, "
        f"sqlite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs, "
        f"load avg {os.getloadavg()[0]:.1f}"
    )
    results: dict[str, dict[str, Any]] = {}
    t_all = time.perf_counter()
    for case in cases:
        if case == "keyed":
            continue
        t0 = time.perf_counter()
        results[case] = _child(["--child", case, "--n", str(args.n), "--batch", str(args.batch)])
        results[case]["wall_s"] = time.perf_counter() - t0
    if results:
        base = results.get("dict")
        raw = results.get("sqlite-raw-insert")
        print(
            f"\n{'case':22s} {'put/s':>10s} {'get/s':>10s} {'put/dict':>9s} {'get/dict':>9s} "
            f"{'put/raw':>8s} {'get/raw':>8s} {'size MiB':>9s} {'RSS MiB':>8s} {'wall s':>7s}"
        )
        for case, r in results.items():

            def ratio(ref: dict[str, Any] | None, field: str, r: dict[str, Any] = r) -> str:
                return f"{r[field] / ref[field]:.3f}" if ref else "-"

            print(
                f"{case:22s} {r['put_per_s']:10,.0f} {r['get_per_s']:10,.0f} "
                f"{ratio(base, 'put_per_s'):>9s} {ratio(base, 'get_per_s'):>9s} "
                f"{ratio(raw, 'put_per_s'):>8s} {ratio(raw, 'get_per_s'):>8s} "
                f"{r['file_mib']:9.1f} {r['max_rss_mib']:8.0f} {r['wall_s']:7.1f}"
            )
        print("\ntargets: put and get >= 100,000 respondents/s, max RSS < 1024 MiB")
        for case in ("sqlite", "rocks"):
            if case in results:
                r = results[case]
                ok = min(r["put_per_s"], r["get_per_s"]) >= 100_000 and r["max_rss_mib"] < 1024
                print(f"  {case:8s} {'PASS' if ok else 'MISS'}")
    if "keyed" in cases:
        k = _child(["--child", "keyed"])
        base = k["sha256_loop"]
        print(f"\nkeyed digests, {k['n']:,} items (best of 3), vs a hashlib.sha256 loop:")
        for name in (
            "sha256_loop",
            "hmac_new_loop",
            "hmac_digest_loop",
            "respondent_keys",
            "value_digests",
            "uniform",
        ):
            print(f"  {name:18s} {k[name]:12,.0f} /s   ratio {k[name] / base:.2f}")
    print(
        f"\ntotal wall time {time.perf_counter() - t_all:.0f} s, load avg {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
