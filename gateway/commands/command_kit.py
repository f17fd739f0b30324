"""What every command-line front end shares (the file commands, the Kafka commands through
the ``privgw.commands`` entry point): a subcommand with its example, and JSON / number output."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from gateway.policy import MAX_WAVE


def add_command(sub: Any, name: str, help_: str, example: str) -> argparse.ArgumentParser:
    """A subcommand with its help, and an example in its epilog (plug-ins use it too)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_,
        description=help_,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def print_json(obj: Any) -> None:
    sys.stdout.write(
        orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n"
    )


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def wave_number(text: str) -> int:
    """An argparse type: a wave number, as records carry them."""
    try:
        wave = int(text)
    except ValueError:
        wave = -1
    if not 0 <= wave <= MAX_WAVE:
        raise argparse.ArgumentTypeError(
            f"must be a wave number, a whole number in [0, {MAX_WAVE}], got {text!r}"
        )
    return wave


def wave_pair(text: str) -> tuple[int, int]:
    """``reconstruct --change W1,W2``: two different wave numbers."""
    parts = text.split(",")
    if len(parts) != 2 or parts[0] == parts[1]:
        raise argparse.ArgumentTypeError(f"give two different waves as W1,W2, got {text!r}")
    first, second = (wave_number(p) for p in parts)
    return first, second
