"""A state written under one policy, made valid under another (:mod:`gateway.policy.upgrade`).

* **re-grouping** (a raised k): every microaggregation group formed with fewer respondents
  than the new k loses its memberships — its members' current group and their stored tuples
  of it — so they are grouped again, at the new k, among the new and changed records, the next
  time they appear; nothing publishes the old tuple again. Groups formed before formation
  sizes were kept count as too small. Another quasi-identifier set or spec re-groups everyone.
* **fresh draws** (a new matrix, noise or coding spec): the attribute's stored draws are
  dropped; the next publication of each value is drawn again, under the new mechanism.

The state format this relies on (the engine's documents; registry keys and values are read
and written through :mod:`gateway.state_store.state_keys` and
:mod:`gateway.state_store.state_codec`):

* group registry rows: key ``GROUP_KEY_PREFIX + group id``, value ``{"live": n, "size": m}``
  (``size``, the formation size, absent in groups formed before it was kept; regroup and cohort
  groups carry more, which a re-formed group's row no longer needs);
* respondent documents: ``"current": [group id, quasi-identifier digest]`` (its live group
  under the deferred mode), ``"g": [group id, digests, member index]`` (under regroup and
  cohort; with ``"s"``, the release since when it is out of date),
  ``"qi": {digest: [group id, published tuple]}`` (its stored tuples),
  ``"rr": {attribute: {value digest: [published value, matrix version]}}`` and
  ``"noise": {attribute: {value digest: published value}}`` (its stored draws); anything else
  (``first_wave``, fields added later) is kept as it is.

Pure functions over (key, value) pairs: the caller reads the store (registry rows first) and
writes what comes back, in batches; running a migration twice changes nothing more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.policy.upgrade import Upgrade
from gateway.state_store.state_codec import (
    decode_state,
    encode_state,
    registry_counts,
    registry_value,
)
from gateway.state_store.state_keys import group_id, is_group_key, is_roster_head, is_roster_key

__all__ = [
    "MigrationPlan",
    "MigrationReport",
    "groups_to_drop",
    "migrate_entries",
    "panel_members",
]


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    """What a migration does: groups to re-form, attributes to draw again."""

    min_group_size: int | None = None  # groups formed with fewer members are re-formed
    regroup_all: bool = False  # every group (another quasi-identifier set or spec)
    fresh_draws: tuple[str, ...] = ()  # attributes whose stored draws are dropped

    @classmethod
    def of(cls, upgrade: Upgrade) -> MigrationPlan:
        return cls(
            min_group_size=upgrade.min_group_size,
            regroup_all=upgrade.regroup_all,
            fresh_draws=tuple(upgrade.fresh_draws),
        )

    @property
    def regroups(self) -> bool:
        return self.regroup_all or self.min_group_size is not None

    @property
    def empty(self) -> bool:
        return not self.regroups and not self.fresh_draws


@dataclass(slots=True)
class MigrationReport:
    """What a migration changed (counts only: group ids and digests are not data, but the
    report needs none of them)."""

    groups: int = 0  # registry rows seen
    groups_reformed: int = 0
    respondents: int = 0
    memberships_dropped: int = 0  # respondents whose current group was re-formed
    tuples_dropped: int = 0
    draws_dropped: dict[str, int] = field(default_factory=dict)
    # a panel's active members (its rosters' counters) and whether k rose: its cohorts are not
    # re-formed here but merged whole at the next wave, and its linked sets stay at the k its
    # history was published under (a raised k cannot grow an intersection back)
    panel_members: int = 0
    k_rose: bool = False

    def add(self, other: MigrationReport) -> None:
        self.groups += other.groups
        self.groups_reformed += other.groups_reformed
        self.respondents += other.respondents
        self.memberships_dropped += other.memberships_dropped
        self.tuples_dropped += other.tuples_dropped
        for name, n in other.draws_dropped.items():
            self.draws_dropped[name] = self.draws_dropped.get(name, 0) + n
        self.panel_members += other.panel_members
        self.k_rose = self.k_rose or other.k_rose

    def text(self) -> str:
        draws = ", ".join(f"{n} of {a}" for a, n in sorted(self.draws_dropped.items()))
        return (
            f"{self.groups_reformed} of {self.groups} groups re-formed "
            f"({self.memberships_dropped} respondents to be grouped again, "
            f"{self.tuples_dropped} stored tuples dropped); stored draws dropped: "
            f"{draws or 'none'}; {self.respondents} respondents in the state"
            + (f"; {self.panel_members} panel members" if self.panel_members else "")
            + (
                ": their cohorts below the new k merge whole at the next wave, and their "
                "linked sets stay at the k their history was published under"
                if self.panel_members and self.k_rose
                else ""
            )
        )


def panel_members(registry: Iterable[tuple[bytes, bytes]]) -> int:
    """The active members of the panel rosters among the registry rows (their heads' live
    counters)."""
    return sum(registry_counts(raw)[0] for key, raw in registry if is_roster_head(key))


# -- the migration ----------------------------------------------------------------------
def groups_to_drop(
    registry: Iterable[tuple[bytes, bytes]], plan: MigrationPlan
) -> tuple[set[str], dict[bytes, bytes], int]:
    """From the registry rows: the group ids to re-form, their rows rewritten (no live
    member left; the formation size kept), and how many groups there were."""
    dropped: set[str] = set()
    rows: dict[bytes, bytes] = {}
    seen = 0
    for key, raw in registry:
        if not is_group_key(key) or is_roster_key(key):
            continue
        seen += 1
        if not plan.regroups:
            continue
        live, size = registry_counts(raw)
        small = plan.min_group_size is not None and (size is None or size < plan.min_group_size)
        if plan.regroup_all or small:
            dropped.add(group_id(key))
            if live:
                rows[key] = registry_value(0, size)
    return dropped, rows, seen


def migrate_entries(
    entries: Iterable[tuple[bytes, bytes]], plan: MigrationPlan, dropped: set[str]
) -> tuple[dict[bytes, bytes], MigrationReport]:
    """The respondent entries of ``entries`` that change, and what changed (registry rows in
    ``entries`` are left to :func:`groups_to_drop`)."""
    out: dict[bytes, bytes] = {}
    report = MigrationReport()
    for key, raw in entries:
        if is_group_key(key):
            continue
        report.respondents += 1
        doc = decode_state(raw)
        if _migrate_respondent(doc, plan, dropped, report):
            out[key] = encode_state(doc)
    return out, report


def _migrate_respondent(
    doc: dict[str, Any], plan: MigrationPlan, dropped: set[str], report: MigrationReport
) -> bool:
    changed = False
    for field_ in ("current", "g"):  # the deferred mode's membership, the other modes'
        membership = doc.get(field_)
        if membership is not None and (plan.regroup_all or membership[0] in dropped):
            del doc[field_]
            doc.pop("s", None)  # out of date since: it is grouped afresh
            report.memberships_dropped += 1
            changed = True
    stored: Mapping[str, Any] = doc.get("qi") or {}
    gone = [d for d, (gid, _) in stored.items() if plan.regroup_all or gid in dropped]
    if gone:
        kept = {d: v for d, v in stored.items() if d not in gone}
        if kept:
            doc["qi"] = kept
        else:
            doc.pop("qi", None)
        report.tuples_dropped += len(gone)
        changed = True
    for name in plan.fresh_draws:
        for kind in ("rr", "noise"):
            by_name = doc.get(kind)
            if by_name and name in by_name:
                report.draws_dropped[name] = report.draws_dropped.get(name, 0) + len(
                    by_name.pop(name)
                )
                if not by_name:
                    del doc[kind]
                changed = True
    return changed
