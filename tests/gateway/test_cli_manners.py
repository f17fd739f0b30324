"""The command line as an operator meets it (issue 30, item 7): a reader that goes away
(`privgw check-policy … | head -1`) ends the command quietly, and every option of every
command, the Kafka ones included, says what it is in --help."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from gateway.commands.cli import EXIT_BROKEN_PIPE, build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_a_reader_that_went_away_is_no_internal_error() -> None:
    read, write = os.pipe()
    os.close(read)  # as `| head -1` does once it has its line
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gateway", "check-policy", "deploy/policies/adult.yaml"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert proc.returncode == EXIT_BROKEN_PIPE == 141, proc.stderr
    assert proc.stderr == ""


def _options(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str, bool]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, "/".join(action.option_strings) or action.dest, bool(action.help)


def test_every_option_of_every_command_has_help() -> None:
    options = list(_options(build_parser(), "privgw"))
    commands = {path for path, _, _ in options}
    assert {"privgw simulate", "privgw run", "privgw policy diff", "privgw state migrate"} <= (
        commands
    )
    missing = [(path, option) for path, option, helped in options if not helped]
    assert not missing, missing
