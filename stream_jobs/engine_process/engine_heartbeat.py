"""The engine's heartbeat: an engine in a child process that stops while no records flow.

Stall detection watches windows (how long one has been in the engine); with no input there is
no window, so a killed or frozen engine process went unnoticed until the next record. A thread
asks the engine for a heartbeat every few seconds while it holds no window: the time a
heartbeat has been waiting for its answer (``WorkerStats.heartbeat_since``) counts as time
without progress for the monitor's liveness, and an engine process that is gone sets
``WorkerStats.engine_gone`` (liveness fails at once, with the reason).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)


class EngineHeartbeat:
    def __init__(self, worker: Any, interval: float) -> None:
        self._worker = worker
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="privgw-heartbeat", daemon=True)

    def start(self) -> EngineHeartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        engine, stats = self._worker.engine, self._worker.stats
        while not self._stop.wait(self._interval):
            stats.heartbeat_since = time.monotonic()
            try:
                engine.ping()
            except Exception as err:  # the child is gone: nothing will be protected again
                stats.engine_gone = err.__class__.__name__
                log.error(
                    "the engine process does not answer its heartbeat (%s): /healthz answers "
                    "503; restart the worker",
                    err.__class__.__name__,
                )
                return
            finally:
                if stats.engine_gone is None:
                    stats.heartbeat_since = None


def start_heartbeat(worker: Any, stall_timeout: float) -> EngineHeartbeat | None:
    """A heartbeat for an engine in other processes (one with ``ping``); None otherwise (an
    engine in the worker's thread stops only with a window in it, which stall detection
    sees)."""
    if not callable(getattr(worker.engine, "ping", None)):
        return None
    beat = EngineHeartbeat(worker, max(0.2, min(5.0, stall_timeout / 4))).start()
    worker.closers.insert(0, beat.stop)  # before the engine is closed
    return beat
