"""The working state of one window's republication decision, and the window's inputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.grouping.decision import QIDecision
from gateway.grouping.registry import Group

# what a record published (gateway.grouping.replay): (group, the release that set the group's
# tuple), or None when its quasi-identifiers were suppressed
Outcome = tuple[str, str] | None


@dataclass(frozen=True, slots=True)
class WindowQI:
    """A window's quasi-identifier inputs, one entry per record."""

    rids: Sequence[str]
    keys: Sequence[bytes | None]  # respondent state keys (None: no respondent id)
    cols: Sequence[Sequence[object]]  # the k claim's inputs, one list per attribute
    complete: Sequence[bool]  # every claim value present
    digests: Sequence[str]  # keyed digest of the claim tuple
    categories: Sequence[str]  # keyed digest of its categorical part
    releases: Sequence[str]
    scopes: Sequence[int | None]  # groups never span scopes (input partitions)
    expired: Sequence[bool]  # hold time over (or the last flush)
    closed: Sequence[bool]  # the record's release is closed
    strata: Sequence[str] | None = None  # keyed digest of each record's stratum (None: none)
    sensitive: Sequence[bytes] | None = None  # digest of its published l-diversity value


@dataclass(slots=True)
class WindowWork:
    """Working state of one decision (:class:`gateway.grouping.republish.Republisher`)."""

    w: WindowQI
    states: dict[bytes, dict[str, Any]]
    touched: set[bytes]
    groups: dict[str, Group]
    decision: QIDecision = field(default_factory=QIDecision)
    # i -> its state's g: group, digests of the values its tuple was formed from (whole tuple,
    # categories), member index
    member: dict[int, tuple[str, str, int, str]] = field(default_factory=dict)
    leaving: set[int] = field(default_factory=set)  # members that leave if they find a group
    pool: list[int] = field(default_factory=list)
    # (group, release) -> its class there once the window published in it: (publishers,
    # distinct published l-diversity values); taken at publication, since a group can move on
    # to a later release in the same window without publishing in it
    published_groups: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    stale: dict[int, int] = field(default_factory=dict)  # i -> releases its tuple is behind
    recompute: dict[str, list[int]] = field(default_factory=dict)  # group -> its publishers
    emitted: dict[int, str] = field(default_factory=dict)  # i -> its tuple's tuple_release
    # i -> what its record published before a crash (gateway.grouping.replay)
    replayed: dict[int, Outcome] = field(default_factory=dict)

    def enter(self, i: int, st: dict[str, Any] | None) -> None:
        """Record ``i`` (its respondent's first here) returns to its group or joins the pool."""
        g = st.get("g") if st is not None else None
        if g is None:
            self.pool.append(i)  # new (or kept by the deferred mode: grouped afresh)
        else:
            # states written before categories were digested apart: any change moves
            self.member[i] = (str(g[0]), str(g[1]), int(g[2]), str(g[3]) if len(g) > 3 else "")
