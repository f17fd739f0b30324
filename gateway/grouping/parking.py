"""Waves decided when they close (``republication.pool: release``).

With one pool per release, a wave's new and changed respondents are grouped together when the
wave closes, and its returning respondents reach their groups' quorum only once their
group-mates have arrived, anywhere in the wave. Deciding every record again in each window it
waits would cost a state read, its keyed digests and its classification per window, for most of
a wave. So the engine sets a wave's records aside, undecided and unread, until the wave is due:
closed (a later wave has been seen, and no partition still sending lags behind it), one of its
records past its hold time, or the last flush. A panel's hold time is the wave's maximum
(``max_wave_seconds``), counted from its first record read, or from when its records' own
timestamps say it opened: a restart reads the open wave again, and those keep its age. The
caller keeps handing the parked records back held, first in the window, as with every held
record; the due wave is then decided in one window, with every record of it in hand.

The engine remembers what it parked — the records themselves, else their ids — so a window
reads only its new records' waves; an engine without that memory (a restart) reads them all,
to the same outcome.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gateway.engine.records import starts_with
from gateway.grouping.registry import is_wave
from gateway.grouping.release import ReleaseClock, Source, Who

# the release keys of the records at these positions
ReleasesAt = Callable[[Sequence[int]], list[str]]
# the arrival times (seconds, always known: the worker's monotonic clock), input partitions
# and event times (seconds; NaN or None: unknown) of the records at these positions
Origins = Callable[[range], tuple[Sequence[float], Sequence[Source], Sequence[float | None]]]


@dataclass(slots=True)
class Parking:
    max_hold_seconds: float
    # a panel's close grace (None: a wave is due once closed): how long the next wave's records
    # must have been arriving; ``max_hold_seconds`` is then the wave's maximum
    grace: float | None = None
    records: list[object] = field(default_factory=list)  # parked last time, in order
    rids: list[str] = field(default_factory=list)
    releases: list[str] = field(default_factory=list)
    oldest: dict[str, float] = field(default_factory=dict)  # wave -> earliest arrival parked

    def split(
        self,
        records: Sequence[object],
        origins: Origins,
        rids_at: Callable[[Sequence[int]], list[str]],
        releases_at: ReleasesAt,
        clock: ReleaseClock,
        *,
        now: float,
        flush_all: bool,
        who: Who | None = None,
        wall: float | None = None,
    ) -> list[int]:
        """The positions of the records whose wave is not due yet (records of a window
        release never wait); ``who``: the respondent ids of the records at some positions,
        for the clock's count of a new wave's respondents. ``wall``: the time now in the
        records' event time (epoch seconds): a panel wave is also due once that long past when
        its records opened it (:meth:`ReleaseClock.opened_at`) and no source still sends it
        (:meth:`ReleaseClock.drained`: a backlog of old waves is read whole first), so that a
        restart, which reads the open wave again, does not start its maximum again."""
        n = len(self.records)
        if n and starts_with(records, self.records):
            known = n  # the records parked last time come back first, as they were
        elif n and len(records) >= n and rids_at(range(n)) == self.rids:
            known = n
        else:
            known = 0
        fresh = range(known, len(records))
        releases = self.releases[:known] + releases_at(fresh)
        arrived, sources, events = origins(fresh)
        clock.see(
            releases[known:],
            sources,
            arrived,
            events if self.grace is not None else None,
            None if who is None else lambda positions: who([known + i for i in positions]),
        )
        oldest = dict(self.oldest) if known else {}
        # by column: a few distinct wave keys among many records
        fresh_releases = np.array(releases[known:], dtype=object)
        times = np.asarray(arrived, dtype=np.float64)
        of_wave = {r: fresh_releases == r for r in set(releases[known:]) if is_wave(r)}
        for r, mine in of_wave.items():
            first = float(times[mine].min())
            if first < oldest.get(r, first + 1):
                oldest[r] = first
        if flush_all:
            due = set(oldest)
        elif self.grace is not None:  # a panel: the close grace, or the wave's maximum
            hold, grace = self.max_hold_seconds, self.grace
            due = {
                r
                for r, at in oldest.items()
                if clock.beyond(int(r))  # a stray wave number: not held, not decided
                or now - at >= hold
                or (_open_for(clock, r, wall) >= hold and clock.drained(int(r), now))
                or clock.closed_after(r, now, grace)
            }
        else:
            hold = self.max_hold_seconds
            due = {r for r, at in oldest.items() if now - at >= hold or clock.closed(r, now)}
        if known and due.isdisjoint(self.oldest):
            # no wave parked last time is due: those records stay as they are, in front
            waiting = [mine for r, mine in of_wave.items() if r in oldest and r not in due]
            kept = np.logical_or.reduce(waiting) if waiting else np.zeros(len(fresh), bool)
            new = (np.flatnonzero(kept) + known).tolist()
            parked = [*range(known), *new]
            self.records.extend(records[i] for i in new)
            self.releases.extend(releases[i] for i in new)
            self.rids.extend(rids_at(new))
        else:
            parked = [i for i, r in enumerate(releases) if r in oldest and r not in due]
            self.records = [records[i] for i in parked]
            self.releases = [releases[i] for i in parked]
            # the ids of the records still parked are known: only the new ones' are built
            old = bisect.bisect_left(parked, known)  # parked positions below known
            self.rids = [self.rids[i] for i in parked[:old]] + rids_at(parked[old:])
        self.oldest = {r: at for r, at in oldest.items() if r not in due}
        return parked


def _open_for(clock: ReleaseClock, release: str, wall: float | None) -> float:
    """How long wave ``release`` has been open by its records' event times (-inf: unknown)."""
    if wall is None:
        return -math.inf
    opened = clock.opened_at(int(release))
    return -math.inf if opened is None else wall - opened
