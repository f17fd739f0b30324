"""SIGTERM remembered from the ``privgw`` command's first moment until a worker's own handler.

A library that catches everything while it imports (a bare ``except:``) can swallow the
exception a signal handler raises; the flag set here survives that, and the command checks it at
each step of its start. The entry (``gateway.commands.launch``) sets it before the CLI is imported,
the CLI (``gateway.commands.cli``) while it runs, the worker (``stream_jobs.app``) once its loop is
up.
"""

from __future__ import annotations

from types import FrameType

STOPPED_EARLY = "privgw: stopped by SIGTERM before it had started its work"


class _Received:
    sigterm = False  # set from a signal handler: a plain attribute, no lock to deadlock on


def note_sigterm() -> None:
    _Received.sigterm = True


def sigterm_received() -> bool:
    """Whether SIGTERM came before the worker's own handler was in place."""
    return _Received.sigterm


def during_import(frame: FrameType | None) -> bool:
    """Whether a signal handler interrupted an import. Its handler must then only note the
    signal: an exception raised into a C extension's initialisation can crash the interpreter
    (orjson's did: SIGSEGV, about once in 80 SIGTERMs at start-up on a loaded machine). The
    note is checked once the import is done (after the CLI's imports, before the command, when
    the worker starts)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False
