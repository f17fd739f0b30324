"""What a release is, and when one is closed.

With ``republication.wave_attribute`` a release is a wave: the records carrying the same wave
number, over as many windows as they take to arrive, and per-release k is counted over all of
them. Without it (or for a record that carries no wave) every output window is a release of its
own. A wave is *closed* once a later wave has been seen (k distinct respondents of it) and no
input partition still sending lags behind it (a watermark on the wave number, per partition:
ReleaseClock): records still waiting for their group's quorum in it stop waiting.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from gateway.grouping.registry import is_wave


def release_keys(waves: Sequence[object], window: Callable[[], str]) -> list[str]:
    """Each record's release key: its wave number as text, else ``w`` + the window's id
    (``window`` gives it; asked only when a record has no wave)."""
    memo: dict[object, str] = {}  # a window repeats a few wave numbers
    missing = ""
    out: list[str] = []
    for v in waves:
        if v in memo:
            out.append(memo[v])
            continue
        finite = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        key = memo[v] = str(int(v)) if finite else missing  # type: ignore[call-overload]
        out.append(key)
    if missing in memo.values():
        fallback = "w" + window()
        return [key or fallback for key in out]
    return out


# where a record came from, for the release clock: (topic, partition), or None
Source = tuple[str, int] | None
# the respondent ids (None: unknown) of the records at these positions
Who = Callable[[Sequence[int]], Sequence[object]]


def _ids_at(positions: list[int], who: Who | None, chunk: int) -> Iterator[tuple[int, object]]:
    """(position, respondent id) of each record at ``positions``, asked of ``who`` a chunk at
    a time (a wave's first records usually suffice); None where unknown."""
    for start in range(0, len(positions), chunk):
        part = positions[start : start + chunk]
        yield from zip(part, [None] * len(part) if who is None else who(part), strict=True)


def _ends(
    times: NDArray[np.float64], kept: NDArray[np.float64] | None, low: int, high: int
) -> NDArray[np.float64]:
    """``times`` and the ``kept`` ones, ascending, of which only the ``low`` smallest and the
    ``high`` largest stay: all a k-th earliest or latest needs, however many arrive."""
    both = np.sort(times if kept is None else np.concatenate([kept, times]))
    if len(both) > low + high:
        both = np.concatenate([both[:low], both[len(both) - high :]])
    return both


@dataclass(slots=True)
class ReleaseClock:
    """The newest wave an engine has seen, and each input source's (kept in memory: after a
    restart, hold time bounds the wait until a later wave is seen again; a panel wave's
    maximum also counts from its records' own timestamps, which the restart reads again).

    A wave is closed once a later wave has been seen and no source that is still sending lags
    behind it: every source either has shown a later wave too, or has sent nothing for
    ``quiet_after`` seconds. One watermark over all sources would close a wave as soon as any
    partition moved on; when partitions advance unevenly (a backfill, a consumer that lags on
    one partition), the others' records of that wave would all come late.

    A wave counts as seen once ``min_records`` distinct respondents of it have been (the
    engine's k): one record with a mistyped wave number, or a few test records, would otherwise
    close every wave before it as soon as the sources paused for ``quiet_after`` seconds, and a
    panel would impute the members still to answer."""

    quiet_after: float = 0.0
    min_records: int = 1
    # a panel's republication.max_wave_step: a wave further ahead of the newest wave read
    # within that step of the first (``reach``) is never seen (a stray wave number closes no
    # wave), and is due at once (:meth:`beyond`); a wave with few or no records of its own
    # still extends the reach, so a small wave does not strand the next
    max_step: int | None = None
    reach: int | None = None
    newest: int | None = None  # the newest wave seen
    # source -> when its last record arrived, and the waves it has shown
    sources: dict[Source, float] = field(default_factory=dict)
    shown: dict[Source, set[int]] = field(default_factory=dict)
    # source -> when the caller first said it reads it (see ``own``)
    owned: dict[Source, float] = field(default_factory=dict)
    # wave -> (first arrival, the min_records earliest and latest known event times, seconds,
    # ascending) of its records since it was seen: a panel's close grace, how long the next
    # wave has been arriving (:meth:`event_span`)
    arrivals: dict[int, tuple[float, tuple[float, ...]]] = field(default_factory=dict)
    # the waves seen, and the respondents of the others so far (fewer than min_records each)
    seen: set[int] = field(default_factory=set)
    pending: dict[int, set[object]] = field(default_factory=dict)
    # the newest wave an operator closed (``privgw wave close N``): it and every earlier wave
    # are closed whatever the sources show
    closed_through: int | None = None
    # wave -> the min_records earliest event times of its records (seconds, ascending): when it
    # opened by its records' own timestamps, which a restart that reads it again keeps
    earliest: dict[int, NDArray[np.float64]] = field(default_factory=dict)

    def own(self, sources: Iterable[Source], now: float) -> None:
        """Sources the caller reads (the worker's partitions), also those that sent nothing
        yet: until they have, or for ``quiet_after`` seconds, a silent one may hold any wave's
        records. Only sources of a topic records came from count (a worker that re-keys also
        reads an input topic whose records never reach the engine)."""
        owned = self.owned
        for source in sources:
            if source not in owned:
                owned[source] = now

    def see(
        self,
        keys: Sequence[str],
        sources: Sequence[Source] | None = None,
        arrived: Sequence[float] | None = None,
        events: Sequence[float | None] | None = None,
        who: Who | None = None,
    ) -> None:
        """The release keys of records; with their sources and arrival times, each source's
        progress too; with their event times (seconds, None: unknown), how long each wave has
        been arriving; with ``who`` (the respondent ids of the records at some positions),
        who counts towards ``min_records`` (without it every record counts, and a record
        handed back again counts twice)."""
        # by column: a window has a few distinct keys and sources, and many records
        codes, distinct = pd.factorize(pd.Series(keys, dtype=object), use_na_sentinel=False)
        wave_at = np.array([int(k) if is_wave(k) else -1 for k in distinct], dtype=np.int64)
        if not (wave_at >= 0).any():
            return
        waves = wave_at[codes]
        since = self._count(waves, who)
        if sources is None or arrived is None:
            return
        valid = waves >= 0
        at = np.asarray(arrived, dtype=np.float64)
        if events is not None:
            ev = pd.Series(cast(Any, events), dtype=np.float64).to_numpy()  # None: NaN
            self._earliest(waves[valid], ev[valid])
            arriving = valid.copy()  # a wave arrives from the record that made it seen
            for wave, first in since.items():
                arriving[:first] &= waves[:first] != wave
            self._arrivals(waves[arriving], at[arriving], ev[arriving])
        picked = np.flatnonzero(valid)
        mine = pd.Series(cast(Any, sources), dtype=object).iloc[picked]
        src_codes, uniques = pd.factorize(mine, use_na_sentinel=False)
        src = [s if isinstance(s, tuple) else None for s in uniques]  # factorize makes None NaN
        last = np.full(len(src), -np.inf)
        np.maximum.at(last, src_codes, at[valid])
        known, shown = self.sources, self.shown
        for source, when in zip(src, last.tolist(), strict=True):
            seen = known.get(source)
            known[source] = when if seen is None else max(when, seen)
        pairs = np.unique(np.stack([src_codes.astype(np.int64), waves[valid]]), axis=1)
        for code, wave in pairs.T.tolist():
            shown.setdefault(src[code], set()).add(wave)

    def _earliest(self, waves: NDArray[np.int64], events: NDArray[np.float64]) -> None:
        keep, known = self.min_records, ~np.isnan(events)
        for wave in np.unique(waves[known]).tolist():
            times = events[known & (waves == wave)]
            self.earliest[wave] = _ends(times, self.earliest.get(wave), keep, 0)

    def opened_at(self, wave: int) -> float | None:
        """When ``wave`` opened by its records' own event times: the ``min_records``-th
        earliest (fewer records with a clock far behind cannot date it back), None until
        that many are known. A restart reads its records again, and the same times."""
        times = self.earliest.get(wave)
        if times is None or len(times) < self.min_records:
            return None
        return float(times[self.min_records - 1])

    def _count(self, waves: NDArray[np.int64], who: Who | None) -> dict[int, int]:
        """Count the respondents of waves not seen yet; those reaching ``min_records`` are
        seen from then on: wave -> the position of the record that made it."""
        need, since = self.min_records, {}
        for wave in np.unique(waves[waves >= 0]).tolist():
            if self.beyond(wave):
                continue
            if self.reach is None or wave > self.reach:
                self.reach = wave
            if wave in self.seen:
                continue
            ids = self.pending.setdefault(wave, set())
            for at, rid in _ids_at(np.flatnonzero(waves == wave).tolist(), who, 4 * need):
                ids.add(object() if rid is None else rid)  # no id: a respondent of its own
                if len(ids) >= need:
                    since[wave] = at
                    break
            if wave in since:
                self.seen.add(wave)
                del self.pending[wave]
                if self.newest is None or wave > self.newest:
                    self.newest = wave
        return since

    def beyond(self, wave: int) -> bool:
        """Whether ``wave`` is more than ``max_step`` ahead of the reach."""
        step, reach = self.max_step, self.reach
        return step is not None and reach is not None and wave > reach + step

    def _arrivals(
        self, waves: NDArray[np.int64], arrived: NDArray[np.float64], events: NDArray[np.float64]
    ) -> None:
        spans, seen_waves, keep = self.arrivals, self.seen, self.min_records
        for wave in np.unique(waves).tolist():
            if wave not in seen_waves:  # not arriving yet: fewer than min_records
                continue
            mine = waves == wave
            # an unknown event time stays out: the worker's clock is no event time (a record
            # without one beside stamped ones made the span decades long, and skipped the grace)
            times = events[mine][~np.isnan(events[mine])]
            first = float(arrived[mine].min())
            seen = spans.get(wave)
            if seen is not None:
                first = min(first, seen[0])
            kept = None if seen is None else np.asarray(seen[1], dtype=np.float64)
            spans[wave] = (first, tuple(_ends(times, kept, keep, keep).tolist()))

    def event_span(self, wave: int) -> float:
        """How long ``wave`` has been arriving by its records' own event times: from its
        ``min_records``-th earliest to its ``min_records``-th latest (fewer records with a clock
        far off cannot stretch it), -inf until that many are known."""
        entry = self.arrivals.get(wave)
        keep = self.min_records
        if entry is None or len(entry[1]) < keep:
            return -math.inf
        return entry[1][-keep] - entry[1][keep - 1]

    def close_through(self, wave: int) -> None:
        """An operator closed ``wave``, and with it every earlier one (waves close in order)."""
        if self.closed_through is None or wave > self.closed_through:
            self.closed_through = wave

    def _operator_closed(self, key: str) -> bool:
        through = self.closed_through
        return through is not None and is_wave(key) and int(key) <= through

    def closed_after(self, key: str, now: float, grace: float) -> bool:
        """Whether wave ``key`` is :meth:`closed` and a later wave's records have been arriving
        for ``grace`` seconds, by the worker's clock or by their own event times (a backlog
        read at once spans its waves' real days: each closes as soon as it is read), or an
        operator closed it."""
        if self._operator_closed(key):
            return True
        if not self.closed(key, now):
            return False
        if grace <= 0:
            return True
        wave = int(key)
        for later, (first, _) in self.arrivals.items():
            if later > wave and (now - first >= grace or self.event_span(later) >= grace):
                return True
        return False

    def closed(self, key: str, now: float | None = None) -> bool:
        """Whether release ``key`` is a wave older than the newest one seen, that no source
        still sending (its last record less than ``quiet_after`` before ``now``) lags behind.
        ``now`` None: the newest wave alone decides. A wave an operator closed is closed."""
        if self._operator_closed(key):
            return True
        if self.newest is None or not key.lstrip("-").isdigit() or int(key) >= self.newest:
            return False
        return True if now is None else self.drained(int(key), now)

    def drained(self, wave: int, now: float) -> bool:
        """Whether no source still sending may hold more of ``wave``: each has shown a later
        wave, or has sent nothing for ``quiet_after`` seconds (one owned but not heard from
        yet only once that long after it was owned)."""
        quiet = self.quiet_after
        known, shown, seen = self.sources, self.shown, self.seen
        topics = {source[0] for source in known if source is not None}  # records came from
        silent = (  # owned, not heard from so far: its first record may still be this wave
            now - since < quiet
            for source, since in self.owned.items()
            if source not in known and source is not None and source[0] in topics
        )
        if any(silent):
            return False
        return all(
            now - last >= quiet or any(w > wave and w in seen for w in shown.get(source, ()))
            for source, last in known.items()
        )


def release_order(release: str) -> tuple[int, int]:
    """Waves by number first, window releases after them."""
    if is_wave(release):
        return (0, int(release))
    return (1, 0)


def pool_order(
    item: tuple[tuple[int | None, str, str], list[int]],
) -> tuple[int, int, str, int, int]:
    """A pool's place among a window's pools: scoped ones by scope, then by stratum, then
    oldest release first."""
    (scope, stratum, release), _ = item
    return (scope is None, scope or 0, stratum, *release_order(release))
