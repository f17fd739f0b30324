"""The worker's garbage collection between windows (stream_jobs.engine_process.memory.Collector)."""

from __future__ import annotations

import gc
import weakref

from stream_jobs.engine_process.memory import Collector


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_collects_cycles_after_windows_once_a_second_and_when_idle_then_restores_gc() -> None:
    assert gc.isenabled()
    collector = Collector()
    collector.start(now=0.0)
    try:
        assert not gc.isenabled()  # no automatic collection inside a window
        ref = _cycle()
        assert ref() is not None  # reference counting alone does not free a cycle
        collector.after_window(now=1.0)
        assert ref() is None  # a window's cyclic garbage is collected right after it

        ref = _cycle()
        collector.after_window(now=1.0 + Collector.WINDOW_SECONDS / 2)
        assert ref() is not None  # windows in quick succession: not after each one
        collector.after_window(now=1.0 + Collector.WINDOW_SECONDS)
        assert ref() is None  # but at least once a second

        ref = _cycle()
        busy = 1.0 + Collector.WINDOW_SECONDS
        collector.tick(now=busy + Collector.IDLE_SECONDS / 2)
        assert ref() is not None  # not yet: the worker was busy a moment ago
        collector.tick(now=busy + Collector.IDLE_SECONDS)
        assert ref() is None  # idle for a while: collected anyway
    finally:
        collector.stop()
    assert gc.isenabled()
