"""Policy upgrades on the partitioned backend: each partition's state migrated as it is restored.

The partitioned backend's state lives in its changelog topic; a node's ``partitions/`` is
rebuilt from it at every assignment, so a migration of the local files would be lost. Instead
each partition's store records, in a meta entry that goes through the changelog, the facets of
the policy its state is under. An upgrade accepted on a state directory (``--policy-upgrade``,
or ``privgw state migrate``: :func:`state.policy_record.check_policy` records it in
``policy-record.json``, with the facets it came from) is applied to each partition when it is
restored, before any of its records is processed: the same migration as the sqlite backend's
(:mod:`gateway.policy.migration`), written through the changelog, then the partition's record.
A crash in between runs it again at the next restore (it is idempotent).

A partition under a policy that no upgrade recorded here leads to (and that this start did not
accept) stops the worker: its state would otherwise run under facets it was not written for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gateway.policy.migration import MigrationPlan, MigrationReport
from gateway.policy.upgrade import PolicyFacets, diff
from state.policy_record import (
    UNREADABLE,
    PolicyChangedError,
    PolicyRecord,
    migrate_store,
    unreadable,
)

META = "policy_facets"  # the partition store's meta entry (restored with it)


def _origin(record: PolicyRecord) -> PolicyFacets:
    """The facets a partition with entries but no record of its own is under: those the last
    upgrade to the current policy came from (recorded since partitions migrate), else the
    current ones (a state written before partitions recorded their policy)."""
    for event in reversed(record.events):
        if event.get("to") == record.facets.version and "from_facets" in event:
            return PolicyFacets.from_json(event["from_facets"])
    return record.facets


def _accepted(record: PolicyRecord, version: str) -> bool:
    """Whether the upgrades recorded lead from ``version`` to the current policy."""
    reached = {version}
    for event in record.events:
        if event.get("from") in reached:
            reached.add(str(event.get("to")))
    return record.facets.version in reached


def migrate_partitions(
    stores: Sequence[Any], record: PolicyRecord, *, accepted: bool, where: str
) -> MigrationReport | None:
    """Bring each restored partition store of ``stores`` under ``record``'s policy (see the
    module docstring). ``accepted``: this start accepts the current policy on any state
    (``--policy-upgrade VERSION``). Returns what was migrated (None: nothing needed it)."""
    current = record.facets
    report: MigrationReport | None = None
    for store in stores:
        text = store.meta(META)
        if text is not None:
            try:
                origin = PolicyFacets.from_json(json.loads(text))
            except UNREADABLE as err:
                raise unreadable(where, "a partition's policy record", err) from None
        else:
            origin = _origin(record) if store.count() else current
        if text is not None and origin.version == current.version:
            continue
        upgrade = diff(origin, current)
        plan = MigrationPlan.of(upgrade)
        if not plan.empty:
            if not (accepted or _accepted(record, origin.version)):
                raise PolicyChangedError(
                    f"policy changed: the state of {where} (from the changelog) was written "
                    f"under policy version {origin.version}, and this policy is "
                    f"{current.version}: {upgrade.summary()}. Start with --policy-upgrade "
                    f"{current.version} to migrate it, or use the policy it was written under"
                )
            part = migrate_store(store, plan, dry_run=False)
            report = report or MigrationReport()
            report.add(part)
        store.set_meta(META, json.dumps(current.to_json(), sort_keys=True))
    return report
