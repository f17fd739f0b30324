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
``("error", class name, message)``. A window travels as columns in ``marshal`` form (exact for
the str/int/float/None/bool values validation produces; pickle if anything else appears),
which costs ~2 µs a record on both sides against ~8 µs for pickled ``ValidRecord`` tuples; the
result comes back as columns that point into the request, so held records are the worker's
own objects again.

The child owns the SQLite state store, whose exclusive lock keeps any second opener out. It
dies with the worker (``PR_SET_PDEATHSIG``), so a worker killed with SIGKILL leaves no engine
behind to write state after its replacement has started; it ignores SIGINT and SIGTERM, so a
Ctrl-C or a group-wide TERM reaches the worker, which closes it in order. The deployment
secret goes to the child inside the pickled start-up message over the private socket, never on
its command line or in its environment.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import marshal
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, overload

from gateway.draw_derivation import META_NAME, DrawDerivation, ShardDraws, settle
from gateway.engine import (
    Engine,
    KeyedInputs,
    PublishedRecord,
    SourceRef,
    ValidRecord,
    WindowKeys,
    WindowResult,
    encode_rows,
)
from gateway.errors import PrivgwError
from gateway.keyed import SECRET_ENV, SECRET_FILE_ENV, Keyring
from gateway.policy import Policy
from gateway.shards import merge, route
from stream_jobs.memory import Collector, tune_memory

__all__ = [
    "EngineProcess",
    "EngineProcessError",
    "EngineShards",
    "EngineSpec",
    "PackedRecords",
]

_PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)
_MARSHAL, _PICKLE = b"m", b"p"


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


# -- the window on the wire ----------------------------------------------------------------
class _ColumnRow(Mapping[str, object]):
    """One record's values in the child: a view of the window's columns (the engine reads the
    columns; a record's mapping is built only if something asks for it)."""

    __slots__ = ("_columns", "_i")

    def __init__(self, columns: Mapping[str, Sequence[object]], i: int) -> None:
        self._columns = columns
        self._i = i

    def __getitem__(self, name: str) -> object:
        return self._columns[name][self._i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)


def _value_columns(records: Sequence[ValidRecord]) -> dict[str, list[object]] | None:
    """The records' values as one list per attribute, or None unless every record has the
    same attributes (then the window travels as one mapping per record)."""
    if not records:
        return {}
    names = list(records[0].values)
    width = len(names)
    maps = [r.values for r in records]
    if any(len(m) != width for m in maps):
        return None
    try:
        return {n: [m[n] for m in maps] for n in names}
    except KeyError:
        return None


def _encode_window(records: Sequence[ValidRecord], inputs: KeyedInputs | None = None) -> bytes:
    """The window as columns: ~0.6 µs a record to load in the child against ~2.3 µs for one
    dict per record (measured on 5,000 Adult records), and the engine reads them as columns.
    ``inputs``: the records' keyed digests travel with them (computed here, off the engine's
    core), if every record has its input position (a record's draws may be bound to it, and
    without one its id would be its index in the whole window, not known here)."""
    sources = [r.source for r in records]
    by_name = _value_columns(records)
    values: Any = by_name
    if by_name is None:
        values = [r.values if type(r.values) is dict else dict(r.values) for r in records]
    keys: tuple[Any, ...] | None = None
    if inputs is not None and None not in sources:
        # a value the engine cannot take fails in the child, reported without the value
        with contextlib.suppress(ValueError, TypeError):
            keys = tuple(inputs.of(records, by_attribute=by_name))  # marshal: plain tuples
    columns = (
        [r.respondent_id for r in records],
        values,
        [s.topic if s is not None else None for s in sources],
        [s.partition if s is not None else 0 for s in sources],
        [s.offset if s is not None else 0 for s in sources],
        [s.timestamp_ms if s is not None else -1 for s in sources],
        [r.arrived_at for r in records],
        keys,
    )
    return _pack(columns)


@dataclass(frozen=True, slots=True)
class PackedRecords:
    """The last ``count`` records of a window, packed ahead (``EngineProcess.pack``, one
    segment per batch as the worker validated them) while the engine was busy."""

    count: int
    segments: tuple[bytes, ...]


def _request(
    records: Sequence[ValidRecord],
    now: float,
    flush_all: bool,
    tail: PackedRecords | None = None,
    inputs: KeyedInputs | None = None,
) -> tuple[Any, ...]:
    if tail is None or not 0 < tail.count <= len(records):
        return ("protect", [_encode_window(records, inputs)], now, flush_all)
    head = len(records) - tail.count
    segments = [_encode_window(records[:head], inputs)] if head else []
    return ("protect", [*segments, *tail.segments], now, flush_all)


def _pack(columns: tuple[Any, ...]) -> bytes:
    """Columns in ``marshal`` form (exact for the str/int/float/None/bool values validation
    produces), pickled if anything else appears; tagged with which."""
    try:
        return _MARSHAL + marshal.dumps(columns)
    except ValueError:  # a value of a type marshal does not know
        return _PICKLE + pickle.dumps(columns, protocol=pickle.HIGHEST_PROTOCOL)


def _unpack(blob: bytes) -> Any:
    body = memoryview(blob)[1:]
    return marshal.loads(body) if blob[:1] == _MARSHAL else pickle.loads(body)


def _decode_window(
    blobs: Sequence[bytes],
) -> tuple[list[ValidRecord], dict[str, list[object]] | None, WindowKeys | None]:
    """The records of a window's segments, their values as columns when every segment
    travelled as columns of the same attributes, and their keys when every segment brought
    them."""
    unpacked = list(map(_unpack, blobs))
    parts = [part for part in unpacked if part[0]] or unpacked[:1]
    ids, values, topics, partitions, offsets, stamps, arrived, keys = (
        parts[0] if len(parts) == 1 else _concatenate(parts)
    )
    by_name: dict[str, list[object]] | None = None
    if isinstance(values, dict):
        by_name = values
        values = [_ColumnRow(by_name, i) for i in range(len(ids))]
    records = [
        ValidRecord(rid, vals, SourceRef(t, p, o, ts) if t is not None else None, at)
        for rid, vals, t, p, o, ts, at in zip(
            ids, values, topics, partitions, offsets, stamps, arrived, strict=True
        )
    ]
    return records, by_name, None if keys is None else WindowKeys(*keys)


def _concatenate(parts: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    """Segments' columns joined: values stay columns when every segment has the same
    attributes, else they become one mapping per record."""
    ids, *sources = ([v for part in parts for v in part[j]] for j in (0, 2, 3, 4, 5, 6))
    names = [part[1].keys() if isinstance(part[1], dict) else None for part in parts]
    values: dict[str, list[object]] | list[dict[str, object]]
    if names[0] is not None and all(n is not None and n == names[0] for n in names):
        values = {n: [v for part in parts for v in part[1][n]] for n in names[0]}
    else:
        values = [m for part in parts for m in _mappings(part[1])]
    keys: tuple[Any, ...] | None = None
    if all(part[7] is not None for part in parts):  # else the engine computes them
        respondents, draws, qi = ([v for part in parts for v in part[7][j]] for j in (0, 1, 3))
        by_value = {n: [d for part in parts for d in part[7][2][n]] for n in parts[0][7][2]}
        keys = (respondents, draws, by_value, qi)
    return (ids, values, *sources, keys)


def _mappings(values: dict[str, list[object]] | list[dict[str, object]]) -> list[dict[str, object]]:
    """A segment's values as one mapping per record."""
    if not isinstance(values, dict):
        return values
    return [dict(zip(values, row, strict=True)) for row in zip(*values.values(), strict=True)]


def _encode_result(records: Sequence[ValidRecord], result: WindowResult) -> tuple[bytes, bytes]:
    by_source = {id(r.source): i for i, r in enumerate(records) if r.source is not None}
    by_record = {id(r): i for i, r in enumerate(records)}
    pub = result.published
    # the values as the engine left them: columns, encoded by the worker (_decode_result)
    values = result.output if result.output is not None else [p.value for p in pub]
    columns = (
        [p.record_id for p in pub],
        [p.key for p in pub],
        values,
        [by_source[id(p.source)] if p.source is not None else -1 for p in pub],
        [p.suppressed for p in pub],
        [by_record[id(h)] for h in result.held],
    )
    extra = (result.report, result.aggregated)
    return _pack(columns), pickle.dumps(extra, protocol=pickle.HIGHEST_PROTOCOL)


class _Published(Sequence[PublishedRecord]):
    """A window's published records whose values the child left as columns, encoded on first
    use: by the event loop when it produces them, while the child already protects the next
    window (:meth:`GatewayWorker._protected` hands that over first), not by the engine's thread
    before it. The engine's core is the gateway's bottleneck; the worker's has time to spare."""

    __slots__ = ("_args", "_n", "_records")

    def __init__(
        self,
        rids: list[str],
        keys: list[bytes | None],
        output: tuple[list[str], list[list[Any]]],
        sources: list[SourceRef | None],
        suppressed: list[bool],
    ) -> None:
        self._n = len(rids)
        self._args: tuple[Any, ...] | None = (rids, keys, output, sources, suppressed)
        self._records: list[PublishedRecord] | None = None

    def _all(self) -> list[PublishedRecord]:
        if self._records is None:
            assert self._args is not None
            rids, keys, (names, columns), sources, suppressed = self._args
            values = encode_rows(names, columns)
            self._records = list(map(PublishedRecord, rids, keys, values, sources, suppressed))
            self._args = None
        return self._records

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> PublishedRecord: ...
    @overload
    def __getitem__(self, i: slice) -> list[PublishedRecord]: ...
    def __getitem__(self, i: int | slice) -> PublishedRecord | list[PublishedRecord]:
        return self._all()[i]

    def __iter__(self) -> Iterator[PublishedRecord]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return self._all() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def _decode_result(records: Sequence[ValidRecord], columns: bytes, extra: bytes) -> WindowResult:
    rids, keys, values, origin, suppressed, held = _unpack(columns)
    sources = [records[i].source if i >= 0 else None for i in origin]
    published: Sequence[PublishedRecord]
    if isinstance(values, tuple):  # (names, columns): the child left them to be encoded here
        published = _Published(rids, keys, values, sources, suppressed)
    else:
        published = list(map(PublishedRecord, rids, keys, values, sources, suppressed))
    report, aggregated = pickle.loads(extra)
    return WindowResult(
        published=published,
        held=[records[i] for i in held],
        report=report,
        aggregated=aggregated,
    )


# -- the child -----------------------------------------------------------------------------
def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _serve(conn: Connection, parent: int) -> None:
    """The child's loop: build the engine, then answer requests until told to close or the
    socket closes."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    store = None
    try:
        op, spec = pickle.loads(conn.recv_bytes())
        if op != "start" or not isinstance(spec, EngineSpec):
            raise ValueError("the engine process expects a start request first")
        engine, store = spec.build()
        conn.send_bytes(pickle.dumps(("ok", engine.version, engine.metadata())))
        tune_memory()
        collector = Collector()
        collector.start(time.monotonic())
        while True:
            try:
                request = pickle.loads(conn.recv_bytes())
            except EOFError:
                return
            try:
                reply = _answer(request, engine, store, spec.encode_outputs)
            except Exception as err:  # reported to the worker, which stops
                reply = ("error", type(err).__name__, _message(err))
            conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
            if request[0] == "close":
                return
            if request[0] == "protect":
                # collected after replying, while the worker handles the result and sends the
                # next window, not before it (the worker would wait for it)
                del request, reply
                collector.after_window(time.monotonic())
    except Exception as err:  # start-up failed: say why before exiting
        with contextlib.suppress(OSError):
            conn.send_bytes(pickle.dumps(("error", type(err).__name__, _message(err))))
    finally:
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()


def _message(err: Exception) -> str:
    """Our own messages name settings and never values; a library's may quote an input value
    (numpy's "could not convert string to float: …"), so only its class crosses over."""
    if isinstance(err, PrivgwError):
        return str(err)
    return "message withheld (it may quote an input value)"


def _answer(request: tuple[Any, ...], engine: Engine, store: Any, encode: bool) -> tuple[Any, ...]:
    op = request[0]
    if op == "count_prefix":
        return ("ok", store.count_prefix(request[1]))
    if op == "protect":
        _, blobs, now, flush_all = request
        records, by_attribute, keys = _decode_window(blobs)
        result = engine.protect_window(
            records,
            now=now,
            flush_all=flush_all,
            by_attribute=by_attribute,
            encode=encode,
            keys=keys,
        )
        columns, report = _encode_result(records, result)
        return ("ok", columns, report, store.count())
    if op == "count":
        return ("ok", store.count())
    if op == "ping":  # the heartbeat (stream_jobs.engine_heartbeat)
        return ("ok",)
    if op == "key_fingerprints":
        return ("ok", store.key_fingerprints())
    if op == "set_key_fingerprint":
        store.set_key_fingerprint(request[1])
        return ("ok",)
    if op == "rotate_key_fingerprint":
        return ("ok", store.rotate_key_fingerprint(request[1]))
    if op == "draws_bound":  # gateway.draw_derivation.settle, at the worker's start
        return ("ok", engine.draws_bound())
    if op == "use_draws":
        engine.use_draws(request[1])
        return ("ok",)
    if op == "close":
        store.close()
        return ("ok",)
    raise ValueError(f"unknown engine request {op!r}")


# -- the worker's side -----------------------------------------------------------------------
def _child_environment() -> dict[str, str]:
    """The worker's environment without the secret (the child gets it in its start-up
    message), importing this very copy of privgw first."""
    env = {k: v for k, v in os.environ.items() if k not in (SECRET_ENV, SECRET_FILE_ENV)}
    root = str(Path(__file__).resolve().parents[1])
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
                [sys.executable, "-P", "-m", __name__, str(child_end.fileno()), str(os.getpid())],
                pass_fds=(child_end.fileno(),),
                stdin=subprocess.DEVNULL,
                env=_child_environment(),
            )
        finally:
            child_end.close()
        self._lock = threading.Lock()
        self._closed = False
        self._count = 0
        self._prefixed: dict[bytes, int] = {}
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
        self, records: Sequence[ValidRecord], *, now: float, flush_all: bool = False
    ) -> WindowResult:
        return self.prepare(records, now=now, flush_all=flush_all)()

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
    ) -> Callable[[], WindowResult]:
        """``protect_window`` in two steps: the window packed here, on the calling thread (the
        worker's event loop, where the packing does not contend for the GIL with it), and the
        call it returns, which hands it over and waits (the worker's engine thread).
        ``tail``: the window's last records, already packed by :meth:`pack`."""
        request = _request(records, now, flush_all, tail, self._inputs)
        return functools.partial(self._protect_request, records, request)

    def pack(self, records: Sequence[ValidRecord]) -> bytes:
        """Records packed ahead of their window, for :meth:`prepare`'s ``tail``, with their
        keyed digests (:class:`WindowKeys`): computed here while the child protects the window
        before, not by the child once it has the window."""
        return _encode_window(records, self._inputs)

    def _protect_request(
        self, records: Sequence[ValidRecord], request: tuple[Any, ...]
    ) -> WindowResult:
        self.submit(request)
        return self.collect(records)

    def submit(self, request: tuple[Any, ...]) -> None:
        """Hand a packed window (``_request``) to the child and return; ``collect`` waits for
        its result. The engine is this process's until then (``count`` answers from its last
        figure)."""
        self._lock.acquire()
        try:
            self._send(request)
        except BaseException:
            self._lock.release()
            raise

    def collect(self, records: Sequence[ValidRecord]) -> WindowResult:
        """The result of the window ``submit`` handed over (the same ``records``)."""
        try:
            _, columns, extra, self._count = self._reply("protect_window")
        finally:
            self._lock.release()
        return _decode_result(records, columns, extra)

    def count_prefix(self, prefix: bytes) -> int:
        """Keys of the child's store that start with ``prefix``; 0 while a window is in the
        child (a scrape does not wait for the engine)."""
        if not self._lock.acquire(blocking=False):
            return self._prefixed.get(prefix, 0)
        try:
            self._send(("count_prefix", prefix))
            self._prefixed[prefix] = int(self._reply("count_prefix")[1])
            return self._prefixed[prefix]
        finally:
            self._lock.release()

    def count(self) -> int:
        """Entries in the child's state store (for the metrics exporter). While a window is in
        the child, the count after the last one: a scrape does not wait for the engine."""
        if not self._lock.acquire(blocking=False):
            return self._count
        try:
            self._send(("count",))
            self._count = int(self._reply("count")[1])
            return self._count
        finally:
            self._lock.release()

    def ping(self) -> bool:
        """The heartbeat: the child answers while no window is in it (True); False when one is
        (the window's own progress is watched then). Raises ``EngineProcessError`` when the
        child is gone; blocks while it does not answer (the caller measures how long)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._send(("ping",))
            self._reply("ping")
            return True
        finally:
            self._lock.release()

    def key_fingerprints(self) -> list[str | None]:
        """The key fingerprint the child's store holds (``gateway.state_api``)."""
        with self._lock:
            self._send(("key_fingerprints",))
            return list(self._reply("key_fingerprints")[1])

    def set_key_fingerprint(self, fingerprint: str) -> None:
        with self._lock:
            self._send(("set_key_fingerprint", fingerprint))
            self._reply("set_key_fingerprint")

    @property
    def draws(self) -> DrawDerivation | None:
        """The child engine's draw derivation (``gateway.draw_derivation``)."""
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
            reply: tuple[Any, ...] = pickle.loads(self._conn.recv_bytes())
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
    """Engines over shards of respondents (:mod:`gateway.shards`), one child process and
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
        self, records: Sequence[ValidRecord], *, now: float, flush_all: bool = False
    ) -> WindowResult:
        return self.prepare(records, now=now, flush_all=flush_all)()

    def prepare(
        self, records: Sequence[ValidRecord], *, now: float, flush_all: bool = False
    ) -> Callable[[], WindowResult]:
        """As :meth:`EngineProcess.prepare`: the shards' windows packed here, handed over and
        waited for by the call returned."""
        parts = route(records, len(self.shards))
        windows = [[records[i] for i in idx] for idx in parts]
        # every shard gets every window, an empty one too: their risk sampling stays in step
        requests = [_request(window, now, flush_all) for window in windows]
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


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m stream_jobs.engine_process FD PARENT_PID`` (started by ``EngineProcess``)."""
    fd, parent = (int(a) for a in (argv if argv is not None else sys.argv[1:]))
    _serve(Connection(fd), parent)


if __name__ == "__main__":  # run the package's copy, whose classes the pickles name
    from stream_jobs import engine_process  # noqa: PLW0406

    engine_process.main()
