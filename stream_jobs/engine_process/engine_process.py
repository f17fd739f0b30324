"""The engine in a process of its own, so protection and the Kafka clients use two cores.

The worker is CPU-bound on one Python thread: the engine (about two thirds of its CPU) and the
event loop (fetching, decoding, validating, producing, settling) take turns holding the GIL.
``EngineProcess`` is a front with the engine's interface — ``version``, ``metadata()``,
``protect_window()`` — whose engine and state store live in a child process. The worker calls
it from its engine thread exactly as it calls an in-process ``Engine``; while the child
protects a window, that thread waits on a socket without the GIL and the event loop keeps
fetching and validating the next one. Everything else — windows, holds, dead letters, commits
after acknowledgement — stays in the worker, unchanged.

The socket pair carries one request at a time (a lock serializes the engine thread and scrape-time
``count()``): a pickled ``(op, …)`` tuple, answered with ``("ok", …)`` or
``("error", class name, message)``. A window travels as columns
(``stream_jobs.engine_process.engine_wire``), ~2 µs a record on both sides against ~8 µs for pickled
``ValidRecord`` tuples.

The child (``stream_jobs.engine_process.engine_child``) owns the SQLite state store, whose exclusive
lock keeps any second opener out, and dies with the worker. The deployment secret goes to the child
inside the pickled start-up message over the private socket, never on its command line or in its
environment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from gateway.engine.engine import Engine
from gateway.engine.keyed_inputs import KeyedInputs
from gateway.engine.records import NO_MARKS, InputMarks, ValidRecord, WindowResult
from gateway.engine.shards import merge, route
from gateway.errors import PrivgwError
from gateway.keyed.draw_derivation import META_NAME, DrawDerivation, ShardDraws, settle
from gateway.keyed.keyed import SECRET_ENV, SECRET_FILE_ENV, Keyring
from gateway.policy import Policy
from stream_jobs.engine_process.engine_wire import (
    PackedRecords,
    decode_result,
    encode_window,
    held_prefix,
    window_request,
)
from stream_jobs.engine_process.framing import receive

__all__ = [
    "EngineProcess",
    "EngineProcessError",
    "EngineShards",
    "EngineSpec",
    "PackedRecords",
]

_CHILD = "stream_jobs.engine_process.engine_child"  # the child's module (python -m)


class EngineProcessError(PrivgwError):
    """The engine's child process failed or exited. Carries the class of the child's
    exception, and its message when it is one of privgw's own, never its traceback."""


@dataclass(frozen=True)
class EngineSpec:
    """What the child needs to build the engine: policy, secret, SQLite state file."""

    policy: Policy
    state_path: Path
    secret: bytes = field(repr=False)
    measure_risk: bool = True  # False for a shard: the merged window is measured
    # True: the child encodes the published values (shards, whose children encode in
    # parallel); False: it leaves them as columns, encoded by the worker as it produces them
    encode_outputs: bool = False

    def build(self) -> tuple[Engine, Any]:
        from state.sqlite_store import SQLiteStore  # noqa: PLC0415

        store = SQLiteStore(self.state_path)
        engine = Engine(
            self.policy, keyring=Keyring(self.secret), store=store, measure_risk=self.measure_risk
        )
        return engine, store


# -- the worker's side -----------------------------------------------------------------------
def _child_environment() -> dict[str, str]:
    """The worker's environment without the secret (the child gets it in its start-up
    message), importing this very copy of privgw first."""
    env = {k: v for k, v in os.environ.items() if k not in (SECRET_ENV, SECRET_FILE_ENV)}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


class EngineProcess:
    """An ``Engine`` in a child process of its own; same calls, same results.

    Start it from the thread that lives as long as the worker (the main thread): the child is
    killed when the thread that started it exits.
    """

    def __init__(self, spec: EngineSpec) -> None:
        self._spec = spec
        # A child of its own (python -m), not multiprocessing's spawn: that re-imports the
        # caller's __main__, which breaks any script without a __main__ guard. -P: the
        # working directory is not put first on the child's path, so a directory holding
        # another copy of privgw cannot give the child code that speaks another protocol.
        parent_end, child_end = socket.socketpair()
        self._conn = Connection(parent_end.detach())
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-P", "-m", _CHILD, str(child_end.fileno()), str(os.getpid())],
                pass_fds=(child_end.fileno(),),
                stdin=subprocess.DEVNULL,
                env=_child_environment(),
            )
        finally:
            child_end.close()
        self._lock, self._window = threading.Lock(), False  # (a window in the child)
        self._closed = False
        self._count = 0
        self._prefixed: dict[bytes, int] = {}
        self._members = 0
        # the records the child handed back held last (the worker's objects): a window that
        # starts with them sends only how many (engine_wire.HeldInChild)
        self._held: Sequence[ValidRecord] = []
        try:
            with self._lock:
                self._send(("start", spec))
                _, self.version, self._metadata = self._reply("start")
        except BaseException:
            self._closed = True
            self._conn.close()
            self._reap(5.0)
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    def metadata(self) -> dict[str, object]:
        return dict(self._metadata)

    def protect_window(
        self,
        records: Sequence[ValidRecord],
        *,
        now: float,
        flush_all: bool = False,
        marks: InputMarks = NO_MARKS,
    ) -> WindowResult:
        return self.prepare(records, now=now, flush_all=flush_all, marks=marks)()

    @functools.cached_property
    def _inputs(self) -> KeyedInputs:
        """The keyed digests of the records this process packs (the secret is the worker's
        already); its digest cache, in memory only, takes the place of the child's, which
        fills only for windows that arrive without digests. Built on first use: a shard's
        windows are packed without digests (:class:`EngineShards`)."""
        return KeyedInputs(self._spec.policy, Keyring(self._spec.secret))

    def prepare(
        self,
        records: Sequence[ValidRecord],
        *,
        now: float,
        flush_all: bool = False,
        tail: PackedRecords | None = None,
        marks: InputMarks = NO_MARKS,
    ) -> Callable[[], WindowResult]:
        """``protect_window`` in two steps: the window packed here, on the calling thread (the
        worker's event loop, where the packing does not contend for the GIL with it), and the
        call it returns, which hands it over and waits (the worker's engine thread).
        ``tail``: the window's last records, already packed by :meth:`pack`."""
        request = self.request(records, now, flush_all, tail, self._inputs, marks=marks)
        return functools.partial(self._protect_request, records, request)

    def request(
        self,
        records: Sequence[ValidRecord],
        now: float,
        flush_all: bool,
        tail: PackedRecords | None = None,
        inputs: KeyedInputs | None = None,
        *,
        marks: InputMarks = NO_MARKS,
    ) -> tuple[Any, ...]:
        """The window packed for the child (``window_request``): the records it handed back
        held last time, if they start the window as they came back, stay in the child."""
        kept = held_prefix(records, self._held)
        return window_request(records, now, flush_all, tail, inputs, kept=kept, marks=marks)

    def pack(self, records: Sequence[ValidRecord]) -> bytes:
        """Records packed ahead of their window, for :meth:`prepare`'s ``tail``, with their
        keyed digests (:class:`WindowKeys`): computed here while the child protects the window
        before, not by the child once it has the window."""
        return encode_window(records, self._inputs)

    def _protect_request(
        self, records: Sequence[ValidRecord], request: tuple[Any, ...]
    ) -> WindowResult:
        self.submit(request)
        return self.collect(records)

    def submit(self, request: tuple[Any, ...]) -> None:
        """Hand a packed window (``window_request``) to the child and return; ``collect`` waits for
        its result. The engine is this process's until then (``count`` answers from its last
        figure)."""
        self._lock.acquire()
        try:
            self._send(request)
        except BaseException:
            self._lock.release()
            raise
        self._window = True

    def collect(self, records: Sequence[ValidRecord]) -> WindowResult:
        """The result of the window ``submit`` handed over (the same ``records``)."""
        self._held = []  # the child's held records are unknown until its reply is read
        try:
            _, columns, extra, self._count = self._reply("protect_window")
        finally:
            self._window = False
            self._lock.release()
        result = decode_result(records, columns, extra)
        self._held = result.held
        return result

    def count_prefix(self, prefix: bytes) -> int:
        """Keys of the child's store that start with ``prefix``; 0 while a window is in the
        child (a scrape does not wait for the engine)."""
        count = self._scraped(("count_prefix", prefix))
        if count is not None:
            self._prefixed[prefix] = count
        return self._prefixed.get(prefix, 0)

    def panel_members(self) -> int:
        """Members of the child's panel rosters (for the metrics exporter); while a window is
        in the child, the count read before it."""
        members = self._scraped(("panel_members",))
        if members is not None:
            self._members = members
        return self._members

    def panel_last_wave(self) -> int | None:
        """The newest wave the child's panel roster decided (None: none)."""
        with self._lock:
            self._send(("panel_last_wave",))
            wave: int | None = self._reply("panel_last_wave")[1]
            return wave

    def count(self) -> int:
        """Entries in the child's state store (for the metrics exporter). While a window is in
        the child, the count after the last one: a scrape does not wait for the engine."""
        count = self._scraped(("count",))
        if count is not None:
            self._count = count
        return self._count

    def _scraped(self, request: tuple[Any, ...]) -> int | None:
        """The child's answer to a scrape's ``request``; None while a window is in the child
        (a scrape does not wait for the engine)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._send(request)
            return int(self._reply(request[0])[1])
        finally:
            self._lock.release()

    def ping(self) -> bool:
        """The heartbeat: the child answers while no window is in it (True); False when one is
        (its own progress is watched). Raises ``EngineProcessError`` when the child is gone;
        blocks while it does not answer (the caller measures how long), also behind a scrape
        waiting for it (a frozen idle engine's scrape turned the heartbeat off for good)."""
        while not self._lock.acquire(timeout=0.05):
            if self._window:
                return False
        try:
            self._send(("ping",))
            self._reply("ping")
            return True
        finally:
            self._lock.release()

    def key_fingerprints(self) -> list[str | None]:
        """The key fingerprint the child's store holds (``gateway.state_store.state_api``)."""
        with self._lock:
            self._send(("key_fingerprints",))
            return list(self._reply("key_fingerprints")[1])

    def set_key_fingerprint(self, fingerprint: str) -> None:
        with self._lock:
            self._send(("set_key_fingerprint", fingerprint))
            self._reply("set_key_fingerprint")

    @property
    def draws(self) -> DrawDerivation | None:
        """The child engine's draw derivation (``gateway.keyed.draw_derivation``)."""
        found = self._metadata.get(META_NAME)
        return None if found is None else DrawDerivation(str(found))

    def draws_bound(self) -> DrawDerivation | None:
        with self._lock:
            self._send(("draws_bound",))
            bound: DrawDerivation | None = self._reply("draws_bound")[1]
            return bound

    def use_draws(self, derivation: DrawDerivation) -> None:
        with self._lock:
            self._send(("use_draws", derivation))
            self._reply("use_draws")
            self._metadata[META_NAME] = derivation.value

    def rotate_key_fingerprint(self, fingerprint: str) -> int:
        """The child's store dropped and given ``fingerprint`` (a secret rotation)."""
        with self._lock:
            self._send(("rotate_key_fingerprint", fingerprint))
            dropped = int(self._reply("rotate_key_fingerprint")[1])
            self._count = 0
            return dropped

    def close(self, timeout: float = 30.0) -> None:
        """Close the store in the child and wait for it to exit."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(EngineProcessError):
                self._send(("close",))
                self._reply("close")
            self._conn.close()
        self._reap(timeout)

    def _reap(self, timeout: float) -> None:
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _send(self, request: tuple[Any, ...]) -> None:
        if self._closed and request[0] != "close":
            raise EngineProcessError("the engine process is closed")
        try:
            self._conn.send_bytes(pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            raise self._exited() from None

    def _reply(self, what: str) -> tuple[Any, ...]:
        try:
            reply: tuple[Any, ...] = pickle.loads(receive(self._conn))
        except (EOFError, OSError):
            raise self._exited() from None
        if reply[0] == "error":
            raise EngineProcessError(f"{what} failed in the engine process: {reply[1]}: {reply[2]}")
        return reply

    def _exited(self) -> EngineProcessError:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(1.0)
        return EngineProcessError(
            f"the engine process exited (exit code {self._proc.returncode}); the worker stops "
            "and its uncommitted records are read again after a restart"
        )


class EngineShards(ShardDraws):
    """Engines over shards of respondents (:mod:`gateway.engine.shards`), one child process and
    SQLite file each, protecting their parts of a window at the same time; same interface as
    ``EngineProcess``. The window's risk is measured here, over all shards' records."""

    def _draw_shards(self) -> Sequence[EngineProcess]:
        return self.shards

    def __init__(self, specs: Sequence[EngineSpec]) -> None:
        self.shards: list[EngineProcess] = []
        try:
            for spec in specs:
                shard = dataclasses.replace(spec, measure_risk=False, encode_outputs=True)
                self.shards.append(EngineProcess(shard))
            settle(self.shards, None, where="the engine shards")  # one derivation for all
        except BaseException:
            self.close()
            raise
        self.version = self.shards[0].version
        self._interval_pct = specs[0].policy.risk.interval_pct

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.shards]

    def ping(self) -> bool:
        """Every shard's heartbeat (:meth:`EngineProcess.ping`); False if one is busy."""
        return all([s.ping() for s in self.shards])

    def metadata(self) -> dict[str, object]:
        return self.shards[0].metadata()

    def protect_window(
        self,
        records: Sequence[ValidRecord],
        *,
        now: float,
        flush_all: bool = False,
        marks: InputMarks = NO_MARKS,
    ) -> WindowResult:
        return self.prepare(records, now=now, flush_all=flush_all, marks=marks)()

    def pack(self, records: Sequence[ValidRecord]) -> None:
        """Nothing is packed ahead: a window is routed to the shards when it is handed over."""
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
        """As :meth:`EngineProcess.prepare`: the shards' windows packed here, handed over and
        waited for by the call returned (``tail`` is always None: see :meth:`pack`)."""
        parts = route(records, len(self.shards))
        windows = [[records[i] for i in idx] for idx in parts]
        # every shard gets every window, an empty one too: their risk sampling stays in step
        requests = [
            shard.request(window, now, flush_all, marks=marks)
            for shard, window in zip(self.shards, windows, strict=True)
        ]
        return functools.partial(self._protect_requests, records, parts, windows, requests)

    def _protect_requests(
        self,
        records: Sequence[ValidRecord],
        parts: list[list[int]],
        windows: list[list[ValidRecord]],
        requests: list[tuple[Any, ...]],
    ) -> WindowResult:
        error: BaseException | None = None
        submitted: list[EngineProcess] = []
        for shard, request in zip(self.shards, requests, strict=True):
            try:
                shard.submit(request)
            except BaseException as err:
                error = err
                break
            submitted.append(shard)
        # each window handed over is collected (its reply read, its lock released) whatever
        # failed; the first failure is what the worker sees
        results: list[WindowResult] = []
        for shard, window in zip(submitted, windows, strict=False):
            try:
                results.append(shard.collect(window))
            except BaseException as err:
                error = error or err
        if error is not None:
            raise error
        return merge(records, parts, results, interval_pct=self._interval_pct)

    def count_prefix(self, prefix: bytes) -> int:
        return sum(s.count_prefix(prefix) for s in self.shards)

    def count(self) -> int:
        return sum(s.count() for s in self.shards)

    def panel_members(self) -> int:
        return sum(s.panel_members() for s in self.shards)

    def panel_last_wave(self) -> int | None:  # of the shards that decided one
        waves = (s.panel_last_wave() for s in self.shards)
        return min((w for w in waves if w is not None), default=None)

    def key_fingerprints(self) -> list[str | None]:
        """One per shard's file: all are checked before any is written."""
        return [f for s in self.shards for f in s.key_fingerprints()]

    def set_key_fingerprint(self, fingerprint: str) -> None:
        for s in self.shards:
            s.set_key_fingerprint(fingerprint)

    def rotate_key_fingerprint(self, fingerprint: str) -> int:
        return sum(s.rotate_key_fingerprint(fingerprint) for s in self.shards)

    def close(self, timeout: float = 30.0) -> None:
        for shard in self.shards:
            shard.close(timeout)
