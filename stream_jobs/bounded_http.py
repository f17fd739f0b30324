"""The metrics endpoint's HTTP server, bounded: an idle timeout and a connection cap.

``http.server.ThreadingHTTPServer`` starts a thread per connection and waits on each for ever:
600 idle connections made 606 threads. Here an idle connection is closed after
``IDLE_TIMEOUT_S`` (a scrape sends its request at once), and past ``MAX_CONNECTIONS`` open
connections a new one is closed at once, before any thread is started for it (Prometheus
scrapes with one connection per target, a probe with one more).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32
_WARN_EVERY_S = 60.0


class BoundedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # (5 by default) connections past the cap are closed, not queued

    def __init__(self, *args: Any, max_connections: int = MAX_CONNECTIONS, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(max_connections)
        self.refused = 0  # connections closed at once: the cap was reached
        self._warned = 0.0

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            now = time.monotonic()
            if now - self._warned > _WARN_EVERY_S:
                self._warned = now
                log.warning(
                    "metrics endpoint: %d connections open, the cap; new ones are closed "
                    "(%d so far)",
                    MAX_CONNECTIONS,
                    self.refused,
                )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        conn.settimeout(IDLE_TIMEOUT_S)  # an idle connection does not hold a thread for ever
        return conn, addr
