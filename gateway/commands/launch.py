"""The ``privgw`` command's entry: SIGTERM ends it cleanly from its very first moment.

Importing the CLI takes about a second (pandas, numpy): the handler is installed before, and
the CLI keeps it (``gateway.commands.cli.Terminated``) until a worker installs its own. Raising from
a signal handler is not enough on its own: a library that catches everything while it imports
(a bare ``except:``) swallows the exception, and the command would run on as if no SIGTERM had
come. So the signal is also remembered, and the command checks it at each step of its start
(``gateway.commands.sigterm``): after the imports, before the command, when the worker's own handler
takes over.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from gateway.commands.sigterm import (
    STOPPED_EARLY,
    during_import,
    note_sigterm,
    sigterm_received,
)


class _EarlyTerm(BaseException):
    pass


def _early(signum: int, frame: FrameType | None) -> None:
    note_sigterm()
    if not during_import(frame):  # (the CLI's import is checked when it is done)
        raise _EarlyTerm


def main() -> int:
    signal.signal(signal.SIGTERM, _early)
    try:
        from gateway.commands.cli import main as cli_main  # noqa: PLC0415 (after the handler)

        if sigterm_received():  # raised inside an import that swallowed it
            raise _EarlyTerm
    except _EarlyTerm:
        print(STOPPED_EARLY, file=sys.stderr)
        return 0
    try:
        return cli_main()
    except _EarlyTerm:  # between the import and the CLI's own handler
        print(STOPPED_EARLY, file=sys.stderr)
        return 0
