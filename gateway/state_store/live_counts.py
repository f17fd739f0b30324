"""The audit of groups' stored live-member counts against the respondents' current groups
(``privgw state-check``); a window's view of the counts is :mod:`gateway.grouping.live_view`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gateway.state_store.state_codec import decode_state, registry_counts, registry_value
from gateway.state_store.state_keys import group_id, group_key, is_group_key, is_roster_key


@dataclass(frozen=True, slots=True)
class LiveCountAudit:
    """Each group's stored live-member count against the respondents whose current group it
    is (:func:`audit_live_counts`). Group ids are keyed digests of record ids, not data."""

    respondents: int
    groups: int
    drifted: Mapping[str, tuple[int, int]]  # group id -> (stored, actual)

    @property
    def consistent(self) -> bool:
        return not self.drifted

    sizes: Mapping[str, int] = field(default_factory=dict)  # formation sizes, where stored

    def repairs(self) -> dict[bytes, bytes]:
        """The registry entries that set every drifted count to its actual value."""
        return {
            group_key(gid): registry_value(actual, self.sizes.get(gid))
            for gid, (_, actual) in self.drifted.items()
        }


def audit_live_counts(entries: Iterable[tuple[bytes, bytes]]) -> LiveCountAudit:
    """Compare the stored live counts with the respondents' current groups, over every entry
    of a state store (a snapshot, taken with no worker writing). Counts drifted in versions
    before 2026-11-23 when a respondent left a group and was published suppressed, or joined
    two groups in one window."""
    stored: dict[str, int] = {}
    sizes: dict[str, int] = {}
    actual: dict[str, int] = {}
    respondents = 0
    for key, raw in entries:
        if is_roster_key(key):
            continue  # a panel's roster, not a group
        if is_group_key(key):
            gid = group_id(key)
            stored[gid], size = registry_counts(raw)
            if size is not None:
                sizes[gid] = size
            continue
        respondents += 1
        doc = decode_state(raw)
        current = doc.get("g") or doc.get("current")  # regroup/cohort, else deferred
        if current:
            actual[current[0]] = actual.get(current[0], 0) + 1
    groups = stored.keys() | actual.keys()
    drifted = {
        gid: (stored.get(gid, 0), actual.get(gid, 0))
        for gid in sorted(groups)
        if stored.get(gid, 0) != actual.get(gid, 0)
    }
    return LiveCountAudit(respondents=respondents, groups=len(groups), drifted=drifted, sizes=sizes)
