"""``privgw``: the command line — its parser, exit codes and signal handling, and the policy
and secret commands. The file workflow's commands register from :mod:`gateway.files.commands`
and :mod:`gateway.files.risk_cli`; the Kafka commands (run, demo, simulate) plug in through the
``privgw.commands`` entry point so the engine never imports them."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from gateway.commands.command_kit import add_command, print_json
from gateway.commands.sigterm import (
    STOPPED_EARLY,
    during_import,
    note_sigterm,
    sigterm_received,
)
from gateway.errors import PrivgwError
from gateway.files.policy_report import policy_report
from gateway.policy import duration_text, load_policy

log = logging.getLogger("privgw")
# exit codes (docs/operating.md's table; tests/deploy/test_runbook.py holds the two together;
# stream_jobs.shutdown.EXIT_BROKER_AWAY is the worker's own)
EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and failed (a worker at run time, a check that found drift)
EXIT_REFUSED = 2  # a setting, the policy, the state, the secret: one `privgw: error:` line
EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a reader that went away
Handler = Callable[[argparse.Namespace], int]


# -- commands ------------------------------------------------------------------------------
def _print_beside_claim(report: dict[str, Any]) -> None:
    """What is published beside the k claim, outside it: attributes of role other, and the
    sampling weight."""
    if report["published_outside_k_claim"]:
        methods = {n: e["method"] for n, e in report["attributes"].items()}
        print(
            "published beside the k claim, outside it (role other): "
            + ", ".join(f"{n} ({methods[n]})" for n in report["published_outside_k_claim"])
            + "; an attribute an adversary can know splits the classes: make it a "
            "quasi_identifier or drop it"
        )
    weight = report["published_weight"]
    if weight:
        step = report["attributes"][weight].get("round_to")
        print(
            f"published beside the k claim, outside it (the sampling weight): {weight} "
            + (f"(rounded to {step:g})" if step else "(unrounded)")
            + "; a weight shared by fewer than k respondents singles them out: round it to a "
            "step that k or more share (round_to) or drop it"
        )


def cmd_check_policy(args: argparse.Namespace) -> int:
    report = policy_report(load_policy(args.policy), data=args.data)
    if args.json:
        print_json(report)
        return 0
    print(f"policy {report['policy']} version {report['version']}")
    claim = report["k_claim"]
    if claim:
        print(
            f"k = {report['k']}: every published tuple of ({', '.join(claim)}) together is "
            f"shared by at least {report['k']} respondents over the whole history"
        )
    else:
        print("no k-anonymity claim: no quasi-identifier is microaggregated")
    if report["unprotected_quasi_identifiers"]:
        print(
            "NOT covered by the k claim (unprotected: true): "
            + ", ".join(report["unprotected_quasi_identifiers"])
        )
    if claim:
        _print_beside_claim(report)
    print(f"consistency: {report['consistency']}")
    if report["stream_refusal"] is not None:
        print(f"  note: `privgw run` refuses this policy: {report['stream_refusal']}")
    if claim:
        print(f"republication: {report['republication']['statement']}")
        if "retirement" in report["republication"]:
            print(f"  retirement: {report['republication']['retirement']}")
    wait = report["longest_wait"]
    print(
        f"input topic: a record may wait up to {duration_text(wait['seconds'])} "
        f"({wait['setting']}) read but not yet published, and a restart reads it again from "
        f"the topic: keep its retention.ms at {wait['input_retention_ms']} or more "
        "(`privgw run` refuses less than the wait)"
    )
    for name, entry in report["attributes"].items():
        print(f"\n{name}: {entry['role']} {entry['type']}, {entry['method']}")
        if "gamma" in entry:
            print(f"  gamma = {entry['gamma']:.4f}, epsilon = ln gamma = {entry['epsilon']:.4f}")
            print(
                "  retention: "
                + ", ".join(
                    f"{c}={p:.3f}"
                    for c, p in zip(entry["categories"], entry["retention"], strict=True)
                )
            )
            print(
                "  largest rho2 guaranteed: "
                + ", ".join(f"rho1={r1} -> {r2:.3f}" for r1, r2 in entry["rho2_for_rho1"].items())
            )
            print("  P[j][i] = Pr(publish j | true i):")
            for c, row in zip(entry["categories"], entry["matrix"], strict=True):
                print(f"    {c[:18]:>18} " + " ".join(f"{v:.3f}" for v in row))
            if "note" in entry:
                print(f"  note: {entry['note']}")
        elif entry.get("k") is not None:
            print(f"  k = {entry['k']} ({entry['algorithm']}, {entry['kind']})")
        elif "noise" in entry:
            coding = entry.get("coding")
            if coding:
                print(f"  top/bottom coded first: {coding}")
            print(
                f"  Gaussian noise: sd = max(sd, sqrt(ratio) * S of the window): {entry['noise']}"
            )
            if "round_to" in entry:
                step = entry["round_to"]
                print(
                    f"  then rounded to a multiple of {step:g} (sticky as the noise): equal "
                    "published amounts pool respondents, so fewer records link across releases "
                    f"by them; analysts add {step:g}²/12 = {step * step / 12:,.0f} to the noise "
                    "variance"
                )
        elif "round_to" in entry:
            print(f"  published rounded to a multiple of {entry['round_to']:g}")
        if "note" in entry and "gamma" not in entry:
            print(f"  note: {entry['note']}")
    return 0


def cmd_secret_create(args: argparse.Namespace) -> int:
    from gateway.keyed.keyed import SECRET_FILE_ENV, Keyring, generate_secret_file, load_secret  # noqa: PLC0415

    try:
        generate_secret_file(args.file)  # refuses an existing file: every key depends on it
    except OSError as err:  # e.g. a parent that is a file (SecretError is not an OSError)
        blocker = next((a for a in Path(args.file).parents if a.exists()), None)
        why = (
            f"{blocker} is a file, not a directory"
            if blocker is not None and not blocker.is_dir()
            else f"it cannot be created ({err.__class__.__name__})"
        )
        raise PrivgwError(f"secret create {args.file}: {why}; choose a writable place") from None
    fingerprint = Keyring(load_secret({SECRET_FILE_ENV: str(args.file)})).fingerprint()
    print(
        f"wrote a new secret to {args.file} (mode 0600); key fingerprint {fingerprint}\n"
        f"use it with {SECRET_FILE_ENV}={args.file}; keep it, and back it up: a state is "
        "refused with any other secret"
    )
    return 0


# -- parser --------------------------------------------------------------------------------
def package_version() -> str:
    """The installed privgw's version (``privgw --version``, the banner, privgw_build_info)."""
    try:
        return importlib.metadata.version("privgw")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="privgw",
        description="privgw: a privacy gateway for incremental publication of survey microdata.",
        epilog="example:\n  privgw demo\n  privgw protect ../shared/data/adult.csv "
        "--policy deploy/policies/adult.yaml -o out/adult.csv",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    parser.add_argument(
        "--version",
        action="version",
        version=f"privgw {package_version()} (Python {sys.version.split()[0]})",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = add_command(
        sub,
        "check-policy",
        "validate a policy and print what it guarantees",
        "privgw check-policy deploy/policies/adult.yaml",
    )
    p.add_argument("policy", help="policy YAML")
    p.add_argument(
        "--data",
        help="input file: show the fine-grain matrices `protect` builds from its frequencies",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=cmd_check_policy)

    p = add_command(
        sub,
        "secret",
        "manage the deployment secret (PRIVGW_SECRET_FILE)",
        "privgw secret create /run/secrets/privgw",
    )
    actions = p.add_subparsers(dest="secret_command", metavar="ACTION", required=True)
    p = add_command(
        actions,
        "create",
        "write a new random secret (32 bytes, hex) to a new file, mode 0600; print its key "
        "fingerprint, never the secret",
        "privgw secret create /run/secrets/privgw",
    )
    p.add_argument("file", help="the file to create (an existing file is never overwritten)")
    p.set_defaults(func=cmd_secret_create)

    # the file workflow's commands, then the sdcMicro-shaped ones (risk, kanon)
    from gateway.files import commands, risk_cli  # noqa: PLC0415

    commands.register(sub)
    risk_cli.register(sub)

    for ep in importlib.metadata.entry_points(group="privgw.commands"):
        try:
            ep.load()(sub)
        except ImportError as err:  # an optional part is not installed: the file commands work
            log.debug("commands %s unavailable: %s", ep.name, err.__class__.__name__)
    return parser


class Terminated(BaseException):
    """SIGTERM before a command's own handling of it (a worker's loop) is in place."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    note_sigterm()  # remembered too: a library's bare except could swallow the exception
    if not during_import(frame):  # a command's own import: the worker's start checks the note
        raise Terminated


def _stop_on_sigterm() -> None:
    """SIGTERM at any moment ends the command cleanly (exit 0), never with the signal: until
    the worker installs its own handler, and again after it removes it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_REFUSED
    handler: Handler = args.func
    _stop_on_sigterm()
    try:
        if sigterm_received():
            raise Terminated
        code = handler(args)
        sys.stdout.flush()  # a reader that went away shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:
        # the reader went away (`privgw check-policy … | head -1`): quiet, as `cat` would be,
        # and stdout pointed at /dev/null so that the interpreter's last flush stays quiet too
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Terminated:
        print(STOPPED_EARLY, file=sys.stderr)
        return 0
    except PrivgwError as err:
        print(f"privgw: error: {err}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as err:
        if args.debug:
            raise
        # no message text: it could carry a value from the data
        print(
            f"privgw: internal error ({err.__class__.__name__}); rerun with --debug for the "
            "traceback",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
