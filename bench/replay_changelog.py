"""What the replay record costs the state's write volume: the changelog of the partitioned backend.

    .venv/bin/python bench/replay_changelog.py                  # 60,000 records, 3 waves
    .venv/bin/python bench/replay_changelog.py --records 200000

Under ``republication: regroup`` and ``cohort`` every respondent's state keeps, under ``p``, what
its records published until their offsets are committed (gateway/grouping/replay.py), so every
published record writes its respondent's entry, also when nothing else about it changed. With
the partitioned backend every entry written is also produced to the compacted changelog topic
(key + value), which a new owner of the partition reads back on assignment; with SQLite it is
the write volume of the file.

The simulated Adult panel of bench/stream_throughput.py (deploy/policies/adult.yaml: regroup,
pool: release) goes through the engine in windows of 5,000, records handed back held in front of
the next window and the offsets committed after each window as the worker commits them (the
smallest offset still held, else the position after the window), so that ``p`` keeps what a
crash could still read again. Every ``put_many`` entry is recorded, as the changelog would carry
it. For each respondent entry it also measures the value without ``p`` and whether anything but
``p`` changed since the entry was last written: the entries written for the replay record alone.
Keys here are 32-byte digests; partition-scoped keys are 2 bytes longer.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.engine.engine import Engine
from gateway.engine.records import InputMarks, SourceRef, ValidRecord
from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy
from gateway.state_store.state_codec import decode_state, encode_state
from gateway.state_store.state_keys import is_group_key
from gateway.validation import Validator
from state.sqlite_store import SQLiteStore
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 5000
PARTITIONS = 3
TOPIC = "survey.responses"


@dataclass
class Volume:
    """One wave's state writes."""

    records: int = 0
    respondent_entries: int = 0
    group_entries: int = 0
    bytes: int = 0  # key + value, every entry
    replay_bytes: int = 0  # what ``p`` adds to the respondent values
    replay_only: int = 0  # respondent entries written although only ``p`` changed
    replay_only_bytes: int = 0


class RecordingStore:
    """The SQLite store, recording every entry written (what a changelog carries)."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self.volume = Volume()
        self._last: dict[bytes, bytes] = {}  # respondent key -> its last value without ``p``

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        return self._store.get_many(keys)

    def put_many(self, entries: Mapping[bytes, bytes]) -> None:
        v = self.volume
        for key, value in entries.items():
            v.bytes += len(key) + len(value)
            if is_group_key(key):
                v.group_entries += 1
                continue
            v.respondent_entries += 1
            doc = decode_state(value)
            doc.pop("p", None)
            without = encode_state(doc)
            v.replay_bytes += len(value) - len(without)
            if self._last.get(key) == without:
                v.replay_only += 1
                v.replay_only_bytes += len(key) + len(value)
            self._last[key] = without
        self._store.put_many(entries)

    def count(self) -> int:
        return self._store.count()

    def close(self) -> None:
        self._store.close()


def committed_after(
    window: Sequence[ValidRecord], held: Sequence[ValidRecord], done: dict[tuple[str, int], int]
) -> None:
    """The worker's commit rule: per partition the smallest offset still held, else the
    position after the window (offsets only increase)."""
    lowest: dict[tuple[str, int], int] = {}
    for r in held:
        assert r.source is not None
        tp = (r.source.topic, r.source.partition)
        lowest[tp] = min(lowest.get(tp, r.source.offset), r.source.offset)
    after: dict[tuple[str, int], int] = {}
    for r in window:
        assert r.source is not None
        tp = (r.source.topic, r.source.partition)
        after[tp] = max(after.get(tp, 0), r.source.offset + 1)
    for tp, position in after.items():
        done[tp] = max(done.get(tp, 0), min(position, lowest.get(tp, position)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--waves", type=int, default=3)
    args = ap.parse_args()
    policy = load_policy(ROOT / "deploy" / "policies" / "adult.yaml")
    survey = PanelSurvey(
        respondents=args.records // args.waves, waves=args.waves, seed=1, rows=load_rows()
    )
    validator = Validator(policy)
    offsets = [0] * PARTITIONS
    records: list[ValidRecord] = []
    wave_at: dict[tuple[int, int], int] = {}  # (partition, offset) -> wave
    for i, row in enumerate(list(survey.records())[: args.records]):
        key, value = encode(row)
        rid, values = validator.decode_and_validate(value, key)
        p = i % PARTITIONS
        records.append(ValidRecord(rid, values, SourceRef(TOPIC, p, offsets[p], 0), i * 1e-4))
        offsets[p] += 1
        wave_at[(p, offsets[p] - 1)] = int(row["wave"])
    with tempfile.TemporaryDirectory(prefix="privgw-changelog-") as tmp:
        store = RecordingStore(SQLiteStore(Path(tmp) / "state.db"))
        engine = Engine(policy, keyring=Keyring(b"bench-secret-0123456789"), store=store)
        held: list[ValidRecord] = []
        done: dict[tuple[str, int], int] = {}
        by_wave: dict[int, Volume] = {}
        for start in range(0, len(records), WINDOW):
            new = records[start : start + WINDOW]
            last = start + WINDOW >= len(records)
            before = Volume(**vars(store.volume))
            window = held + new
            result = engine.protect_window(
                window, now=new[-1].arrived_at, flush_all=last, marks=InputMarks(dict(done))
            )
            held = list(result.held)
            committed_after(window, held, done)
            # a window's writes go to the wave most of its published records belong to (a wave
            # is decided when it closes, in the first window of the next one)
            decided = Counter(wave_at[(r.source.partition, r.source.offset)]
                              for r in result.published if r.source is not None)  # fmt: skip
            if decided:
                got = by_wave.setdefault(decided.most_common(1)[0][0], Volume())
                for name, value in vars(store.volume).items():
                    setattr(got, name, getattr(got, name) + value - getattr(before, name))
                got.records += sum(decided.values())
        store.close()
    print(
        f"{len(records):,} records ({args.waves} waves of the simulated Adult panel), windows of "
        f"{WINDOW:,}, deploy/policies/adult.yaml (regroup, pool: release)"
    )
    print(
        f"{'wave':>4} {'published':>9} {'respondent':>10} {'group':>6} {'KiB':>8} {'B/record':>8} "
        f"{'p KiB':>7} {'p share':>7} {'p only':>7} {'p-only KiB':>10}"
    )
    total = Volume()
    for wave, v in sorted(by_wave.items()):
        for name, value in vars(v).items():
            setattr(total, name, getattr(total, name) + value)
        _row(str(wave), v)
    _row("all", total)


def _row(label: str, v: Volume) -> None:
    print(
        f"{label:>4} {v.records:>9,} {v.respondent_entries:>10,} {v.group_entries:>6,} "
        f"{v.bytes / 1024:>8,.0f} {v.bytes / max(v.records, 1):>8.0f} "
        f"{v.replay_bytes / 1024:>7,.0f} {v.replay_bytes / max(v.bytes, 1):>7.1%} "
        f"{v.replay_only:>7,} {v.replay_only_bytes / 1024:>10,.0f}"
    )


if __name__ == "__main__":
    main()
