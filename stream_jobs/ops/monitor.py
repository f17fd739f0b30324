"""A worker watched from outside its event loop: liveness, readiness, consumer lag, progress.

A worker whose engine is stopped (a wedged or SIGSTOPped child process) or whose loop is
stuck still answers /metrics, so figures the loop updates stay flat instead of alarming.
:class:`Monitor` runs in a thread of its own, with its own Kafka client and event loop, and
judges the worker from what the loop leaves behind (``WorkerStats.loop_tick`` and
``engine_since``) and from the broker:

* **liveness** (``/healthz``): the loop turned, and the window in the engine (if any) went in,
  less than ``stall_timeout_seconds`` ago. A stall is logged once as a WARNING, its end as INFO.
  A worker waiting for an unreachable broker is live: a restart would not bring it back.
* **readiness** (``/readyz``): the clients are up, partitions are assigned, their state is
  restored, the broker answers the monitor's metadata probes (:mod:`stream_jobs.ops.broker_watch`,
  whether or not records flow) and acknowledges outputs and commits — and the worker is live.
* **lag**: per assigned partition, the broker's end offset minus the group's committed offset,
  measured every ``lag_interval_seconds``. The development broker's end-offset query misses the
  newest batch (DESIGN §8), so the end is the larger of it and the worker's last fetched high
  watermark: both are lower bounds of the true end. When a measurement fails the lag is
  unknown (NaN), not the last figure and not 0. The lag is split in two: records **behind**
  (after the last record a window decided: not consumed yet, or in the open window or the
  engine) and records **held** on purpose (from the committed offset up to there: offsets kept
  uncommitted because records wait in a window or a wave for k or for the wave to close).
* one INFO **progress** line every ``progress_interval_seconds``, and a warning, once, when the
  input topic still holds no record ``input_idle_warning_seconds`` after start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from stream_jobs.kafka import make_consumer
from stream_jobs.ops import client_log
from stream_jobs.ops.broker_watch import BrokerTiming, BrokerWatch
from stream_jobs.settings import WorkerSettings
from stream_jobs.worker import GatewayWorker

log = logging.getLogger(__name__)

_TICK_S = 0.25  # how often the monitor looks at the worker
_MEASURE_TIMEOUT_S = 10.0  # one lag measurement at most (the broker may be away)


@dataclass(frozen=True, slots=True)
class Verdict:
    """A health answer: ok, and why not (a short phrase without data)."""

    ok: bool
    reason: str


class Monitor:
    """Liveness, readiness and lag of ``worker``, from a thread of its own."""

    def __init__(
        self,
        worker: GatewayWorker,
        settings: WorkerSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker = worker
        self.settings = settings
        self._clock = clock
        self._created = clock()
        self._lock = threading.Lock()
        self._lag: dict[tuple[str, int], int] = {}
        self._behind: dict[tuple[str, int], int] = {}  # of the lag, records not yet decided
        # None: not measured yet; False after a failed measurement (the figures are stale)
        self._lag_known: bool | None = None
        self.lag_measured_at: float | None = None  # wall-clock time of the last measurement
        self.broker = BrokerWatch(
            BrokerTiming.for_stall_timeout(
                settings.stall_timeout_seconds, settings.lag_interval_seconds
            ),
            clock=clock,
        )
        self._broker_lost_at: float | None = None  # when the unreachable verdict was logged
        self._client_log = client_log.installed()
        self._stalled_since: float | None = None
        self._input_seen = False
        self._idle_warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="privgw-monitor", daemon=True)
        self._consumer: Any = None
        self._last_progress: tuple[float, int] | None = None  # (time, consumed) of the last line

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> Monitor:
        self.worker.broker_reachable = self.broker.reachable  # its shutdown asks
        self._thread.start()
        self.worker.closers.append(self.stop)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(10)

    # -- liveness and readiness (any thread) -------------------------------------------
    def _ages(self) -> tuple[float, float]:
        """(seconds since the loop last turned, seconds the current window has been in the
        engine); 0 for what does not apply. Before the loop's first turn (group join, restore)
        the worker is starting, which /readyz reports, not stalled."""
        st = self.worker.stats
        now = self._clock()
        since = st.engine_since
        idle = now - st.loop_tick if st.loop_tick else 0.0
        beat = st.heartbeat_since  # an idle engine's unanswered heartbeat (engine_heartbeat)
        waits = [now - t for t in (since, beat) if t is not None]
        return max(0.0, idle), max([0.0, *waits])

    def seconds_since_progress(self) -> float:
        """How long the worker has made no progress: since the loop last turned, or since the
        window now in the engine went in, whichever is longer."""
        return max(self._ages())

    def liveness(self) -> Verdict:
        idle, in_engine = self._ages()
        limit = self.settings.stall_timeout_seconds
        if self.worker.stats.engine_gone is not None:
            return Verdict(False, f"the engine process is gone ({self.worker.stats.engine_gone})")
        if in_engine > limit:
            what = (
                "a window has been in the engine"
                if self.worker.stats.engine_since
                else "the idle engine has not answered its heartbeat"
            )
            return Verdict(False, f"{what} for {in_engine:.0f} s")
        if idle > limit:
            if not self.broker.reachable():  # waiting out the broker is deliberate
                return Verdict(True, "waiting for the broker")
            return Verdict(False, f"the processing loop has not turned for {idle:.0f} s")
        return Verdict(True, "progressing")

    def readiness(self) -> Verdict:
        w = self.worker
        live = self.liveness()
        if not live.ok:
            return Verdict(False, f"stalled: {live.reason}")
        if not w.started:
            return Verdict(False, "starting: clients not connected or topics not checked")
        if not self.broker.reachable():
            return Verdict(
                False, f"the broker has not answered for {self.broker.silent_for():.0f} s"
            )
        if not w.assignment():
            return Verdict(False, "no partitions assigned")
        if w.stats.restore_remaining:
            return Verdict(
                False, f"restoring state: {w.stats.restore_remaining} changelog records to go"
            )
        if not w.stats.broker_ok:
            return Verdict(False, "the broker does not acknowledge outputs or commits")
        return Verdict(True, "ready")

    def stalled(self) -> bool:
        return not self.liveness().ok

    def lag(self) -> dict[tuple[str, int], float] | None:
        """Records behind per assigned (topic, partition) at the last measurement (None: not
        measured yet); NaN for every assigned partition while it cannot be measured."""
        split = self.lag_split()
        return None if split is None else {tp: b + h for tp, (b, h) in split.items()}

    def lag_split(self) -> dict[tuple[str, int], tuple[float, float]] | None:
        """:meth:`lag` as (records behind, records held on purpose) per partition."""
        with self._lock:
            if self._lag_known is None:
                return None
            if not self._lag_known:
                owned = self.worker.assignment() or list(self._lag)
                return dict.fromkeys(owned, (math.nan, math.nan))
            return {
                tp: (float(self._behind[tp]), float(v - self._behind[tp]))
                for tp, v in self._lag.items()
            }

    # -- the thread --------------------------------------------------------------------
    def _main(self) -> None:
        asyncio.run(self._watch())

    async def _watch(self) -> None:
        # two tasks: a lag measurement waiting on an absent broker must not delay the stall
        # check or the progress line
        ticker = asyncio.create_task(self._tick())
        next_lag = self._clock()
        try:
            while not self._stop.is_set():
                next_probe = self._clock() + self.broker.timing.interval
                measure = self._clock() >= next_lag
                if measure:
                    next_lag = self._clock() + self.settings.lag_interval_seconds
                try:
                    await self._ask_broker(measure=measure)
                except Exception as err:  # the broker away: try again next interval
                    log.debug("broker probe failed: %s", err.__class__.__name__)
                    with self._lock:
                        self._lag_known = False
                    await self._close_consumer()
                self._check_broker()  # the verdict's change logged when it happens
                while not self._stop.is_set() and self._clock() < next_probe:
                    await asyncio.sleep(_TICK_S)
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            await self._close_consumer()

    async def _tick(self) -> None:
        interval = self.settings.progress_interval_seconds
        next_progress = self._clock() + interval
        while True:
            self._check_stall()
            self._check_broker()
            if self._client_log is not None:
                self._client_log.flush_summary()
            if interval and self._clock() >= next_progress:
                next_progress = self._clock() + interval
                self._log_progress()
            await asyncio.sleep(_TICK_S)

    async def _close_consumer(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await consumer.stop()

    def _check_stall(self) -> None:
        live = self.liveness()
        now = self._clock()
        if not live.ok and self._stalled_since is None:
            self._stalled_since = now - self.seconds_since_progress()  # when progress stopped
            log.warning(
                "worker stalled: %s (PRIVGW_STALL_TIMEOUT_SECONDS %g); /healthz answers 503 "
                "until it moves again",
                live.reason,
                self.settings.stall_timeout_seconds,
            )
        elif live.ok and self._stalled_since is not None:
            log.info(
                "worker progressing again after %.0f s without progress", now - self._stalled_since
            )
            self._stalled_since = None

    def _check_broker(self) -> None:
        """One WARNING when the broker stops answering, one INFO when it answers again."""
        reachable = self.broker.reachable()
        if not reachable and self._broker_lost_at is None:
            self._broker_lost_at = self._clock()
            log.warning(
                "broker unreachable: no answer from %s for %.0f s; /readyz answers 503 and the "
                "lag is unknown until it answers again (Kafka client errors meanwhile: one "
                "line per PRIVGW_CLIENT_LOG_INTERVAL_SECONDS)",
                self.settings.bootstrap,
                self.broker.silent_for(),
            )
        elif reachable and self._broker_lost_at is not None:
            log.info(
                "broker answering again after %.0f s unreachable",
                self._clock() - self._broker_lost_at,
            )
            self._broker_lost_at = None

    async def _ask_broker(self, *, measure: bool) -> None:
        """A metadata probe (whether the broker answers), and the lag when ``measure``."""
        s = self.settings
        if self._consumer is None:
            # not subscribed: it only asks for offsets, it never joins the group
            consumer = make_consumer(s, group_id=s.group_id)
            try:
                await asyncio.wait_for(consumer.start(), self.broker.timing.timeout)
            except BaseException:
                with contextlib.suppress(Exception):
                    await consumer.stop()
                raise
            self._consumer = consumer
        await self.broker.probe(self._consumer)
        if measure:
            await asyncio.wait_for(self._measure(), _MEASURE_TIMEOUT_S)

    async def _measure(self) -> None:
        w, s = self.worker, self.settings
        consumer = self._consumer
        owned = w.assignment()
        tps = [TopicPartition(t, p) for t, p in owned]
        if not self._input_seen:
            await self._check_input(consumer)
        lag: dict[tuple[str, int], int] = {}
        behind: dict[tuple[str, int], int] = {}
        decided = w.decided()
        if tps:
            ends = await consumer.end_offsets(tps)
            starts = await consumer.beginning_offsets(tps)
            for tp in tps:
                end = max(int(ends.get(tp) or 0), w.highwater(tp.topic, tp.partition) or 0)
                committed = await consumer.committed(tp)
                if committed is None:  # nothing committed yet: where the worker starts
                    committed = (
                        int(starts.get(tp) or 0) if s.auto_offset_reset == "earliest" else end
                    )
                key = (tp.topic, tp.partition)
                lag[key] = max(0, end - committed)
                behind[key] = min(lag[key], max(0, end - decided.get(key, committed)))
        with self._lock:
            self._lag, self._behind = lag, behind
            self._lag_known = True
            self.lag_measured_at = time.time()

    async def _check_input(self, consumer: Any) -> None:
        """Warn once when the input topic holds no record long after start (no producer, or
        a producer writing elsewhere)."""
        w = self.worker
        if w.stats.consumed:
            self._input_seen = True
            return
        topic = w.topics.input
        await consumer.topics()  # refresh the metadata
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        ends = await consumer.end_offsets(tps) if tps else {}
        if any(ends.values()):
            self._input_seen = True
            return
        waited = self._clock() - self._created
        if not self._idle_warned and waited >= self.settings.input_idle_warning_seconds:
            self._idle_warned = True
            log.warning(
                "input topic %s has no records %.0f s after start: is a producer writing to "
                "it? (policy key input.topic, or PRIVGW_INPUT_TOPIC)",
                topic,
                waited,
            )

    def _log_progress(self) -> None:
        st = self.worker.stats
        now = self._clock()
        lag = self.lag()
        prev = self._last_progress
        rate = (
            (st.consumed - prev[1]) / (now - prev[0]) if prev is not None and now > prev[0] else 0.0
        )
        self._last_progress = (now, st.consumed)
        log.info(
            "progress: %d records consumed (%.0f/s), %d published, %d windows, %d dead-lettered, "
            "%d held, lag %s",
            st.consumed,
            rate,
            st.published,
            st.windows,
            st.dlq_total,
            st.held,
            _lag_text(lag),
        )


def _lag_text(lag: dict[tuple[str, int], float] | None) -> str:
    total = math.nan if lag is None else sum(lag.values())
    return "unknown" if math.isnan(total) else f"{total:.0f}"


def start_monitor(worker: GatewayWorker, settings: WorkerSettings) -> Monitor:
    """A running :class:`Monitor` of ``worker``, stopped with the worker's clients."""
    return Monitor(worker, settings).start()
