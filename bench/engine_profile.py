"""Where the engine process's time goes, wave 1 and the returning waves apart: a cProfile of its
work on the windows bench/engine_ab.py feeds (the worker's way, each wave's close with the window
that holds its last record), summed into the engine's steps.

    .venv/bin/python bench/engine_profile.py                    # 90,000 records, the tree
    .venv/bin/python bench/engine_profile.py --records 200000
    .venv/bin/python bench/engine_profile.py --top 40           # and the functions by own time

Each step's share is its functions' cumulative time over the phase's (cProfile counts a
function called inside another step in both: the steps are listed from the outermost, and the
indented ones are parts of the step above). cProfile weighs Python-level calls up, so steps
that run in C (numpy, SQLite, msgspec) are if anything larger than shown. A window counts as
wave 1's until the engine has decided (published or suppressed) as many records as wave 1 has,
as in bench/engine_ab.py.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_ab as ab

# (label, indent, (path suffix, function name) of each function whose cumulative time it sums)
STEPS: tuple[tuple[str, int, tuple[tuple[str, str], ...]], ...] = (
    ("the wave's decision (panel/cohorts.decide_wave)", 0, (("panel/cohorts.py", "decide_wave"),)),
    (
        "whole-key MDAV of the new respondents",
        1,
        (("grouping/microaggregation.py", "mdav_blocks"),),
    ),
    ("the local search (grouping/refine.py)", 1, (("grouping/refine.py", "refine_groups"),)),
    (
        "tuples, linked sets and raked weights (cohorts._publish)",
        1,
        (("panel/cohorts.py", "_publish"),),
    ),
    ("the published columns (engine/columns.output)", 0, (("engine/columns.py", "output"),)),
    (
        "randomized response",
        1,
        (("mechanisms/rr_protection.py", "apply"),),
    ),
    ("noise", 1, (("mechanisms/noise_protection.py", "apply"),)),
    (
        "sticky draws looked up and stored (both above)",
        2,
        (("mechanisms/protection.py", "recall"), ("mechanisms/protection.py", "keep")),
    ),
    (
        "respondent states read (a panel: only those its draws do not know)",
        0,
        (("engine/engine.py", "_read_states"),),
    ),
    (
        "rosters (draws and carried values in them) and states written",
        0,
        (("panel/step.py", "_write"),),
    ),
    ("roster read (decoded, opened)", 0, (("panel/step.py", "_load"),)),
    ("the window's measures (panel/measures.py)", 0, (("panel/measures.py", "panel_measures"),)),
    ("imputed members built (panel/imputed.extended)", 0, (("panel/imputed.py", "extended"),)),
    ("an open wave's records parked", 0, (("engine/claim_step.py", "parked"),)),
    (
        "the wire (window decoded, result encoded)",
        0,
        (
            ("engine_process/engine_wire.py", "decode_window"),
            ("engine_process/engine_wire.py", "encode_result"),
        ),
    ),
)


def step_times(stats: pstats.Stats) -> dict[str, float]:
    """Each step's cumulative seconds (its functions' summed; recursion counted once)."""
    table = stats.stats  # type: ignore[attr-defined]
    out: dict[str, float] = {}
    for label, _, funcs in STEPS:
        total = 0.0
        for (path, _, name), (_, _, _, cum, _) in table.items():
            if any(path.endswith(p) and name == f for p, f in funcs):
                total += cum
        out[label] = total
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=90_000)
    ap.add_argument("--revision", default=None, help="git revision (default: the working tree)")
    ap.add_argument("--top", type=int, default=0, help="also the N functions by own time")
    args = ap.parse_args()
    answers = ab.panel_answers(args.records, ab.stream_throughput.policy_text(False))
    wave1 = len(answers) // 3
    with tempfile.TemporaryDirectory(prefix="privgw-profile-") as tmp:
        answer, engine, store, blobs = ab.prepare_own(args.revision, Path(tmp), answers, "state.db")
        closes = ab.closed_through(answers, len(blobs))
        marks_for = ab.marks_of("head")
        profiles = (cProfile.Profile(), cProfile.Profile())
        spent = [0.0, 0.0]
        kept = decided = 0
        gc.disable()  # collected between windows, as the engine process does
        try:
            for w, blob in enumerate(blobs):
                phase = 0 if decided < wave1 else 1
                ask = ("protect", [blob], w * 0.1, w == len(blobs) - 1, marks_for(closes[w]), kept)
                t0 = time.perf_counter()
                profiles[phase].enable()
                reply = answer(ask, engine, store, False)
                profiles[phase].disable()
                spent[phase] += time.perf_counter() - t0
                report = ab.report_of(reply)
                kept = report.held
                decided += report.published + report.withheld + report.suppressed
                gc.collect(0)
        finally:
            gc.enable()
            store.close()
    records = (wave1, len(answers) - wave1)
    for phase, (title, prof) in enumerate(zip(("wave 1", "waves 2-3"), profiles, strict=True)):
        stats = pstats.Stats(prof)
        total = stats.total_tt  # type: ignore[attr-defined]
        print(
            f"== {title}: {spent[phase]:.2f} s for {records[phase]:,} records "
            f"({spent[phase] / records[phase] * 1e6:.1f} µs a record; profiled {total:.2f} s)"
        )
        for (label, indent, _), seconds in zip(STEPS, step_times(stats).values(), strict=True):
            print(f"{'  ' * indent}{label:<{62 - 2 * indent}} {seconds / total:6.1%}")
        if args.top:
            stats.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
