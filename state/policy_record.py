"""The policy a state was written under, and policy upgrades on a state (issue 30, item 2).

Each state file of the sqlite backend (one per engine shard) records, in its ``privgw_meta``
table, the :class:`~gateway.policy.upgrade.PolicyFacets` of the policy it was written under
and the upgrades applied to it (``PolicyRecord``); the partitioned backend keeps the record in
``policy-record.json`` in the state directory. :func:`check_policy` runs before the engine
opens the state:

* a new state records the policy; a state written before records existed adopts it;
* the same facets (the version may differ: windows, topics, thresholds) run as they are;
* other facets stop the start with one line naming each change and its class, unless the
  operator accepts this very policy version (``--policy-upgrade VERSION``, or
  ``privgw state migrate``): then the state is migrated (:mod:`gateway.policy.migration`) and
  the upgrade recorded — an event counted by ``privgw_policy_upgrades_total{action}`` across
  restarts and announced on the metadata topic.

A migration marks the record "migrating to" the new version first and clears the mark last;
an interrupted one is run again by the same command (it is idempotent) and any other start is
refused meanwhile. The partitioned backend's state lives in its changelog topic: there the
upgrade is recorded (with the facets it comes from) and each partition is migrated as it is
restored (:mod:`state.partition_policy`).
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gateway.errors import PrivgwError
from gateway.mechanisms.rr_constructions import from_spec
from gateway.panel.roster import drop_roster_draws
from gateway.policy import Policy
from gateway.policy.migration import (
    MigrationPlan,
    MigrationReport,
    groups_to_drop,
    migrate_entries,
    panel_members,
)
from gateway.policy.upgrade import PolicyFacets, Upgrade, UpgradeAction, diff, facets
from gateway.state_store.state_keys import is_group_key, is_roster_head
from state.errors import StateStoreError
from state.failures import StateCondition, StateDirError, fix_for, sqlite_error
from state.layout import (
    PARTITIONED_RECORD,
    PARTITIONS_DIR,
    Backend,
    resolve_backend,
    resolve_shards,
    shard_paths,
)
from state.sqlite_store import SQLiteStore

log = logging.getLogger(__name__)

RECORD = "policy"  # privgw_meta name (sqlite)
RECORD_FILE = PARTITIONED_RECORD
_BATCH = 5000


class PolicyChangedError(PrivgwError):
    """The policy differs from the one the state was written under (one line: the changes)."""


# what parsing a damaged record (truncated, emptied, edited JSON) raises
UNREADABLE = (ValueError, KeyError, TypeError, AttributeError)


def unreadable(where: Path | str, what: str, err: Exception) -> StateDirError:
    """One line for a damaged policy record: where it lies, and the fix."""
    return StateDirError(
        f"{where}: {what} cannot be read ({err.__class__.__name__}): "
        f"{fix_for(StateCondition.CORRUPT)}",
        StateCondition.CORRUPT,
    )


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    facets: PolicyFacets
    events: tuple[dict[str, Any], ...] = ()  # upgrades applied, oldest first
    migrating_to: str | None = None

    def to_text(self) -> str:
        return json.dumps(
            {
                "facets": self.facets.to_json(),
                "events": list(self.events),
                "migrating_to": self.migrating_to,
            },
            sort_keys=True,
        )

    @classmethod
    def from_text(cls, text: str, where: Path | str = "the state directory") -> PolicyRecord:
        """The record as written; a damaged one (truncated, emptied, edited) is one line that
        names where it lies and the fix, not an internal error."""
        try:
            doc = json.loads(text)
            return cls(
                facets=PolicyFacets.from_json(doc["facets"]),
                events=tuple(doc.get("events", ())),
                migrating_to=doc.get("migrating_to"),
            )
        except UNREADABLE as err:
            raise unreadable(where, "the policy record", err) from None

    def counts(self) -> dict[str, int]:
        """Upgrades applied to this state, by action (each upgrade counts once per action)."""
        out = {a.value: 0 for a in UpgradeAction}
        for event in self.events:
            for action in set(event.get("actions", ())):
                out[action] = out.get(action, 0) + 1
        return out


class Outcome(enum.StrEnum):
    NEW = "new"  # no state yet: the policy recorded
    ADOPTED = "adopted"  # state written before policy records: the policy recorded
    SAME = "same"
    VERSION_ONLY = "version_only"  # another version, the same facets
    UPGRADED = "upgraded"


@dataclass(frozen=True, slots=True)
class PolicyCheck:
    outcome: Outcome
    record: PolicyRecord
    upgrade: Upgrade | None = None
    report: MigrationReport | None = None
    previous_version: str | None = None

    def announcement(self) -> dict[str, object]:
        """What the metadata topic carries about this state's policy upgrades (none: {})."""
        events = [{k: v for k, v in e.items() if k != "from_facets"} for e in self.record.events]
        return {"policy_upgrades": events} if events else {}


def policy_facets(policy: Policy) -> PolicyFacets:
    """The facets of ``policy``; each randomized attribute's mechanism as the digest of its
    published form (matrix, categories, mode: what the metadata topic carries)."""
    versions = {}
    for name in policy.randomized:
        spec = from_spec(policy.attributes[name], None).to_dict()
        text = json.dumps(spec, sort_keys=True, default=str).encode()
        versions[name] = hashlib.sha256(text).hexdigest()[:16]
    return facets(policy, versions)


# -- where records live -----------------------------------------------------------------------
class _Records:
    """The state's records: one per sqlite file, or the partitioned backend's file.
    ``backend``: the one the caller runs (refused unless it is the directory's), None: the
    directory's own."""

    def __init__(self, state_dir: Path, backend: str | None, shards: int | None) -> None:
        self.state_dir = Path(state_dir)
        self.backend = resolve_backend(self.state_dir, backend)
        self.partitioned = self.backend is Backend.PARTITIONED
        self.paths = (
            [] if self.partitioned else shard_paths(state_dir, resolve_shards(state_dir, shards))
        )

    def stores(self) -> Iterator[SQLiteStore]:
        """Each sqlite file in turn (each holds an exclusive lock while it is open)."""
        for path in self.paths:
            with SQLiteStore(path) as store:
                yield store

    def read(self) -> tuple[list[PolicyRecord | None], bool]:
        """(the record of each part, whether the state holds anything)."""
        if self.partitioned:
            file = self.state_dir / RECORD_FILE
            rec = PolicyRecord.from_text(_text_of(file), file) if file.is_file() else None
            local = self.state_dir / PARTITIONS_DIR
            data = local.is_dir() and any(local.iterdir())
            return [rec], data
        records: list[PolicyRecord | None] = []
        data = False
        for path in self.paths:  # read without the store's key scan: most starts only read
            text, rows = _peek(path)
            records.append(None if text is None else PolicyRecord.from_text(text, path))
            data = data or rows
        return records, data

    def write(self, record: PolicyRecord) -> None:
        if self.partitioned:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            file = self.state_dir / RECORD_FILE
            tmp = file.with_name(file.name + ".tmp")
            tmp.write_text(record.to_text())
            os.replace(tmp, file)
            return
        for store in self.stores():
            store.set_meta(RECORD, record.to_text())

    def migrate(self, plan: MigrationPlan, *, dry_run: bool) -> MigrationReport:
        report = MigrationReport()
        for store in self.stores():
            report.add(migrate_store(store, plan, dry_run=dry_run))
        return report


def peek_meta(state_dir: Path, name: str) -> list[tuple[str | None, bool]]:
    """Per sqlite state file of ``state_dir``: (its meta entry ``name``, whether it holds
    entries), read without writing anything ([] for a new state or the partitioned backend,
    whose partitions are checked as they are restored)."""
    if resolve_backend(state_dir, None) is not Backend.SQLITE:
        return []
    return [_peek(path, name) for path in shard_paths(state_dir, resolve_shards(state_dir, None))]


def _peek(path: Path, name: str = RECORD) -> tuple[str | None, bool]:
    """(the meta entry ``name``: the policy record, whether any entry exists) of a sqlite
    state file, read through a plain connection: opening the store would read every key
    (0.6 s a million), and would create a missing file."""
    if not path.is_file():
        return None, False
    try:
        con = sqlite3.connect(path, timeout=0.0)
    except sqlite3.Error as exc:
        raise sqlite_error(exc, path, "reading its policy record") from None
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        text = None
        if "privgw_meta" in tables:
            row = con.execute("SELECT value FROM privgw_meta WHERE name = ?", (name,)).fetchone()
            text = None if row is None else str(row[0])
        data = "state" in tables and con.execute("SELECT 1 FROM state LIMIT 1").fetchone()
        return text, bool(data)
    except sqlite3.Error as exc:
        if "locked" in str(exc):
            raise StateStoreError(
                f"state store {path} is in use by another process (only one worker may open it)"
            ) from None
        raise sqlite_error(exc, path, "reading its policy record") from None
    finally:
        con.close()


def _chunks(keys: Sequence[bytes]) -> Iterator[Sequence[bytes]]:
    for start in range(0, len(keys), _BATCH):
        yield keys[start : start + _BATCH]


def migrate_store(store: Any, plan: MigrationPlan, *, dry_run: bool) -> MigrationReport:
    """Registry rows first (which groups go), then the respondents in batches (a sqlite file,
    or a partition's store: ``keys``, ``get_many``, ``put_many``)."""
    keys = store.keys()
    registry: list[tuple[bytes, bytes]] = []
    for chunk in _chunks([k for k in keys if is_group_key(k)]):
        registry += store.get_many(chunk).items()
    dropped, rows, seen = groups_to_drop(registry, plan)
    report = MigrationReport(groups=seen, groups_reformed=len(dropped))
    report.panel_members = panel_members(registry)
    report.k_rose = plan.min_group_size is not None
    for chunk in _chunks([k for k in keys if not is_group_key(k)]):
        changed, part = migrate_entries(store.get_many(chunk).items(), plan, dropped)
        report.add(part)
        if changed and not dry_run:
            store.put_many(changed)
    if rows and not dry_run:
        store.put_many(rows)
    for key in [k for k in keys if is_roster_head(k)] if plan.fresh_draws else []:
        # a panel keeps its members' draws with its roster (gateway.panel.draws)
        entries, gone = drop_roster_draws(store.get_many, key, plan.fresh_draws)
        for name, n in gone.items():
            report.draws_dropped[name] = report.draws_dropped.get(name, 0) + n
        if entries and not dry_run:
            store.put_many(entries)
    return report


# -- the check ----------------------------------------------------------------------------------
def upgrade_for(
    state_dir: Path, backend: str | None, shards: int | None, policy: Policy
) -> Upgrade | None:
    """The upgrade from the state's recorded policy to ``policy`` (None: nothing recorded)."""
    records, _ = _Records(state_dir, backend, shards).read()
    known = [r for r in records if r is not None]
    return diff(known[0].facets, policy_facets(policy)) if known else None


def _upgrade_event(upgrade: Upgrade, report: MigrationReport) -> dict[str, Any]:
    """The record's entry for a completed migration."""
    return {
        "from": upgrade.old.version,
        "to": upgrade.new.version,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "actions": sorted({c.action.value for c in upgrade.changes}),
        "changes": [c.text() for c in upgrade.changes],
        "fresh_draws": upgrade.fresh_draws,
        "groups_reformed": report.groups_reformed,
        "respondents_regrouped": report.memberships_dropped,
    }


def check_policy(
    state_dir: Path,
    backend: str | None,
    shards: int | None,
    policy: Policy,
    *,
    accept: str | None,
    dry_run: bool = False,
    measure: bool = True,
    command: str = "--policy-upgrade",
) -> PolicyCheck:
    """Compare ``policy`` with the state's record (module docstring); migrate when ``accept``
    names ``policy``'s version. Raises :class:`PolicyChangedError` (one line) otherwise.
    ``dry_run``: nothing written (``measure`` False: nor the migration's report counted)."""
    parts = _Records(state_dir, backend, shards)
    records, data = parts.read()
    new = policy_facets(policy)
    known = [r for r in records if r is not None]
    if not known:
        record = PolicyRecord(new)
        if not dry_run:
            parts.write(record)
        return PolicyCheck(Outcome.ADOPTED if data else Outcome.NEW, record)
    rec = known[0]
    if len({r.to_text() for r in known}) > 1 or len(known) != len(records):
        raise PolicyChangedError(
            f"the state files in {state_dir} record different policies: restore them from "
            "one backup, or start from a new state directory"
        )
    if rec.migrating_to is not None and rec.migrating_to != new.version:
        raise PolicyChangedError(
            f"the state in {state_dir} was being migrated to policy version {rec.migrating_to} "
            f"when the migration stopped; this policy is {new.version}. Finish it with that "
            f"policy ({command} {rec.migrating_to}, or `privgw state migrate`), or restore the "
            "state from its backup"
        )
    if rec.migrating_to is None and rec.facets.version == new.version:
        return PolicyCheck(Outcome.SAME, rec)
    upgrade = diff(rec.facets, new)
    if upgrade.same and rec.migrating_to is None:
        record = replace(rec, facets=new)
        if not dry_run:
            parts.write(record)
        return PolicyCheck(Outcome.VERSION_ONLY, record, upgrade, None, rec.facets.version)
    where = f"the state in {state_dir}"
    if accept is None:
        raise PolicyChangedError(
            f"policy changed: {where} was written under policy {_name(rec.facets)} and this "
            f"policy is {_name(new)}: {upgrade.summary()}. Review `privgw policy diff "
            f"--state-dir {state_dir} --policy POLICY`, then start with --policy-upgrade "
            f"{new.version} (or run `privgw state migrate`), or use the policy the state was "
            "written under"
        )
    if accept != new.version:
        raise PolicyChangedError(
            f"{command} accepts policy version {accept}, but this policy is {new.version}: "
            "review the changes (`privgw policy diff`) and name the version you accept"
        )
    plan = MigrationPlan.of(upgrade)
    if parts.partitioned:
        # its state is in the changelog: each partition migrates as it is restored
        # (state.partition_policy), from the facets this event records
        report = MigrationReport()
        event = {**_upgrade_event(upgrade, report), "from_facets": rec.facets.to_json()}
        record = PolicyRecord(new, (*rec.events, event))
        if not dry_run:
            parts.write(record)
        return PolicyCheck(Outcome.UPGRADED, record, upgrade, report, rec.facets.version)
    if dry_run:
        report = parts.migrate(plan, dry_run=True) if measure else MigrationReport()
        return PolicyCheck(Outcome.UPGRADED, rec, upgrade, report, rec.facets.version)
    parts.write(replace(rec, migrating_to=new.version))
    report = parts.migrate(plan, dry_run=False)
    record = PolicyRecord(new, (*rec.events, _upgrade_event(upgrade, report)))
    parts.write(record)
    return PolicyCheck(Outcome.UPGRADED, record, upgrade, report, rec.facets.version)


def _name(f: PolicyFacets) -> str:
    return f"{f.name or 'unnamed'} version {f.version}"


def _text_of(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return ""  # read as a damaged record (from_text names the file)
