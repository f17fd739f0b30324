"""The engine's child process: builds the engine and its SQLite store, then answers requests.

Started by ``stream_jobs.engine_process.engine_process.EngineProcess`` as ``python -m
stream_jobs.engine_process.engine_child`` over a private socket pair: the first message is the
pickled ``("start", EngineSpec)`` (the deployment secret travels inside it, never on the command
line or in the environment); each later one is a pickled ``(op, …)`` tuple, answered with ``("ok",
…)`` or ``("error", class name, message)`` — the message only when it is one of privgw's own, which
never quote a value.

The child dies with the worker (``PR_SET_PDEATHSIG``), so a worker killed with SIGKILL leaves no
engine behind to write state after its replacement has started; it ignores SIGINT and SIGTERM,
so a Ctrl-C or a group-wide TERM reaches the worker, which closes it in order. It collects
garbage after it replies to a window, while the worker handles the result, not before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from gateway.engine.engine import Engine
from gateway.engine.records import NO_MARKS
from gateway.errors import PrivgwError
from gateway.panel.roster import roster_last_wave, roster_members
from stream_jobs.engine_process.engine_process import EngineSpec
from stream_jobs.engine_process.engine_wire import (
    HeldInChild,
    decode_window,
    encode_result,
    held_positions,
)
from stream_jobs.engine_process.framing import receive
from stream_jobs.engine_process.memory import Collector, tune_memory

_PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)


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
        held = HeldInChild()  # what the last window handed back held
        while True:
            try:
                request = pickle.loads(receive(conn))
            except EOFError:
                return
            try:
                reply = _answer(request, engine, store, spec.encode_outputs, held)
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


def _answer(
    request: tuple[Any, ...], engine: Engine, store: Any, encode: bool, held: HeldInChild
) -> tuple[Any, ...]:
    op = request[0]
    if op == "count_prefix":
        return ("ok", store.count_prefix(request[1]))
    if op == "protect":
        # (benches send neither offsets nor held records)
        _, blobs, now, flush_all, *rest = request
        marks = rest[0] if rest and rest[0] is not None else NO_MARKS
        kept = rest[1] if len(rest) > 1 else 0
        records, by_attribute, keys = held.join(kept, *decode_window(blobs))
        result = engine.protect_window(
            records,
            now=now,
            flush_all=flush_all,
            by_attribute=by_attribute,
            encode=encode,
            keys=keys,
            marks=marks,
        )
        at = held_positions(records, result)
        held.keep(records, by_attribute, keys, at)
        columns, report = encode_result(records, result, at)
        return ("ok", columns, report, store.count())
    if op == "count":
        return ("ok", store.count())
    if op == "panel_members":
        return ("ok", roster_members(store.get_many, [None]))
    if op == "panel_last_wave":  # a restart's decided waves (stream_jobs.intake.wave_control)
        return ("ok", roster_last_wave(store.get_many, None))
    if op == "ping":  # the heartbeat (stream_jobs.engine_process.engine_heartbeat)
        return ("ok",)
    if op == "draws_bound":  # gateway.keyed.draw_derivation.settle, at the worker's start
        return ("ok", engine.draws_bound())
    if op == "use_draws":
        engine.use_draws(request[1])
        return ("ok",)
    if op == "key_fingerprints":
        return ("ok", store.key_fingerprints())
    if op == "set_key_fingerprint":
        store.set_key_fingerprint(request[1])
        return ("ok",)
    if op == "rotate_key_fingerprint":
        return ("ok", store.rotate_key_fingerprint(request[1]))
    if op == "close":
        store.close()
        return ("ok",)
    raise ValueError(f"unknown engine request {op!r}")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m stream_jobs.engine_process.engine_child FD PARENT_PID`` (started by
    ``EngineProcess``)."""
    fd, parent = (int(a) for a in (argv if argv is not None else sys.argv[1:]))
    _serve(Connection(fd), parent)


if __name__ == "__main__":  # run the package's copy, whose classes the pickles name
    from stream_jobs.engine_process import engine_child  # noqa: PLW0406

    engine_child.main()
