"""The metrics endpoint's HTTP server: idle and slow connections cost no thread, and a probe
always gets through.

``http.server.ThreadingHTTPServer`` gives each connection a thread that waits for its request:
600 idle connections made 606 threads, and a cap on them (32) let 32 idle connections lock
/healthz out for seconds, so an orchestrator restarted a healthy worker (issue 45, item 3).
Here one thread reads every connection's request head without blocking; only a complete head
goes to a small pool of handler threads. A connection gets ``HEAD_TIMEOUT_S`` in all to send
its head (a slowloris that trickles bytes is closed as surely as an idle one), and past
``MAX_CONNECTIONS`` open connections the oldest still waiting for its head is closed to make
room: the newest — a probe, a scrape, which send their request at once — is never refused.
Probes (/healthz, /readyz) have threads of their own, so a client that reads /metrics slowly
cannot delay them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

HEAD_TIMEOUT_S = 10.0  # to send a whole request head; then to write one answer
MAX_CONNECTIONS = 256  # open and still sending their head (a file descriptor each, no thread)
MAX_HEAD_BYTES = 16_384
MAX_QUEUED = 64  # complete requests waiting for a handler thread
PROBE_PATHS = (b"/healthz", b"/readyz")
_TICK_S = 0.2
_WARN_EVERY_S = 60.0


@dataclass(slots=True)
class _Pending:
    """A connection still sending its request head."""

    sock: socket.socket
    address: Any
    deadline: float
    head: bytearray = field(default_factory=bytearray)


class _Primed:
    """A request handler fed the head the server has read already (``request`` is the pair
    (socket, head)); it writes its answer to the socket."""

    request: Any
    rfile: Any

    def setup(self) -> None:
        sock, head = self.request
        self.request = sock
        super().setup()  # type: ignore[misc]
        self.rfile = io.BytesIO(bytes(head))


class BoundedHTTPServer:
    """Serves ``handler_class`` (an ``http.server`` request handler) on ``address``;
    ``serve_forever`` / ``shutdown`` / ``server_close`` as in ``socketserver``."""

    def __init__(
        self,
        address: tuple[str, int],
        handler_class: type,
        *,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.handler = type(handler_class.__name__, (_Primed, handler_class), {})
        self.max_connections = max_connections
        self.socket = socket.create_server(address, backlog=128)
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self.refused = 0  # connections closed to make room: the cap was reached
        self._pending: dict[socket.socket, _Pending] = {}  # oldest first
        self._probes = ThreadPoolExecutor(2, thread_name_prefix="privgw-probe")
        self._others = ThreadPoolExecutor(4, thread_name_prefix="privgw-http")
        self._queued = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._warned = 0.0

    def serve_forever(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.socket, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(_TICK_S):
                    if key.fileobj is self.socket:
                        self._accept(sel)
                    elif (pending := self._pending.get(key.fileobj)) is not None:  # type: ignore[call-overload]
                        self._read(sel, pending)  # (not closed earlier in this round)
                self._expire(sel)
        finally:
            for pending in list(self._pending.values()):
                self._drop(sel, pending)
            sel.close()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serving, and wait for the loop to end (as ``socketserver`` does)."""
        self._stop.set()
        self._stopped.wait(5 * _TICK_S + 1)
        self._probes.shutdown(wait=False, cancel_futures=True)
        self._others.shutdown(wait=False, cancel_futures=True)

    def server_close(self) -> None:
        self.socket.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        while True:
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of file descriptors, say: the next tick tries again
                log.warning("metrics endpoint: accept failed (%s)", err.__class__.__name__)
                return
            while len(self._pending) >= self.max_connections:
                self._drop(sel, next(iter(self._pending.values())))
                self._note_refused()
            sock.setblocking(False)
            pending = _Pending(sock, address, time.monotonic() + HEAD_TIMEOUT_S)
            self._pending[sock] = pending
            sel.register(sock, selectors.EVENT_READ)

    def _read(self, sel: selectors.BaseSelector, pending: _Pending) -> None:
        try:
            chunk = pending.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        pending.head += chunk
        if not chunk or len(pending.head) > MAX_HEAD_BYTES:
            self._drop(sel, pending)
        elif b"\r\n\r\n" in pending.head or b"\n\n" in pending.head:
            sel.unregister(pending.sock)
            del self._pending[pending.sock]
            self._dispatch(pending)

    def _dispatch(self, pending: _Pending) -> None:
        with self._lock:
            if self._queued >= MAX_QUEUED:
                _close(pending.sock)
                return
            self._queued += 1
        line = bytes(pending.head[: pending.head.find(b"\n")]).split()
        probe = len(line) > 1 and line[1].split(b"?")[0] in PROBE_PATHS
        pool = self._probes if probe else self._others
        try:
            pool.submit(self._handle, pending)
        except RuntimeError:  # shut down
            self._done(pending.sock)

    def _handle(self, pending: _Pending) -> None:
        try:
            pending.sock.setblocking(True)
            pending.sock.settimeout(HEAD_TIMEOUT_S)  # a reader that never reads is let go
            self.handler((pending.sock, pending.head), pending.address, self)
        except OSError:
            pass  # the client went away or stopped reading
        except Exception:
            log.exception("metrics endpoint: a request failed")
        finally:
            self._done(pending.sock)

    def _done(self, sock: socket.socket) -> None:
        with self._lock:
            self._queued -= 1
        _close(sock)

    def _expire(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if oldest.deadline > now:
                return
            self._drop(sel, oldest)

    def _drop(self, sel: selectors.BaseSelector, pending: _Pending) -> None:
        sel.unregister(pending.sock)
        del self._pending[pending.sock]
        _close(pending.sock)

    def _note_refused(self) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._warned > _WARN_EVERY_S:
            self._warned = now
            log.warning(
                "metrics endpoint: %d connections waiting for their request, the cap; the "
                "oldest are closed (%d so far)",
                self.max_connections,
                self.refused,
            )


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # the client went away first
        sock.shutdown(socket.SHUT_WR)
    sock.close()
