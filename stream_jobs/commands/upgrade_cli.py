"""``privgw policy diff`` and ``privgw state migrate``: policy upgrades on a state directory,
offline (the worker stopped); ``privgw run --policy-upgrade VERSION`` does the same at start.
The rules are in :mod:`gateway.policy.upgrade` and :mod:`state.policy_record`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import orjson

from gateway.commands.command_kit import add_command
from gateway.errors import PrivgwError
from gateway.policy import load_policy

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "policy",
        "compare policies: what a change does to a state written under another policy",
        "privgw policy diff --state-dir /var/lib/privgw/state --policy new.yaml",
    )
    actions = p.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    p = add_command(
        actions,
        "diff",
        "list each change between a state's (or an old) policy and a new one, classified as "
        "safe, needing re-grouping, or fresh draws (a privacy event); exit 0: nothing the "
        "state depends on changed, 1: changes",
        "privgw policy diff --state-dir /var/lib/privgw/state --policy new.yaml\n"
        "  privgw policy diff --from old.yaml --policy new.yaml --json",
    )
    p.add_argument("--policy", required=True, help="the new policy YAML")
    origin = p.add_mutually_exclusive_group(required=True)
    origin.add_argument("--from", dest="old", help="the old policy YAML")
    origin.add_argument(
        "--state-dir", help="a worker's state directory: the policy it was written under"
    )
    _backend(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_policy_diff)

    p = add_command(
        sub,
        "state",
        "operate on a worker's state directory (the worker stopped)",
        "privgw state migrate --state-dir /var/lib/privgw/state --policy new.yaml",
    )
    actions = p.add_subparsers(dest="state_command", metavar="ACTION", required=True)
    p = add_command(
        actions,
        "migrate",
        "make a state valid under a new policy: re-form groups smaller than a raised k (or "
        "all, for another quasi-identifier set), drop the stored draws of changed mechanisms, "
        "record the upgrade; with the worker stopped. --dry-run says what it would do",
        "privgw state migrate --state-dir /var/lib/privgw/state --policy new.yaml --dry-run",
    )
    p.add_argument("--state-dir", required=True, help="the worker's state directory")
    p.add_argument("--policy", required=True, help="the new policy YAML")
    _backend(p)
    p.add_argument("--dry-run", action="store_true", help="report, change nothing")
    p.set_defaults(func=cmd_state_migrate)


def _backend(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-backend",
        choices=["sqlite", "partitioned"],
        default=None,
        help="the worker's backend (default: the one whose state the directory holds); "
        "another one is refused, nothing written",
    )


def cmd_policy_diff(args: argparse.Namespace) -> int:
    from gateway.policy.upgrade import diff  # noqa: PLC0415
    from state.failures import check_existing_state_dir  # noqa: PLC0415
    from state.policy_record import policy_facets, upgrade_for  # noqa: PLC0415

    new = load_policy(args.policy)
    if args.old is not None:
        upgrade = diff(policy_facets(load_policy(args.old)), policy_facets(new))
    else:
        state_dir = Path(args.state_dir)
        check_existing_state_dir(state_dir)
        found = upgrade_for(state_dir, args.state_backend, None, new)
        if found is None:
            raise PrivgwError(
                f"--state-dir {state_dir} records no policy (a new state, or one written "
                "before privgw recorded policies): compare two policy files with --from"
            )
        upgrade = found
    if args.json:
        print(
            orjson.dumps(
                {
                    "from": upgrade.old.version,
                    "to": upgrade.new.version,
                    "changes": [
                        {"facet": c.facet, "change": c.detail, "action": c.action.value}
                        for c in upgrade.changes
                    ],
                    "needs_migration": upgrade.needs_migration,
                    "fresh_draws": upgrade.fresh_draws,
                },
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
        return 1 if upgrade.changes else 0
    print(f"policy {upgrade.old.version} -> {upgrade.new.version}")
    if upgrade.same:
        print("  nothing the state depends on changed: the new policy runs on it as it is")
        return 0
    for change in upgrade.changes:
        print(f"  {change.action.value:<12} {change.detail}")
    print(
        f"accept with: privgw run --policy-upgrade {upgrade.new.version} …  (or privgw state "
        "migrate); fresh draws are privacy events: each changed value is published anew"
        if upgrade.fresh_draws
        else f"accept with: privgw run --policy-upgrade {upgrade.new.version} …  (or privgw "
        "state migrate)"
    )
    return 1


def cmd_state_migrate(args: argparse.Namespace) -> int:
    from state.failures import check_existing_state_dir  # noqa: PLC0415
    from state.layout import stored_backend  # noqa: PLC0415
    from state.policy_record import Outcome, check_policy  # noqa: PLC0415

    policy = load_policy(args.policy)
    state_dir = Path(args.state_dir)
    check_existing_state_dir(state_dir)
    if stored_backend(state_dir) is None:  # nothing to migrate, and nothing to create there
        raise PrivgwError(
            f"--state-dir {state_dir} holds no privgw state (no state.db, no partitions/): "
            "give the worker's state directory; a new state records its policy at the "
            "worker's first start. Nothing was written"
        )
    check = check_policy(
        state_dir,
        args.state_backend,
        None,
        policy,
        accept=policy.version,
        dry_run=args.dry_run,
        command="privgw state migrate",
    )
    if check.outcome is not Outcome.UPGRADED:
        print(f"nothing to migrate ({check.outcome.value}): policy {policy.version} recorded")
        return 0
    assert check.upgrade is not None and check.report is not None
    verb = "would migrate" if args.dry_run else "migrated"
    print(f"{verb} {state_dir}: policy {check.previous_version} -> {policy.version}")
    for change in check.upgrade.changes:
        print(f"  {change.action.value:<12} {change.detail}")
    print(f"  {_report(check)}")
    return 0


def _report(check: Any) -> str:
    """What the migration did; the partitioned backend's partitions migrate later, each as it
    is restored from the changelog (state.partition_policy)."""
    if check.record.events and "from_facets" in check.record.events[-1]:
        return (
            "partitioned backend: the upgrade is recorded here; each partition's state is "
            "migrated as a worker started on this directory restores it from the changelog"
        )
    return str(check.report.text())


def check_policy_on_state(policy: Any, settings: Any, *, dry_run: bool = False) -> Any:
    """At `privgw run`'s start: the policy against the state's record (refused, migrated with
    ``settings.policy_upgrade``, or recorded), logged; returns the check. ``dry_run``: refused
    or not, nothing written or logged (the check before the broker's)."""
    from state.policy_record import Outcome, check_policy  # noqa: PLC0415

    state_dir = Path(settings.state_dir)
    check = check_policy(
        state_dir,
        settings.state_backend,
        settings.engine_shards,
        policy,
        accept=settings.policy_upgrade,
        dry_run=dry_run,
        measure=False,
    )
    if dry_run:
        return check
    if check.outcome is Outcome.UPGRADED:
        assert check.upgrade is not None and check.report is not None
        fresh = check.upgrade.fresh_draws
        log.warning(
            "%spolicy upgraded on the state in %s: %s -> %s: %s; %s",
            "privacy event: " if fresh else "",
            state_dir,
            check.previous_version,
            policy.version,
            check.upgrade.summary(),
            _report(check),
        )
    elif check.outcome is Outcome.VERSION_ONLY:
        log.info(
            "policy version %s -> %s: nothing the state depends on changed",
            check.previous_version,
            policy.version,
        )
    elif check.outcome in (Outcome.NEW, Outcome.ADOPTED):
        log.info("policy version %s recorded in the state in %s", policy.version, state_dir)
    return check
