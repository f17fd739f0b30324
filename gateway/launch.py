"""The ``privgw`` command's entry: SIGTERM ends it cleanly from its very first moment.

Importing the CLI takes about a second (pandas, numpy): the handler is installed before, and
the CLI keeps it (``gateway.cli.Terminated``) until a worker installs its own.
"""

from __future__ import annotations

import signal
import sys


class _EarlyTerm(BaseException):
    pass


def _early(signum: int, frame: object) -> None:
    raise _EarlyTerm


def main() -> int:
    signal.signal(signal.SIGTERM, _early)
    try:
        from gateway.cli import main as cli_main  # noqa: PLC0415 (after the handler)
    except _EarlyTerm:
        print("privgw: stopped by SIGTERM before it had started its work", file=sys.stderr)
        return 0
    try:
        return cli_main()
    except _EarlyTerm:  # between the import and the CLI's own handler
        print("privgw: stopped by SIGTERM before it had started its work", file=sys.stderr)
        return 0
