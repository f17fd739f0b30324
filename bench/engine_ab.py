"""Two versions of the engine in one process, alternating window by window on the same records.

    .venv/bin/python bench/engine_ab.py --base HEAD~3              # that commit against the tree
    .venv/bin/python bench/engine_ab.py --base v1 --head v2 --records 60000 --rounds 3
    .venv/bin/python bench/engine_ab.py --base HEAD~3 --numeric-only
    .venv/bin/python bench/engine_ab.py --base 3539dcf --feed flush --base-policy
    .venv/bin/python bench/engine_ab.py --base HEAD~1 --feed records   # the in-thread path

What is timed is the engine process's work on a window
(``stream_jobs.engine_process.engine_process``: the packed window decoded, ``Engine.protect_window``
with SQLite state and keyed randomness, the result packed), on the simulated Adult panel of
bench/stream_throughput.py in windows of 5,000 fed as the worker feeds them: the records the engine
held come back first in the next window (they stay in the engine process: only their count travels),
the clock advances 0.1 s a window, only the last window flushes, and the operator's close of each
wave (``privgw wave close``, as bench/stream_throughput.py writes it after the wave's records)
comes with the window that holds the wave's last record. Before 2026-11-28 no close was passed, so
under ``panel`` every wave was decided in the last window's flush. So with ``republication.pool:
release`` a wave is decided when it closes, in one pool, as in the stream. (A flush every window
would close every release at once: returning respondents, short of a quorum within 5,000 records,
would nearly all be grouped afresh, a path the stream seldom takes. ``--feed flush`` does that, for
versions before 2026-11-26, whose engine process does not keep the records it holds.)
``--feed records`` times ``Engine.protect_window`` on the windows as records instead, the held
ones handed back first in the next window: the in-thread engine's path (``--engine thread``,
the partitioned backend) and the file workflow's, which build the window's columns themselves.

How far apart the same code measures (2026-11-28, this machine, the same revision on both
sides): head / base 0.99 and 1.04 at 90,000 records (2 rounds), 0.96 to 1.20 at 200,000 (1-2
rounds, where a wave's decision is a handful of heavy windows). A ratio within that spread is no
difference.

Why one process: on this shared two-core machine the speed of the same code drifts by 10-20 %
between runs a minute apart, more than most changes to the engine. Each version is exported
(``git archive``; the working tree for ``--head`` by default) into a temporary directory with
its packages renamed (``gateway`` -> ``base_gateway``, ...), both are imported side by side,
and their windows alternate (the order swapped every window and round), so a drift of the
machine falls on both. Each version has its own state file. The figure that matters is the
ratio head / base, printed for wave 1 (every respondent new) and waves 2-3 (returning), over
all rounds and round by round (their spread is what a difference must stand out of). A side's
windows count as wave 1's until it has decided as many records as wave 1 has, so the window that
decides wave 1 counts there however late the wave closes (under ``panel``, after its grace).

The process runs under the engine process's memory policy (``tune_memory``: glibc keeps the heap
between windows, start-up objects frozen out of the collector), as the engine does in the stream;
before 2026-11-29 it ran under glibc's defaults, which hand the heap back after every window and
fault it in again on the next (``--memory default``). Both sides share the process, so both run
under the same policy.

It then says whether the two versions gave the same bytes: the published columns and the
window reports of every window (digested outside the timed part), and the rows of each state
file at the end of every round. A change meant to keep the output must print "identical" for
all three under ``--base-policy``; with each version's own policy a difference may be meant.
"""

from __future__ import annotations

import argparse
import functools
import gc
import hashlib
import importlib
import marshal
import pickle
import pickletools
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import stream_throughput  # the bench's policies

from gateway.policy import policy_from_yaml
from gateway.validation import Validator
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.engine_process.memory import tune_memory

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "state", "stream_jobs")
WINDOW = 5000
SECRET = b"bench-secret-0123456789"


def export(revision: str | None, side: str, into: Path) -> Path:
    """The packages of ``revision`` (None: the working tree) under ``<side>_<package>``."""
    root = into / side
    root.mkdir()
    if revision is None:
        for pkg in PACKAGES:
            shutil.copytree(ROOT / pkg, root / pkg)
    else:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", revision, *PACKAGES],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    # each version with its own Adult policy: an older parser refuses newer sections
    policy = "deploy/policies/adult.yaml"
    (root / "adult.yaml").write_text(
        (ROOT / policy).read_text()
        if revision is None
        else subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{revision}:{policy}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    imports = re.compile(rf"\b(from|import) ({'|'.join(PACKAGES)})\b")
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            path.write_text(imports.sub(rf"\1 {side}_\2", path.read_text()))
        (root / pkg).rename(root / f"{side}_{pkg}")
    return root


def side_module(side: str, pkg: str, *names: str) -> ModuleType:
    """The side's first module of ``names`` in its package ``pkg`` that it has: a version laid
    out in subpackages (issue 47: ``engine.engine``) or before (``engine``). The names are
    given without their package, so that the re-layout's rewriting leaves them as they are."""
    for name in names[:-1]:
        try:
            return importlib.import_module(f"{side}_{pkg}.{name}")
        except ModuleNotFoundError:
            continue
    return importlib.import_module(f"{side}_{pkg}.{names[-1]}")


def load(side: str) -> tuple[ModuleType, ModuleType]:
    engine = side_module(side, "gateway", "engine.engine", "engine")
    process = side_module(side, "stream_jobs", "engine_process.engine_process", "engine_process")
    return engine, process


def _child_parts(side: str, process: ModuleType, feed: str) -> tuple[Any, Any]:
    """The side's window packing and the child's answer to a request: in engine_wire and
    engine_child since those were split out of engine_process, in engine_process before. The
    worker's feed needs a version whose engine process keeps the records it hands back held
    (2026-11-26 on)."""
    try:
        wire = side_module(side, "stream_jobs", "engine_process.engine_wire", "engine_wire")
        child = side_module(side, "stream_jobs", "engine_process.engine_child", "engine_child")
    except ModuleNotFoundError:
        wire = child = process
    if not hasattr(wire, "HeldInChild"):
        if feed == "worker":
            raise SystemExit(
                f"the {side} version's engine process does not keep the records it holds, so "
                "it cannot be fed the worker's way: compare with --feed flush"
            )
        return getattr(wire, "encode_window", None) or process._encode_window, child._answer
    # the child keeps what it hands back held
    answer = functools.partial(_answer_keeping_held, child._answer, wire.HeldInChild())
    return wire.encode_window, answer


def _answer_keeping_held(answer: Any, held: Any, *args: Any) -> Any:
    return answer(*args, held)


PARTS = ("published columns", "window reports", "state")


def digest_reply(hashes: dict[str, Any], reply: tuple[Any, ...], side: str) -> None:
    """Fold a window's reply into the side's digests. The report travels pickled, naming its
    classes' modules (``base_gateway...``): those are renamed alike for both sides (the same
    length, so the same bytes when the reports are equal), and folded by the class's module's
    last name, so that two layouts of the packages compare (issue 47). The published columns
    are folded by value (their ``repr`` once unpacked): ``marshal`` writes a value met again
    as a reference to the first, so the same values packed from objects shared differently
    (a roster kept in memory, or decoded afresh) give other bytes."""
    hashes[PARTS[0]].update(_by_value(bytes(reply[1]), side))
    report = reply[2]
    for pkg in PACKAGES:
        report = report.replace(f"{side}_{pkg}".encode(), f"side_{pkg}".encode())
    hashes[PARTS[1]].update(_layout_free(report))


def _by_value(packed: bytes, side: str) -> bytes:
    """The packed published columns by value, unpacked by the side's own wire (versions
    without ``_unpack`` packed plain ``marshal``; bytes that neither reads are taken as
    they are)."""
    wire = side_module(side, "stream_jobs", "engine_process.engine_wire", "engine_process")
    try:
        return repr(getattr(wire, "_unpack", marshal.loads)(packed)).encode()
    except (ValueError, EOFError, TypeError):
        return packed


_MODULE_PATH = re.compile(rf"side_(?:{'|'.join(PACKAGES)})(?:\.\w+)+")


def _layout_free(blob: bytes) -> bytes:
    """A pickle's opcodes and arguments, each module path cut to its last name (and frame
    sizes left out: they count the paths' characters)."""
    out = []
    for op, arg, _ in pickletools.genops(blob):
        if op.name == "FRAME":
            continue
        path = isinstance(arg, str) and _MODULE_PATH.fullmatch(arg)
        out.append(f"{op.name} {arg.rpartition('.')[2] if path else arg!r}")
    return "\n".join(out).encode()


def digest_result(hashes: dict[str, Any], res: Any) -> None:
    """Fold a window's result (``--feed records``) into the side's digests: each published
    record's id and bytes, and the report's fields."""
    for rec in res.published:
        hashes[PARTS[0]].update(rec.record_id.encode() + b"\0" + rec.value + b"\0")
    hashes[PARTS[1]].update(repr(res.report).encode())  # a dataclass: every field, in order


def digest_state(h: Any, store: Any) -> None:
    """Fold a state store's entries (its ``items()``, in key order) into ``h``."""
    for key, value in store.items():
        h.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)


def report_of(reply: tuple[Any, ...]) -> Any:
    """The window's report: how many records the engine handed back held (they start the next
    window), and how many it decided (published or suppressed)."""
    report, _ = pickle.loads(reply[2])
    return report


def _module_of(side: str, name: str, engine_mod: ModuleType) -> ModuleType:
    """The side's module ``name`` of the engine (records, keyed_inputs: in the engine package
    since issue 47, at the top of gateway since the engine was laid out by concept), else its
    engine module, which held them before."""
    try:
        return side_module(side, "gateway", f"engine.{name}", name)
    except ModuleNotFoundError:
        return engine_mod


def prepare(side: str, text: str, answers: list[Any], state: Path, feed: str) -> tuple[Any, ...]:
    """The side's engine process work: its windows packed, its engine and store built."""
    engine_mod, process = load(side)
    records = _module_of(side, "records", engine_mod)
    keyed_inputs = _module_of(side, "keyed_inputs", engine_mod)
    policy = importlib.import_module(f"{side}_gateway.policy").policy_from_yaml(text)
    valid = [
        records.ValidRecord(rid, values, records.SourceRef("in", i % 3, i, 0), 0.0)
        for i, (rid, values) in enumerate(answers)
    ]
    engine, store = process.EngineSpec(policy, state, SECRET).build()
    if feed == "records":  # handed over as they are: the in-thread engine's and files' path
        return None, engine, store, [valid[s : s + WINDOW] for s in range(0, len(valid), WINDOW)]
    # packed as the worker packs them: with their keyed digests where the version computes
    # them in the worker (untimed, as the worker's time is)
    pack, answer = _child_parts(side, process, feed)
    if hasattr(keyed_inputs, "KeyedInputs"):
        keyring = side_module(side, "gateway", "keyed.keyed", "keyed").Keyring(SECRET)
        pack = functools.partial(pack, inputs=keyed_inputs.KeyedInputs(policy, keyring))
    blobs = [pack(valid[s : s + WINDOW]) for s in range(0, len(valid), WINDOW)]
    return answer, engine, store, blobs


def prepare_own(revision: str | None, tmp: Path, answers: list[Any], state: str) -> tuple[Any, ...]:
    """One version (default: the working tree) exported as the head side and prepared under
    its own Adult policy, fed the worker's way: :func:`prepare`'s (answer, engine, store,
    blobs). For the benches that run one version (engine_profile, roster_bytes)."""
    root = export(revision, "head", tmp)
    sys.path.insert(0, str(root))
    text = (root / "adult.yaml").read_text()
    return prepare("head", text, answers, tmp / state, "worker")


def closed_through(answers: list[Any], windows: int) -> list[int | None]:
    """Per window, the newest wave closed by the time it is fed: as bench/stream_throughput.py
    writes the operator's close of a wave (``privgw wave close``) after the wave's last record,
    a wave is closed in the window that holds its last record. None: no record carries a wave."""
    last: dict[int, int] = {}  # wave -> index of its last record
    for i, (_, values) in enumerate(answers):
        wave = values.get("wave")
        if isinstance(wave, int):
            last[wave] = i
    out: list[int | None] = []
    for w in range(windows):
        end = (w + 1) * WINDOW
        done = [wave for wave, i in last.items() if i < end]
        out.append(max(done) if done else None)
    return out


def marks_of(side: str) -> Any:
    """The side's ``InputMarks`` with a wave closed (a version without them: None, no marks)."""
    engine_mod, _ = load(side)
    marks = getattr(_module_of(side, "records", engine_mod), "InputMarks", None)
    if marks is None:
        return lambda closed: None
    if "closed_through" not in getattr(marks, "__dataclass_fields__", {}):
        return lambda closed: marks()  # a version before wave closes: offsets only
    return lambda closed: marks(closed_through=closed)


def panel_answers(records: int, policy_text: str) -> list[Any]:
    """The first ``records`` of the simulated Adult panel (3 waves), validated against the
    policy as the worker hands them over: what every bench fed the engine's way takes."""
    survey = PanelSurvey(respondents=records // 3, waves=3, seed=1, rows=load_rows())
    raw = [encode(r) for r in survey.records()][:records]
    validator = Validator(policy_from_yaml(policy_text))
    return [validator.decode_and_validate(value, key) for key, value in raw]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--head", default=None, help="git revision (default: the working tree)")
    ap.add_argument("--records", type=int, default=90_000)
    ap.add_argument("--rounds", type=int, default=2, help="fresh state each round")
    ap.add_argument("--numeric-only", action="store_true")
    ap.add_argument(
        "--base-policy",
        action="store_true",
        help="both sides run the base version's Adult policy (by default each runs its own)",
    )
    ap.add_argument(
        "--feed",
        choices=("worker", "flush", "records"),
        default="worker",
        help="worker: held records back first, only the last window flushed (the stream's "
        "path); flush: every window flushed (versions before 2026-11-26 know only this); "
        "records: fed as the worker feeds it, but as records to Engine.protect_window (the "
        "in-thread engine's path, and the file workflow's), the held ones back in each window",
    )
    ap.add_argument(
        "--memory",
        choices=("engine", "default"),
        default="engine",
        help="engine: malloc and the collector as the engine process sets them (tune_memory; "
        "the default since 2026-11-29); default: Python's and glibc's own",
    )
    args = ap.parse_args()
    if args.memory == "engine":
        tune_memory()  # the engine process's policy, process-wide: both sides run under it
    text = stream_throughput.policy_text(args.numeric_only)
    answers = panel_answers(args.records, text)
    sides = ("base", "head")
    with tempfile.TemporaryDirectory(prefix="privgw-ab-") as tmp:
        texts = {}
        for side, revision in zip(sides, (args.base, args.head), strict=True):
            root = export(revision, side, Path(tmp))
            sys.path.insert(0, str(root))
            texts[side] = text if args.numeric_only else (root / "adult.yaml").read_text()
        if args.base_policy:  # the same work on both sides: the code compared, not the policies
            texts["head"] = texts["base"]
            if not re.search(r"^republication:", texts["base"], re.MULTILINE):
                # a version before republication modes knew only the deferred one
                texts["head"] += "republication: {mode: deferred}\n"
        spent = {side: [0.0, 0.0] for side in sides}  # wave 1, waves 2-3
        hashes = {side: {part: hashlib.sha256() for part in PARTS} for side in sides}
        # a side's window is wave 1's until that side has decided (published or suppressed) as
        # many records as wave 1 has: the window that does so, however late the wave closes
        # (under ``panel`` it closes after its grace, among wave 2's records), is wave 1's too
        wave1 = len(answers) // 3
        counted = [wave1 * args.rounds, (len(answers) - wave1) * args.rounds]
        closes = closed_through(answers, len(range(0, len(answers), WINDOW)))
        marks_for = {s: marks_of(s) for s in sides}  # a wave closed -> the side's marks
        per_round: list[tuple[float, float]] = []  # head / base in each round: its spread
        for rnd in range(args.rounds):
            before = {side: list(spent[side]) for side in sides}
            runs = {
                s: prepare(s, texts[s], answers, Path(tmp) / f"{s}{rnd}.db", args.feed)
                for s in sides
            }
            windows = len(runs["base"][3])
            kept = dict.fromkeys(sides, 0)  # records held in each side's engine
            decided = dict.fromkeys(sides, 0)  # records each side published or suppressed
            held: dict[str, list[Any]] = {side: [] for side in sides}  # --feed records
            gc.disable()  # collected between windows, as the engine process does
            try:
                for w in range(windows):
                    order = sides if (w + rnd) % 2 == 0 else sides[::-1]
                    last = w == windows - 1
                    for side in order:
                        answer, engine, store, blobs = runs[side]
                        phase = 0 if decided[side] < wave1 else 1
                        marks = marks_for[side](closes[w])
                        if args.feed == "records":
                            t0 = time.perf_counter()
                            res = engine.protect_window(
                                [*held[side], *blobs[w]], now=w * 0.1, flush_all=last, marks=marks
                            )
                            spent[side][phase] += time.perf_counter() - t0
                            digest_result(hashes[side], res)
                            decided[side] += (  # (a base before 2026-12-08 withholds none)
                                res.report.published
                                + getattr(res.report, "withheld", 0)
                                + res.report.suppressed
                            )
                            held[side] = list(res.held)
                            kept[side] = len(held[side])
                            gc.collect(0)
                            continue
                        if args.feed == "flush":
                            ask: tuple[Any, ...] = ("protect", [blobs[w]], 0.0, True)
                        else:
                            ask = ("protect", [blobs[w]], w * 0.1, last, marks, kept[side])
                        t0 = time.perf_counter()
                        reply = answer(ask, engine, store, False)
                        spent[side][phase] += time.perf_counter() - t0
                        digest_reply(hashes[side], reply, side)
                        report = report_of(reply)
                        decided[side] += (
                            report.published + getattr(report, "withheld", 0) + report.suppressed
                        )
                        if args.feed == "worker":
                            kept[side] = report.held
                        gc.collect(0)
                if any(kept.values()):
                    raise SystemExit(f"records still held after the last flush: {kept}")
            finally:
                gc.enable()
                for side, (_, _, store, _) in runs.items():
                    digest_state(hashes[side][PARTS[2]], store)
                    store.close()
            head_s, base_s = (
                [spent[side][k] - before[side][k] for k in (0, 1)] for side in ("head", "base")
            )
            per_round.append((head_s[0] / base_s[0], head_s[1] / base_s[1]))
    n1, n23 = counted
    for side in sides:
        w1, w23 = spent[side]
        print(
            f"{side}: wave 1 {w1 / n1 * 1e6:.1f} µs a record, waves 2-3 {w23 / n23 * 1e6:.1f}, "
            f"all {(w1 + w23) / (n1 + n23) * 1e6:.1f}"
        )
    (b1, b23), (h1, h23) = spent["base"], spent["head"]
    print(
        f"head / base: wave 1 {h1 / b1:.3f}, waves 2-3 {h23 / b23:.3f}, "
        f"all {(h1 + h23) / (b1 + b23):.3f}"
    )
    print(
        "head / base by round: wave 1 "
        + " ".join(f"{r[0]:.3f}" for r in per_round)
        + ", waves 2-3 "
        + " ".join(f"{r[1]:.3f}" for r in per_round)
    )
    base, head = hashes["base"], hashes["head"]
    verdicts = (
        f"{p} {'identical' if base[p].digest() == head[p].digest() else 'differ'} "
        f"({head[p].hexdigest()[:12]})"
        for p in PARTS
    )
    print("output: " + ", ".join(verdicts))


if __name__ == "__main__":
    main()
