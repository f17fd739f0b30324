"""Memory policy of the processes that run the engine: when the garbage collector runs, and
how glibc's malloc keeps the heap between windows. The worker applies it, and so does the
engine's child process (``stream_jobs.engine_process.engine_process``)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys

__all__ = ["Collector", "tune_memory"]

# Each window allocates and frees megabytes of small objects; glibc's default 128 KiB trim
# threshold hands the heap top back to the kernel after every window and page-faults it in
# again on the next (measured: orjson.dumps of 5,000 output rows 3.7 µs/row, 0.5 with this).
_M_TRIM_THRESHOLD, _M_TOP_PAD = -1, -2  # mallopt parameters (malloc.h)
_TRIM_THRESHOLD_BYTES = 256 << 20
_TOP_PAD_BYTES = 64 << 20


class Collector:
    """Cyclic garbage collection between windows rather than inside them.

    A window allocates a few dicts per record and keeps tens of thousands of young container
    objects alive while the engine works (decoded states, value tuples, output rows). With
    CPython's default thresholds the collector ran hundreds of times per window (a third of the
    engine's time); with raised ones a generation-0 collection still fired in the middle of most
    windows and walked all of them — about 10 ms a window, 5-6 % of the engine's time (engine
    alone on 200,000 panel records: 28.6 against 26.9 µs/record). Once the window is done,
    reference counting has freed them, so the worker turns automatic collection off while it
    runs and collects after a window instead, at most once a second: generation 0 each time, 1
    every 10th, 2 every 100th, and at least every few seconds while idle, so cycles the clients
    make when no records arrive are collected too. Automatic collection is restored when the
    worker stops.

    Once a second rather than after every window: a collection walks every young object still
    alive, and in the worker those are mostly the next window's records, already buffered (3
    container objects a record, ~15,000 for a window of 5,000); walking them after every window
    cost the worker 2.3-3.1 µs a record. The cyclic garbage a window leaves is a few objects.
    """

    __slots__ = ("_count", "_last", "_was_enabled")
    IDLE_SECONDS = 5.0
    WINDOW_SECONDS = 1.0  # after windows, collect at most this often

    def __init__(self) -> None:
        self._count = 0
        self._last = 0.0
        self._was_enabled = gc.isenabled()

    def start(self, now: float) -> None:
        self._was_enabled = gc.isenabled()
        self._last = now
        gc.disable()

    def stop(self) -> None:
        if self._was_enabled:
            gc.enable()

    def after_window(self, now: float) -> None:
        if now - self._last >= self.WINDOW_SECONDS:
            self._collect(now)

    def tick(self, now: float) -> None:
        if now - self._last >= self.IDLE_SECONDS:
            self._collect(now)

    def _collect(self, now: float) -> None:
        self._count += 1
        n = self._count
        gc.collect(2 if n % 100 == 0 else 1 if n % 10 == 0 else 0)
        self._last = now


def tune_memory() -> None:
    gc.freeze()  # what start-up allocated (modules, policy, clients) is never garbage
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # not glibc: leave malloc alone
            libc = ctypes.CDLL(None)
            libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)
            libc.mallopt(_M_TOP_PAD, _TOP_PAD_BYTES)
