"""Replays after a crash (the stream's kill -9): the worker commits a window's offsets only once
its outputs are acknowledged and never past a held record, and it hands the next window to the
engine (which writes its state) before the outputs of the one before are out. A restart
therefore reads records again whose decisions are already in the state, along with the state
of later windows. Every replayed record must publish what it published before (or, never
published, keep k per release with the first copies of the others)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_republication import CLAIM, KEY, POLICY, panel_waves

from gateway.engine.engine import Engine
from gateway.engine.records import InputMarks, ValidRecord
from gateway.policy import policy_from_yaml
from state.memory_store import MemoryStore


@st.composite
def crashes(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "mode": draw(st.sampled_from(["regroup", "cohort", "deferred"])),
        "pool": draw(st.sampled_from(["window", "release"])),
        "slack": draw(st.integers(0, 2)),
        "k": draw(st.integers(2, 4)),
        "n": draw(st.integers(12, 50)),
        "waves": draw(st.integers(2, 4)),
        "skip": draw(st.sampled_from([0.0, 0.2])),
        "change": draw(st.sampled_from([0.0, 0.3])),
        "window": draw(st.integers(3, 40)),
        "crashes": draw(st.lists(st.integers(1, 12), min_size=1, max_size=3)),
        "seed": draw(st.integers(0, 2**31)),
    }


def _stream(p: dict[str, Any]) -> list[ValidRecord]:
    """Every wave's records, one partition, in wave order (shuffled within a wave)."""
    return [r for records in panel_waves(p) for r in records]


@given(crashes())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_replay_publishes_what_was_published_and_keeps_k_per_release(p: dict[str, Any]) -> None:
    text = (
        POLICY.replace("MODE", p["mode"])
        .replace("POOL", p["pool"])
        .replace("SLACK", str(p["slack"]))
        .replace("K", str(p["k"]))
    )
    policy, store = policy_from_yaml(text), MemoryStore()
    stream = _stream(p)
    first: dict[str, bytes] = {}  # record id -> the copy delivered first
    crash_after = list(p["crashes"])  # windows into each incarnation
    start = 0  # the committed offset
    while True:
        engine = Engine(policy, keyring=KEY, store=store)
        held: list[ValidRecord] = []
        # the window whose outputs are not acknowledged yet, and the offset they commit
        pending: tuple[list[Any], int] = ([], start)
        at, windows = start, 0
        crash = crash_after.pop(0) if crash_after else None
        while at < len(stream) or held:
            batch = stream[at : at + p["window"]]
            at += len(batch)
            res = engine.protect_window(
                held + batch,
                now=0.0,
                flush_all=at >= len(stream),
                marks=InputMarks({("in", 0): start}),  # what the worker committed so far
            )
            held = list(res.held)
            windows += 1
            if crash is not None and windows == crash:
                break  # this window's state is written, its outputs and the one's before lost
            outputs, start = pending  # the window before is acknowledged now, then committed
            for rec in outputs:
                assert first.setdefault(rec.record_id, rec.value) == rec.value, (
                    "a replay published a record differently"
                )
            oldest = min((r.source.offset for r in held if r.source is not None), default=at)
            pending = (list(res.published), oldest)
        else:
            for rec in pending[0]:
                assert first.setdefault(rec.record_id, rec.value) == rec.value
            break
    assert len(first) == len(stream)  # nothing lost
    owner = {r.source.record_id: r.respondent_id for r in stream if r.source is not None}
    k = p["k"]
    history: dict[Any, set[str]] = defaultdict(set)
    releases: dict[tuple[int, Any], set[str]] = defaultdict(set)
    for rid, value in first.items():
        row = orjson.loads(value)
        if row["age"] is None:
            continue
        qi = tuple(row[c] for c in CLAIM)
        releases[row["wave"], qi].add(str(owner[rid]))
        history[qi].add(str(owner[rid]))
    small = {key: len(m) for key, m in releases.items() if len(m) < k}
    if p["mode"] != "deferred":  # it promises k over the history only (docs/consistency.md)
        assert not small, f"classes below k within a release after replays: {small}"
    assert all(len(m) >= k for m in history.values()), "a class below k over the history"
