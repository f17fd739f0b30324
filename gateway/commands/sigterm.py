"""SIGTERM remembered from the ``privgw`` command's first moment until a worker's own handler.

A library that catches everything while it imports (a bare ``except:``) can swallow the
exception a signal handler raises; the flag set here survives that, and the command checks it at
each step of its start. The entry (``gateway.commands.launch``) sets it before the CLI is imported,
the CLI (``gateway.commands.cli``) while it runs, the worker (``stream_jobs.app``) once its loop is
up.
"""

from __future__ import annotations

STOPPED_EARLY = "privgw: stopped by SIGTERM before it had started its work"


class _Received:
    sigterm = False  # set from a signal handler: a plain attribute, no lock to deadlock on


def note_sigterm() -> None:
    _Received.sigterm = True


def sigterm_received() -> bool:
    """Whether SIGTERM came before the worker's own handler was in place."""
    return _Received.sigterm
