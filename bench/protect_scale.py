"""``privgw protect`` at scale: time a row and peak memory on adult.csv and on 8 jittered
copies of it (260,488 rows) in the same run, and the blocked run's quality against whole-file
MDAV on the same rows (issue 44).

    .venv/bin/python bench/protect_scale.py                    # adult.csv, then 260,488 rows
    .venv/bin/python bench/protect_scale.py --rows 10000000    # 10M rows: time and peak RSS

The copies jitter age by ±2 and hours_per_week by ±3 (uniform integers, a seeded numpy
Generator, clipped to the policy's ranges); the file is written copy by copy, never held
whole. Each run is a ``privgw protect`` subprocess under ``/usr/bin/time`` (its own peak RSS).
Printed, with the bounds the issue sets:

* rows, seconds, seconds a row against adult.csv's (≤ 1.3×: checked on CPU seconds, user +
  system, which other work on a shared machine does not inflate as it does wall time), peak
  RSS (≤ 1 GiB; ≤ 4 GiB for ``--rows``);
* records in whole-key classes smaller than k = 5 in the blocked output (0);
* 100·SSE/SST of the 3 numeric quasi-identifiers, blocked against the whole file as one
  window on the same rows (≤ 1.10×; the whole-file run needs ~3.7 GiB: ``--no-reference``
  leaves it out), and the whole-key record linkage each run printed (a blocked run's is
  measured within each block: an upper bound of the file's).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.measures import quality

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT.parent / "shared" / "data" / "adult.csv"
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"
PRIVGW = Path(sys.executable).with_name("privgw")
NUMERIC = ["age", "education_num", "hours_per_week"]
KEY = [*NUMERIC, "sex", "race", "marital_status", "relationship", "workclass", "native_country"]
JITTER = {"age": (2, (0, 130)), "hours_per_week": (3, (0, 168))}
GIB = 1024**3


def jittered(path: Path, rows: int, seed: int) -> int:
    """Write ``rows`` rows: copies of adult.csv (the last one cut) with age ±2 and hours ±3."""
    adult = pd.read_csv(ADULT, dtype=str, keep_default_na=False)
    rng = np.random.default_rng(seed)
    written = 0
    with path.open("w", newline="") as fh:
        while written < rows:
            copy = adult.head(rows - written).copy()
            for name, (step, (lo, hi)) in JITTER.items():
                x = copy[name].astype(int).to_numpy()
                copy[name] = np.clip(x + rng.integers(-step, step + 1, x.size), lo, hi)
            copy.to_csv(fh, index=False, header=written == 0)
            written += len(copy)
    return written


@dataclass(frozen=True)
class Run:
    """One ``privgw protect`` run: wall seconds, CPU seconds (user + system), peak RSS."""

    seconds: float
    cpu: float
    rss: int
    linkage: str  # the whole-key record linkage line protect printed


def protect(src: Path, out: Path, *extra: str) -> Run:
    """Time and peak RSS (bytes) of one ``privgw protect`` run."""
    cmd = ["/usr/bin/time", "-f", "__RSS_KB %M %U %S", str(PRIVGW), "protect", str(src)]
    cmd += ["--policy", str(POLICY), "-o", str(out), "--seed", "1", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"privgw protect failed:\n{proc.stdout}\n{proc.stderr}")
    rss, user, system = next(
        ln for ln in proc.stderr.splitlines() if ln.startswith("__RSS_KB")
    ).split()[1:]
    blocks = [ln for ln in proc.stdout.splitlines() if " blocks of " in ln]
    print(f"    {src.name}: {blocks[0].strip() if blocks else 'one window'}", flush=True)
    link = [ln.split(":", 1)[1].strip() for ln in proc.stdout.splitlines() if "linkage:" in ln]
    return Run(seconds, float(user) + float(system), int(rss) * 1024, link[0] if link else "")


def below_k(out: Path, k: int = 5) -> int:
    """Records whose whole published key tuple fewer than k records share."""
    df = pd.read_csv(out, usecols=KEY, dtype=str, keep_default_na=False)
    sizes = df.groupby(KEY, sort=False)[KEY[0]].transform("size")
    return int((sizes < k).sum())


def sse_sst(src: Path, out: Path) -> float:
    x = pd.read_csv(src, usecols=NUMERIC)[NUMERIC].to_numpy(dtype=float)
    xm = pd.read_csv(out, usecols=NUMERIC)[NUMERIC].to_numpy(dtype=float)
    return quality.sse_sst_pct(x, xm)


def verdict(ok: bool) -> str:
    return "ok" if ok else "FAIL"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="generate this many rows instead")
    ap.add_argument("--no-reference", action="store_true", help="skip the whole-file run")
    ap.add_argument("--seed", type=int, default=44)
    ap.add_argument("--tmp", default=None, help="directory for the generated files")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="protect-scale-", dir=args.tmp) as tmp:
        work = Path(tmp)
        if args.rows:
            big = work / "big.csv"
            t0 = time.perf_counter()
            n = jittered(big, args.rows, args.seed)
            print(f"generated {n:,} rows in {time.perf_counter() - t0:.0f} s")
            r = protect(big, work / "big.out.csv")
            print(
                f"{n:,} rows: {r.seconds:.0f} s, CPU {r.cpu:.0f} s ({1e6 * r.cpu / n:.0f} µs a "
                f"row), peak RSS {r.rss / GIB:.2f} GiB (≤ 4 GiB: {verdict(r.rss <= 4 * GIB)}); "
                f"records in classes < 5: {below_k(work / 'big.out.csv')}"
            )
            return
        big = work / "adult_x8.csv"
        n = jittered(big, 8 * 32_561, args.seed)
        a = protect(ADULT, work / "adult.out.csv")
        b = protect(big, work / "big.out.csv")
        wall, cpu = (b.seconds / n) / (a.seconds / 32_561), (b.cpu / n) / (a.cpu / 32_561)
        print(
            f"adult.csv: 32,561 rows, {a.seconds:.1f} s (CPU {a.cpu:.1f} s), peak RSS "
            f"{a.rss / 2**20:.0f} MiB"
        )
        print(
            f"{n:,} rows: {b.seconds:.1f} s (CPU {b.cpu:.1f} s); seconds a row {wall:.2f}× "
            f"adult.csv's, CPU seconds a row {cpu:.2f}× (≤ 1.3: {verdict(cpu <= 1.3)}); peak "
            f"RSS {b.rss / 2**20:.0f} MiB (≤ 1 GiB: {verdict(b.rss <= GIB)})"
        )
        small = below_k(work / "big.out.csv")
        print(f"records in whole-key classes < 5: {small} ({verdict(small == 0)})")
        blocked = sse_sst(big, work / "big.out.csv")
        if args.no_reference:
            print(f"100·SSE/SST of {', '.join(NUMERIC)}: {blocked:.3f} (blocked)")
            return
        w = protect(big, work / "whole.out.csv", "--memory-budget", "1000000")
        whole = sse_sst(big, work / "whole.out.csv")
        print(
            f"100·SSE/SST of {', '.join(NUMERIC)}: blocked {blocked:.3f}, whole file "
            f"{whole:.3f} ({w.seconds:.0f} s, CPU {w.cpu:.0f} s, {w.rss / GIB:.2f} GiB): "
            f"{blocked / whole:.3f}× (≤ 1.10: {verdict(blocked / whole <= 1.10)})"
        )
        print(f"whole-key record linkage: blocked {b.linkage}; whole file {w.linkage}")


if __name__ == "__main__":
    main()
