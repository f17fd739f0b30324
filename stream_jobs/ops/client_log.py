"""Kafka client errors rate-limited: at most one log line per period, with a count.

While a broker is away, aiokafka logs every failed connection, metadata refresh, fetch and
coordinator request at ERROR — thousands of lines a minute (about 5,900 in 85 s, measured on
an idle worker), which bury the worker's own lines and fill log storage. The outage itself is
reported by /readyz, ``privgw_ready`` and ``privgw_broker_reachable`` (stream_jobs.ops.monitor);
the log needs one line that says it goes on and how much.

:func:`install` moves the ``aiokafka`` logger tree behind :class:`ClientLogLimiter`: the
first WARNING-or-worse record of a quiet spell is logged as it is; the next ones within
``period`` seconds are counted, and one WARNING per period says how many there were and
quotes the latest. Lines below WARNING pass unchanged (joins and assignments are few and worth
seeing). aiokafka's messages name nodes, topics and error classes, never record contents (its
DEBUG lines, which dump requests, stay off: stream_jobs.ops.logs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

CLIENT_LOGGER = "aiokafka"
SUMMARY_LOGGER = "stream_jobs.kafka_client"


class ClientLogLimiter(logging.Handler):
    """Forwards the client's records to the root handlers, one WARNING+ line a period."""

    def __init__(
        self,
        period: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        out: logging.Logger | None = None,
    ) -> None:
        super().__init__(logging.NOTSET)
        self.period = period
        self._clock = clock
        self._out = out or logging.getLogger(SUMMARY_LOGGER)
        self._guard = threading.Lock()  # the worker's loop and the monitor's log through it
        self._window_end: float | None = None  # end of the period whose line was logged
        self._suppressed = 0
        self._latest: tuple[str, str] | None = None  # (logger, message) of the latest counted

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.WARNING:
            self._forward(record)
            return
        now = self._clock()
        with self._guard:
            if self._window_end is not None and now < self._window_end:
                self._suppressed += 1
                self._latest = (record.name, record.getMessage())
                return
            summary = self._take_summary()
            self._window_end = now + self.period
        if summary is not None:  # this period's line: the last one's count, and this error
            self._out.warning("%s; latest now: %s", summary, _quote(record))
        else:
            self._forward(record)

    def flush_summary(self) -> None:
        """Log the count of a period that has ended (the monitor calls this every tick), so
        the last errors of an outage are reported although no further error comes."""
        now = self._clock()
        with self._guard:
            if self._window_end is None or now < self._window_end:
                return
            summary = self._take_summary()
            # the summary is the line of a new period; with nothing to say, the spell is over
            self._window_end = now + self.period if summary is not None else None
        if summary is not None:
            self._out.warning("%s", summary)

    def _take_summary(self) -> str | None:
        if not self._suppressed:
            return None
        assert self._latest is not None
        count, (name, message) = self._suppressed, self._latest
        self._suppressed, self._latest = 0, None
        return (
            f"Kafka client: {count} more warnings and errors in the last {self.period:g} s "
            f"(logged once per PRIVGW_CLIENT_LOG_INTERVAL_SECONDS; latest from {name}: {message})"
        )

    @staticmethod
    def _forward(record: logging.LogRecord) -> None:
        for handler in logging.getLogger().handlers:
            if record.levelno >= handler.level:
                handler.handle(record)


def _quote(record: logging.LogRecord) -> str:
    return f"{record.name}: {record.getMessage()}"


def install(period: float) -> ClientLogLimiter:
    """Route the Kafka client's log records through one limiter (replacing an earlier one)."""
    logger = logging.getLogger(CLIENT_LOGGER)
    for old in [h for h in logger.handlers if isinstance(h, ClientLogLimiter)]:
        logger.removeHandler(old)
    limiter = ClientLogLimiter(period)
    logger.addHandler(limiter)
    logger.propagate = False
    return limiter


def installed() -> ClientLogLimiter | None:
    for handler in logging.getLogger(CLIENT_LOGGER).handlers:
        if isinstance(handler, ClientLogLimiter):
            return handler
    return None
