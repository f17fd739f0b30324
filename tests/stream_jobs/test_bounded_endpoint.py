"""The metrics endpoint's limits and the engine's heartbeat (issue 32, item 10).

The issue's reproduction: 600 idle connections to /metrics created 606 threads (no idle
timeout, no cap), and an engine stopped while no records flowed was not noticed.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.keyed import Keyring
from gateway.policy import load_policy
from stream_jobs import bounded_http
from stream_jobs.bounded_http import BoundedHTTPServer
from stream_jobs.cli import build_worker
from stream_jobs.engine_heartbeat import start_heartbeat
from stream_jobs.metrics import _Handler
from stream_jobs.monitor import Monitor
from stream_jobs.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]


def test_idle_connections_are_capped_and_timed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded_http, "IDLE_TIMEOUT_S", 1.0)
    handler = type("H", (_Handler,), {"registry": CollectorRegistry(), "monitor": None})
    server = BoundedHTTPServer(("127.0.0.1", 0), handler, max_connections=8)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
    try:
        closed = 0
        deadline = time.monotonic() + 20
        for s in idle:  # each is closed: refused at once, or let in and idle for a second
            while True:
                assert threading.active_count() - before <= 8  # never a thread per connection
                s.settimeout(0.1)
                try:
                    assert s.recv(1) == b""
                    closed += 1
                    break
                except TimeoutError:
                    assert time.monotonic() < deadline, f"{closed} of 60 closed"
        assert server.refused > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.status == 200  # a scrape gets through again
    finally:
        for s in idle:
            s.close()
        server.shutdown()
        server.server_close()


def test_an_idle_engine_that_stops_is_seen_by_its_heartbeat(
    tmp_path: Path, secret_env: str
) -> None:
    settings = WorkerSettings(
        state_dir=tmp_path / "s", engine="process", stall_timeout_seconds=1.0, metrics_port=0
    )
    policy = load_policy(ROOT / "deploy" / "policies" / "adult.yaml")
    worker = build_worker(policy, settings, Keyring(secret_env.encode()))
    try:
        monitor = Monitor(worker, settings)
        assert start_heartbeat(worker, settings.stall_timeout_seconds) is not None
        pid = worker.engine.pid
        time.sleep(0.6)
        assert monitor.liveness().ok
        os.kill(pid, signal.SIGSTOP)  # frozen, no window in it
        try:
            deadline = time.monotonic() + 5
            while monitor.liveness().ok and time.monotonic() < deadline:
                time.sleep(0.1)
            verdict = monitor.liveness()
            assert not verdict.ok and "heartbeat" in verdict.reason, verdict
        finally:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while not monitor.liveness().ok and time.monotonic() < deadline:
            time.sleep(0.1)
        assert monitor.liveness().ok  # it answers again
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while monitor.liveness().ok and time.monotonic() < deadline:
            time.sleep(0.1)
        verdict = monitor.liveness()
        assert not verdict.ok and "engine process is gone" in verdict.reason, verdict
    finally:
        for close in worker.closers:
            close()
