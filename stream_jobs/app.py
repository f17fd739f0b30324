"""The Faust app that hosts the gateway worker, and the function that runs it.

Faust gives the process its service tree (start/stop order, crash propagation, sensors) and,
for the partitioned state backend, tables with changelogs. The records themselves do not go
through Faust's per-event streams: measured on the development broker they move 4–5k
records/s, against ~90k/s for an aiokafka ``getmany`` loop hosted in the same app
(docs/streaming.md). So the worker is a :class:`mode.Service` of the app that owns its own
batch consumer and producer.

Never started through ``faust worker``: that command ignores ``web_enabled=False`` and binds
0.0.0.0:6066. :func:`serve` starts the app programmatically, with the web server disabled by
the boot strategy itself, and Faust's own consumer disabled unless a table needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from typing import Any

import faust
import mode
from faust.app.base import BootStrategy

from gateway.commands.cli import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from gateway.commands.sigterm import sigterm_received
from gateway.errors import PrivgwError
from stream_jobs.settings import WorkerSettings
from stream_jobs.shutdown import EXIT_BROKER_AWAY
from stream_jobs.worker import GatewayWorker

log = logging.getLogger(__name__)

_CANCEL_WAIT_S = 2.0  # for the worker's task once cancelled, and for the app's own stop


class _Boot(BootStrategy):
    enable_web = False  # no HTTP server, whatever web_enabled says

    def _should_enable_kafka_consumer(self) -> bool:
        # Faust's own consumer only serves tables (changelog recovery); without tables it
        # would join a second, empty consumer group and slow every start by a group join.
        return bool(self.app.tables)

    def _should_enable_kafka_producer(self) -> bool:
        # Same for its producer: the worker has its own. Faust's would connect with Faust's
        # broker settings, not the worker's TLS/SASL ones (found by tests/stream_jobs/test_tls.py:
        # the app failed to start against a broker that only speaks TLS).
        return bool(self.app.tables)


class GatewayApp(faust.App):  # type: ignore[misc]
    BootStrategy = _Boot


def make_app(settings: WorkerSettings) -> GatewayApp:
    datadir = settings.state_dir / "faust"
    datadir.parent.mkdir(parents=True, exist_ok=True)
    return GatewayApp(
        f"privgw-{settings.group_id}",
        broker=f"kafka://{settings.bootstrap.split(',')[0]}",
        web_enabled=False,
        autodiscover=False,
        datadir=str(datadir),
        broker_session_timeout=settings.session_timeout_ms / 1000,
        broker_heartbeat_interval=settings.heartbeat_interval_ms / 1000,
        producer_acks=-1,
        topic_allow_declare=False,
    )


class GatewayService(mode.Service):  # type: ignore[misc]
    """Runs one :class:`GatewayWorker` inside the app."""

    def __init__(self, worker: GatewayWorker, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.worker = worker
        self.error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    async def on_start(self) -> None:
        await self.worker.start()
        self._task = asyncio.create_task(self._run(), name="privgw-worker")

    async def _run(self) -> None:
        try:
            await self.worker.run()
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # surfaced by serve(); no message text (values)
            self.error = err
            # privgw's own messages name settings, paths and conditions, never values
            why = f": {err}" if isinstance(err, PrivgwError) else ""
            log.error("worker failed: %s%s", err.__class__.__name__, why)

    async def on_stop(self) -> None:
        self.worker.request_stop()
        task = self._task
        if task is not None:  # its shutdown bounds its own waits (stream_jobs.shutdown)
            await asyncio.wait({task}, timeout=self.worker.settings.shutdown_grace_seconds)
            self.abandon()

    def abandon(self) -> None:
        """Past the grace period: the worker's task is cancelled, not waited for."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def wait_done(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)


async def serve(
    worker: GatewayWorker,
    *,
    stop: asyncio.Event | None = None,
    install_signals: bool = True,
    on_started: Callable[[GatewayWorker], None] | None = None,
) -> int:
    """Run the worker in its Faust app until ``stop`` is set, SIGINT/SIGTERM, or a failure.

    Returns an exit code: 0 after a clean stop, 1 when the worker failed, 75
    (``EXIT_BROKER_AWAY``) when it stopped without the broker confirming everything (what it
    left uncommitted is read again at the next start; the log line names it), 130
    (``EXIT_INTERRUPTED``) after a clean stop on SIGINT (Ctrl-C).
    """
    stop = stop or asyncio.Event()
    app = make_app(worker.settings)
    service = GatewayService(worker)
    loop = asyncio.get_running_loop()
    installed: list[tuple[int, Any]] = []  # (signal, the Python handler it had before)
    received: set[int] = set()

    def on_signal(sig: int) -> None:
        received.add(sig)
        stop.set()

    if install_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                previous = signal.getsignal(sig)
                loop.add_signal_handler(sig, on_signal, sig)
                installed.append((sig, previous))
        if sigterm_received():  # came before, and a library swallowed the CLI's exception
            stop.set()
    try:
        await app.start()
        await app.add_runtime_dependency(service)
        if on_started is not None:
            on_started(worker)
        stopper = asyncio.create_task(stop.wait())
        done = asyncio.create_task(service.wait_done())
        await asyncio.wait([stopper, done], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        worker.request_stop()
        grace = worker.settings.shutdown_grace_seconds
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout=grace)
        except TimeoutError:  # the worker bounds its own waits; this is the last resort
            service.error = service.error or TimeoutError()
            service.abandon()
            log.error(
                "shutdown took longer than PRIVGW_SHUTDOWN_GRACE_SECONDS (%g s): stopping "
                "without waiting further; uncommitted records are read again at the next start",
                grace,
            )
    finally:
        for sig, previous in installed:
            loop.remove_signal_handler(sig)  # (which leaves the default: the signal kills)
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, previous)  # e.g. the CLI's clean exit on SIGTERM
        with contextlib.suppress(Exception):
            await asyncio.wait_for(app.stop(), _CANCEL_WAIT_S * 2)
        _close_idle_consumer_loop(app)
    if service.error is not None:
        return EXIT_FAILED
    if worker.left_uncommitted:
        return EXIT_BROKER_AWAY
    # stopped as cleanly as after SIGTERM, but a shell (or a script) is told it was interrupted
    return EXIT_INTERRUPTED if signal.SIGINT in received else EXIT_OK


def _close_idle_consumer_loop(app: GatewayApp) -> None:
    """Faust builds its consumer (a thread with its own event loop) even when the boot
    strategy never starts it; nobody closes that loop then, and its self-pipe leaks."""
    consumer = app.__dict__.get("_consumer")  # only if the app created it
    thread = getattr(consumer, "_thread", None)
    loop = getattr(thread, "thread_loop", None)
    if isinstance(loop, asyncio.AbstractEventLoop) and not loop.is_running():
        with contextlib.suppress(Exception):
            loop.close()
