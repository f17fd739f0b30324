"""The window lifecycle: a window closed, handed to the engine, and its results released.

``stream_jobs.windows.windows.WindowBuffer`` decides when a window closes (a count of new records, a
timer, a held record's timeout) and which offsets its outputs may commit; this module moves the
window through the engine:

- :meth:`WindowLifecycle.protect` takes the buffered window (and the intake's dead letters and
  forwards) and hands it to the engine's thread, returning at once: the event loop goes on
  fetching and validating the next window meanwhile (on another core when the engine runs in a
  process of its own). One window at a time is in the engine.
- :meth:`WindowLifecycle.protected` finishes it: keeps what the engine holds, hands the next
  window over first when it is due already (the engine does not wait for the producer), then
  releases the outputs to ``stream_jobs.delivery.delivery`` and accounts for the window once they
  settle.
- Every engine is reached the same way (:class:`WindowEngine`): each batch is offered to its
  ``pack`` as it is buffered (:meth:`pack_ahead`), while the engine protects the window before,
  and the window is prepared on the loop's thread and run on the engine's. An engine in a
  process of its own packs its records there; one in the worker's process packs nothing
  (:class:`InThread`).

A window the engine fails on leaves ``engine_failed`` set: its records are out of the buffer but
neither published nor held, so nothing after them may be committed (they are read again).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gateway.engine.records import (
    NO_MARKS,
    InputMarks,
    ValidRecord,
    WindowReport,
    WindowResult,
)
from stream_jobs.delivery.delivery import Delivery, Forward
from stream_jobs.engine_process.engine_process import PackedRecords
from stream_jobs.engine_process.memory import Collector
from stream_jobs.intake.dlq import DeadLetter
from stream_jobs.intake.intake import Intake
from stream_jobs.ops.worker_stats import WorkerStats
from stream_jobs.windows.windows import Flush, FlushReason, WindowBuffer

log = logging.getLogger(__name__)

_POLL_MS = 200  # longest wait for input, so that stop requests are seen quickly
_ENGINE_POLL_MS = 5  # the same while a window is in the engine


WindowObserver = Callable[[WindowReport, Flush, float], None]


@runtime_checkable
class WindowEngine(Protocol):
    """What the worker's windows need of an engine, whichever process it runs in:
    ``stream_jobs.engine_process.engine_process.EngineProcess`` (a child of its own),
    ``EngineShards`` (children), or an engine of the worker's process behind :class:`InThread`."""

    version: str

    def metadata(self) -> dict[str, object]: ...

    def pack(self, records: Sequence[ValidRecord]) -> bytes | None:
        """Records packed ahead of their window, for :meth:`prepare`'s ``tail`` (None: this
        engine packs nothing ahead)."""
        ...

    def prepare(
        self,
        records: Sequence[ValidRecord],
        *,
        now: float,
        flush_all: bool = False,
        tail: PackedRecords | None = None,
        marks: InputMarks = NO_MARKS,
    ) -> Callable[[], WindowResult]:
        """The window made ready on the event loop's thread; the call returned protects it on
        the engine's thread. ``tail``: its last records, as :meth:`pack` packed them."""
        ...


class ProtectsWindows(Protocol):
    """An engine called in the worker's process: ``gateway.engine.engine.Engine``,
    ``gateway.engine.shards.ShardedEngine``, or a test's wrapper of one."""

    version: str

    def metadata(self) -> dict[str, object]: ...

    def protect_window(
        self,
        records: Sequence[ValidRecord],
        *,
        now: float,
        flush_all: bool = False,
        marks: InputMarks = NO_MARKS,
    ) -> WindowResult: ...


class InThread:
    """An engine of the worker's process as a :class:`WindowEngine`: nothing to pack, and the
    window's call is the engine's own."""

    def __init__(self, engine: ProtectsWindows) -> None:
        self.engine = engine
        self.version = engine.version

    def metadata(self) -> dict[str, object]:
        return self.engine.metadata()

    def pack(self, records: Sequence[ValidRecord]) -> None:
        return None

    def prepare(
        self,
        records: Sequence[ValidRecord],
        *,
        now: float,
        flush_all: bool = False,
        tail: PackedRecords | None = None,
        marks: InputMarks = NO_MARKS,
    ) -> Callable[[], WindowResult]:
        return functools.partial(
            self.engine.protect_window,
            records,
            now=now,
            flush_all=flush_all,
            marks=marks,
        )


def window_engine(engine: WindowEngine | ProtectsWindows) -> WindowEngine:
    """``engine`` as the worker's windows reach it (told apart once, when the worker is built)."""
    return engine if isinstance(engine, WindowEngine) else InThread(engine)


@dataclass(slots=True)
class _PackedAhead:
    """The buffer's new records packed as they were validated, one segment per batch: valid
    while the buffer's list of new records is the one they were packed from."""

    of: list[ValidRecord]
    segments: list[bytes]
    count: int = 0


@dataclass(frozen=True, slots=True)
class Protecting:
    """A window handed to the engine, and what goes out with it."""

    flush: Flush
    dead: list[DeadLetter]
    forward: list[Forward]
    future: asyncio.Future[WindowResult] | None  # None: nothing to protect
    t0: float

    def done(self) -> bool:
        return self.future is None or self.future.done()


class WindowLifecycle:
    """The worker's windows from the buffer through the engine to the producer. ``observers``
    see each window's report once its outputs settled."""

    def __init__(  # noqa: PLR0917
        self,
        engine: WindowEngine | ProtectsWindows,
        buffer: WindowBuffer,
        intake: Intake,
        delivery: Delivery,
        stats: WorkerStats,
        gc: Collector,
        *,
        clock: Callable[[], float],
        observers: list[WindowObserver],
        owned: Callable[[], list[tuple[str, int]]] = list,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``owned``: the worker's partitions now (the engine's release clock waits for those
        not heard from yet). ``wall_clock``: the clock of the records' timestamps (a panel
        wave's maximum counts from them too, across restarts)."""
        self.engine = window_engine(engine)
        self.observers = observers
        self._buffer = buffer
        self._intake = intake
        self._delivery = delivery
        self._stats = stats
        self._gc = gc
        self._clock, self._wall_clock = clock, wall_clock
        self._engine_thread = ThreadPoolExecutor(1, thread_name_prefix="privgw-engine")
        self.protecting: Protecting | None = None  # the window in the engine
        # a window the engine failed on: its records are out of the buffer but neither
        # published nor held, so nothing after them may be committed (they are read again)
        self.engine_failed = False
        self._ahead: _PackedAhead | None = None
        self._owned = owned
        intake.on_buffered = self.pack_ahead

    def close(self) -> None:
        """Wait for the engine's thread to finish (the worker's shutdown)."""
        self._engine_thread.shutdown(wait=True)

    def has_pending(self) -> bool:
        """Anything a flush would produce or commit: records, dead letters, forwards."""
        buf = self._buffer
        return bool(
            buf.size
            or self._intake.dead
            or self._intake.forward
            or buf.opened_at is not None
            or self.protecting is not None
        )

    def waiting(self) -> tuple[list[ValidRecord], list[ValidRecord]]:
        """(records not decided yet: the open window's, and the new ones of the window in the
        engine; records held on purpose: in the buffer, or handed back to the engine in front
        of its window). Copies: the metrics' thread asks."""
        p = self.protecting
        undecided, held = list(self._buffer.new), list(self._buffer.held)
        if p is not None:
            cut = len(p.flush.records) - p.flush.new
            return p.flush.records[cut:] + undecided, p.flush.records[:cut] + held
        return undecided, held

    def hands_over(self, ahead: int) -> bool:
        """Whether a due window goes to the engine now, waiting for the window in it first:
        while the engine is busy the worker may go on validating into the buffer, up to
        ``ahead`` new records, rather than idle (the window then grows past its count)."""
        p = self.protecting
        return p is None or p.done() or len(self._buffer.new) >= ahead

    def poll_timeout_ms(self) -> int:
        """How long a fetch may wait: until the buffer's window is due, or briefly while a
        window is in the engine."""
        if self.protecting is not None:
            return _ENGINE_POLL_MS  # come back soon to send the window the engine finishes
        deadline = self._buffer.deadline()
        if deadline is None:
            return _POLL_MS
        return max(0, min(_POLL_MS, int((deadline - self._clock()) * 1000) + 1))

    def pack_ahead(self, valid: list[ValidRecord]) -> None:
        """Pack the records just buffered for the engine's process now, while it protects the
        window before, rather than when their window is handed over (the engine waits then)."""
        new = self._buffer.new
        ahead = self._ahead
        if ahead is None or ahead.of is not new:  # taken or filtered since: start again
            ahead = self._ahead = _PackedAhead(new, [])
        if ahead.count + len(valid) != len(new):
            return  # not contiguous with what was packed: the hand-over packs these
        try:
            segment = self.engine.pack(valid)
        except Exception:  # the hand-over packs the window whole, and fails as the engine
            segment = None
        if segment is None:  # failed, or an engine that packs nothing ahead
            ahead.count = -1  # covers nothing from now on
            return
        ahead.segments.append(segment)
        ahead.count = len(new)

    async def flush(self, reason: FlushReason, *, flush_all: bool = False) -> None:
        """Protect everything buffered and wait for it (revocation, shutdown): the window in
        the engine first, if any, then the rest."""
        await self.protected()
        self.protect(reason, flush_all=flush_all)
        await self.protected()

    def protect(self, reason: FlushReason, *, flush_all: bool = False) -> None:
        """Hand the buffered window to the engine's thread and return at once: the event loop
        goes on fetching and validating the next window meanwhile (on another core when the
        engine runs in its own process). One window at a time is in the engine;
        :meth:`protected` finishes it."""
        assert self.protecting is None, "one window at a time in the engine"
        t0 = time.perf_counter()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and (ahead.of is not self._buffer.new or ahead.count != len(ahead.of)):
            ahead = None  # they no longer cover the new records exactly
        flush = self._buffer.take(reason, self._clock())
        dead, forward = self._intake.take()
        future: asyncio.Future[WindowResult] | None = None
        if flush.records:
            self._stats.engine_since = time.monotonic()
            # in the engine's own thread: the event loop keeps heartbeating, fetching and
            # settling the previous window while this one is protected and fsynced
            try:
                call = self._engine_call(flush.records, flush_all, ahead)
            except BaseException:  # packing failed: as if the engine had failed on it
                self.engine_failed = True
                raise
            future = asyncio.get_running_loop().run_in_executor(self._engine_thread, call)
        self.protecting = Protecting(flush, dead, forward, future, t0)

    def _engine_call(
        self, records: list[ValidRecord], flush_all: bool, ahead: _PackedAhead | None
    ) -> Callable[[], WindowResult]:
        """What the engine's thread runs for a window, prepared here (with the records packed
        ahead as they arrived, if ``ahead`` covers them)."""
        engine, now = self.engine, self._clock()
        # what a replay can no longer reach (gateway.grouping.replay), for every partition
        # owned (-1: nothing committed), so the engine's release clock knows all of them
        committed = self._buffer.committed_offsets()
        for tp in self._owned():
            committed.setdefault(tp, -1)
        tail = PackedRecords(ahead.count, tuple(ahead.segments)) if ahead else None
        closed_through = self._intake.wave_closes.closed_through(self._owned())
        return engine.prepare(
            records,
            now=now,
            flush_all=flush_all,
            tail=tail,
            marks=InputMarks(committed, closed_through, self._wall_clock()),
        )

    async def protected(self, then: FlushReason | None = None) -> None:
        """Finish the window in the engine, if any: keep what it holds, then hand its outputs
        to the producer. Their acknowledgement and the commit that follows run in the
        background (:meth:`Delivery.deliver`) while the next window is being protected; at most
        one window is in flight. ``then``: protect what is buffered next (its reason), handing
        it to the engine before this window's outputs are produced, so the engine does not wait
        for the producer."""
        p, self.protecting = self.protecting, None
        if p is None:
            if then is not None:
                self.protect(then)
            return
        flush, dead, forward, t0 = p.flush, p.dead, p.forward, p.t0
        result = None
        if p.future is not None:
            try:
                result = await p.future
            except BaseException:
                self.engine_failed = True
                raise
            self._stats.engine_since = None
        commits = self._buffer.complete(
            flush,
            result.held if result is not None else (),
            wall_offset=self._wall_clock() - self._clock(),
        )
        if then is not None:
            self.protect(then)
        if p.future is not None:
            self._gc.after_window(time.monotonic())
        await self._delivery.settled()  # outputs and commits stay in window order
        report = result.report if result is not None else None
        await self._delivery.deliver(
            result.published if result is not None else (),
            report.window_id if report is not None else "",
            dead,
            forward,
            commits,
            lambda: self._account(report, flush, time.perf_counter() - t0),
        )

    def _account(self, report: WindowReport | None, flush: Flush, elapsed: float) -> None:
        st = self._stats
        # held: waiting in the buffer, or handed back to the engine in front of the window it
        # protects now; that window's new records are not accounted for until it returns
        inside = self.protecting.flush if self.protecting is not None else None
        in_engine = len(inside.records) - inside.new if inside is not None else 0
        st.held = len(self._buffer.held) + in_engine
        st.flush_seconds += elapsed
        if report is None:
            return
        st.windows += 1
        st.published += report.published
        st.imputed += report.imputed
        st.withheld += report.withheld
        st.suppressed += report.suppressed
        st.groups += report.groups
        st.sticky_hits += report.sticky_hits
        if report.min_group_size is not None:
            st.min_group_size = (
                report.min_group_size
                if st.min_group_size is None
                else min(st.min_group_size, report.min_group_size)
            )
        st.measures.update(report.measures)
        st.last_report = report
        log.debug(
            "window %s (%s): %d in, %d out, %d held, %d suppressed, %.3f s",
            report.window_id,
            flush.reason.value,
            report.records_in,
            report.published,
            report.held,
            report.suppressed,
            elapsed,
        )
        for observer in self.observers:
            observer(report, flush, elapsed)
