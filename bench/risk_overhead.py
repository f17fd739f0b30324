"""What computing utility and risk per window costs the engine, measured in one run.

    .venv/bin/python bench/risk_overhead.py                 # 60,000 Adult panel records
    .venv/bin/python bench/risk_overhead.py --records 120000 --repeat 3

The same validated records go through ``Engine.protect_window`` in windows of the policy's
``max_records`` (SQLite state, keyed randomness), fed as the worker feeds them (the records
held come back first in the next window, the clock advances 0.1 s a window, only the last
window flushes, so a wave is decided when it closes), with deploy/policies/adult.yaml's
``risk.sample_every`` set to 1 (every window: SSE/SST, IL1s, DLD, ID), 4, and "never" (the
baseline). The issue's budget: at most 10 % slower than the baseline; the policy's
``risk.sample_every`` (exported as ``privgw_risk_sample_every``) is the knob if it is not.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.keyed.keyed import Keyring
from gateway.policy import policy_from_yaml
from gateway.validation import Validator
from state.sqlite_store import SQLiteStore
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.engine_process.memory import Collector, tune_memory  # the worker's own settings

ROOT = Path(__file__).resolve().parents[1]
NEVER = 10**9


def run(
    text: str, every: int, records: list[tuple[bytes, bytes]], *, like_worker: bool = False
) -> float:
    """Seconds for the engine to protect the records in windows. ``like_worker``: garbage
    collection and malloc as the stream worker runs them (collected between windows, and that
    collection timed too), so the figure compares with the worker's."""
    policy = policy_from_yaml(text.replace("sample_every: 1", f"sample_every: {every}"))
    validator = Validator(policy)
    valid = []
    for i, (key, value) in enumerate(records):
        rid, values = validator.decode_and_validate(value, key)  # type: ignore[misc]
        valid.append(ValidRecord(rid, values, SourceRef("in", 0, i), 0.0))
    size = policy.window.max_records
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "state.db")
        engine = Engine(policy, keyring=Keyring(b"bench-secret-0123456789"), store=store)
        collector = Collector() if like_worker else None
        if collector is not None:
            tune_memory()
            collector.start(time.monotonic())
        held: list[ValidRecord] = []
        starts = range(0, len(valid), size)
        t0 = time.perf_counter()
        for w, start in enumerate(starts):
            window = [*held, *valid[start : start + size]]
            result = engine.protect_window(window, now=w * 0.1, flush_all=start == starts[-1])
            held = list(result.held)
            if collector is not None:
                collector.after_window(time.monotonic())
        elapsed = time.perf_counter() - t0
        if held:
            raise SystemExit(f"{len(held)} records still held after the last flush")
        if collector is not None:
            collector.stop()
        store.close()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--repeat", type=int, default=2, help="best of N per setting")
    args = ap.parse_args()
    text = (ROOT / "deploy" / "policies" / "adult.yaml").read_text()
    assert "sample_every: 1" in text
    survey = PanelSurvey(respondents=args.records // 3, waves=3, seed=2, rows=load_rows())
    records = [encode(r) for r in survey.records()][: args.records]
    best: dict[int, float] = {}
    for _ in range(args.repeat):  # interleaved, so drift in machine load hits all settings
        for every in (NEVER, 1, 4):
            t = run(text, every, records)
            best[every] = min(best.get(every, t), t)
    base = best[NEVER]
    print(f"{len(records)} records, windows of 5000, best of {args.repeat}")
    for every, label in ((NEVER, "never (baseline)"), (1, "every window"), (4, "every 4th")):
        print(
            f"  risk {label:18} {best[every]:7.2f} s  {len(records) / best[every]:9,.0f} rec/s"
            f"  {100 * (best[every] / base - 1):+6.1f} %"
        )


if __name__ == "__main__":
    main()
