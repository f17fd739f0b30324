"""Whether the broker answers, judged apart from traffic.

The worker learns that the broker is away only when a produce or a commit fails — after the
producer's request timeout (30 s), and never while the input is idle: survey traffic comes in
waves with idle hours between them, and a lost broker stayed invisible to /readyz for as long
as nothing was published. The monitor therefore asks the broker for its metadata every
``interval`` seconds from its own client (:meth:`BrokerWatch.probe`), and the worker counts as
cut off from the broker once no such request has been answered for ``timeout`` seconds.

With the defaults (stall timeout 30 s) a probe goes out every 5 s and the broker counts as
unreachable after 15 s without an answer: /readyz turns 503 within the stall timeout of
losing every broker, idle or not.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_MIN_INTERVAL_S = 0.25


@dataclass(frozen=True, slots=True)
class BrokerTiming:
    """How often to probe, and how long without an answer means unreachable."""

    interval: float
    timeout: float

    @classmethod
    def for_stall_timeout(cls, stall_timeout: float, lag_interval: float) -> BrokerTiming:
        """Unreachable after half the stall timeout without an answer; probes every sixth of
        it (at most every lag interval), so that the verdict comes within the stall timeout
        even when the last answer came just before the broker went."""
        interval = max(_MIN_INTERVAL_S, min(lag_interval, stall_timeout / 6))
        return cls(interval=interval, timeout=stall_timeout / 2)


class BrokerWatch:
    """The last answer from the broker and the verdict drawn from it (any thread reads it)."""

    def __init__(
        self, timing: BrokerTiming, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timing = timing
        self._clock = clock
        self._lock = threading.Lock()
        self._last_answer = clock()  # starting counts as an answer: the start-up probe passed

    async def probe(self, consumer: Any) -> None:
        """One metadata round trip through ``consumer`` (raises when the broker does not
        answer within ``timeout``: a silent broker is as absent as a closed port)."""
        await asyncio.wait_for(consumer.topics(), self.timing.timeout)
        self.answered()

    def answered(self) -> None:
        with self._lock:
            self._last_answer = self._clock()

    def silent_for(self) -> float:
        """Seconds since the broker last answered."""
        with self._lock:
            return max(0.0, self._clock() - self._last_answer)

    def reachable(self) -> bool:
        """False once nothing was answered for ``timeout`` seconds."""
        return self.silent_for() <= self.timing.timeout
