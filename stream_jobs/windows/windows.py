"""Our windows: when to flush, which records are held, which offsets may be committed.

Pure bookkeeping (no Kafka, no asyncio), driven by the worker:

- ``add(record)`` for every valid record (``add_partition_batch`` for a run of them from one
  partition), ``consumed(topic, partition, offset)`` for every consumed record (valid or
  dead-lettered);
- ``due(now, quiet=...)`` says whether (and why) to flush now: ``max_records`` new records, a
  window open for ``max_seconds``, new records and an input drained (``quiet``: the last fetch
  found nothing) and quiet for ``max_idle_seconds``, or a held record reaching
  ``max_hold_seconds`` (only when the policy suppresses on timeout: with ``hold`` it would be
  held again). A panel's held records are its open waves, which the hold timeout never decides
  (``PanelWaves``): they are due again at the oldest one's wave maximum, or once the input has
  been quiet for the close grace (``wave``). A held deadline the engine has already seen pass
  with the records it handed back held is not due again. ``deadline(now)`` is when ``due``
  turns true without new input — the worker's timer;
- ``take()`` hands out the held + new records and snapshots the consumed positions;
  ``complete(flush, held)`` records what the engine still holds and returns the offsets that
  may now be committed (after the outputs are acknowledged): per partition, the smallest
  offset still held, else the next offset after the last record taken; ``decided()`` says up
  to where the records are decided (published, dead-lettered or held), whatever is committed;
- ``forget(partitions)`` on revocation: their held records are handed over uncommitted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gateway.engine.records import ValidRecord
from gateway.policy import HoldTimeout, Policy, RepublicationMode, WindowSpec

TP = tuple[str, int]  # (topic, partition)


class FlushReason(StrEnum):
    COUNT = "count"
    TIME = "time"
    IDLE = "idle"
    HOLD_TIMEOUT = "hold_timeout"
    WAVE = "wave"  # a panel's held wave may be due: its maximum, or its close grace passed
    REVOKE = "revoke"
    SHUTDOWN = "shutdown"


@dataclass(slots=True)
class Flush:
    """One window handed to the engine."""

    records: list[ValidRecord]
    new: int
    positions: dict[TP, int]  # next offset per partition when the window was taken
    reason: FlushReason
    taken_at: float | None = None  # the worker's clock when taken (None: not said)


@dataclass(frozen=True, slots=True)
class PanelWaves:
    """A panel policy's held records: its open waves, set aside by the engine until one
    closes, by its close grace (the next wave arriving for ``grace`` seconds) or its maximum
    (``max_wave`` seconds after its first record), never by ``window.max_hold_seconds``
    (docs/consistency.md)."""

    max_wave: float
    grace: float
    k: int = 1  # a wave opened at its k-th earliest record's own timestamp

    @classmethod
    def of(cls, policy: Policy) -> PanelWaves | None:
        rep = policy.republication
        if rep.mode is not RepublicationMode.PANEL or rep.wave_attribute is None:
            return None
        return cls(rep.max_wave, rep.close_grace, policy.microaggregation.k)


@dataclass(slots=True)
class WindowBuffer:
    spec: WindowSpec
    panel: PanelWaves | None = None  # a panel policy: held records are open waves
    new: list[ValidRecord] = field(default_factory=list)
    held: list[ValidRecord] = field(default_factory=list)
    opened_at: float | None = None  # first record consumed since the last flush
    last_input: float | None = None  # last record consumed
    _positions: dict[TP, int] = field(default_factory=dict)
    _committed: dict[TP, int] = field(default_factory=dict)
    _first: dict[TP, int] = field(default_factory=dict)  # first offset consumed (this run)
    _decided: dict[TP, int] = field(default_factory=dict)  # next offset after a window's last
    # the earliest arrival among the held records, and when the engine last saw them (the
    # time its window was taken): a held deadline it saw pass is not due again
    _oldest_held: float | None = None
    _held_seen: float | None = None
    # a panel's held records: when their wave's maximum passes by their own timestamps (the
    # worker's clock), and the wall clock's offset from it (the engine's last window)
    _event_due: float | None = None
    _wall_offset: float | None = None

    @classmethod
    def for_policy(cls, policy: Policy) -> WindowBuffer:
        return cls(policy.window, panel=PanelWaves.of(policy))

    # -- input --------------------------------------------------------------------------
    def consumed(self, topic: str, partition: int, offset: int, now: float) -> None:
        """Any consumed record, valid or dead-lettered: its offset is covered by the next
        flush, which is due ``max_seconds`` after the first such record at the latest."""
        tp = (topic, partition)
        self.last_input = now
        self._first.setdefault(tp, offset)
        if offset + 1 > self._positions.get(tp, -1):
            self._positions[tp] = offset + 1
        if self.opened_at is None:
            self.opened_at = now

    def add(self, record: ValidRecord) -> None:
        self.add_partition_batch((record,))

    def add_partition_batch(self, records: Sequence[ValidRecord]) -> None:
        """``add`` for consecutive valid records of one partition, offsets increasing (what the
        worker validated of one fetched batch): one position update instead of one each."""
        if not records:
            return
        self.new.extend(records)
        last, first = records[-1].source, records[0].source
        if first is not None:
            self._first.setdefault(first.topic_partition, first.offset)
        if last is not None:
            self.consumed(last.topic, last.partition, last.offset, records[0].arrived_at)
        elif self.opened_at is None:
            self.opened_at = records[0].arrived_at

    # -- when ---------------------------------------------------------------------------
    def _idle_at(self) -> float | None:
        """When new records close the window if no more come (``max_idle_seconds``)."""
        idle = self.spec.max_idle_seconds
        if idle is None or not self.new or self.last_input is None:
            return None
        return self.last_input + idle

    def _held_at(self) -> tuple[float, FlushReason] | None:
        """When the held records are due again without new records, and why (None: never).
        A panel's open waves: at the oldest one's maximum, or once the input has been quiet
        for the close grace (a later wave's grace and every partition's quiet have passed
        then); anything else at the oldest one's hold time, when the policy suppresses then.
        A time the engine already saw pass with these records held is no deadline."""
        oldest = self._oldest_held
        if oldest is None:
            return None
        panel, seen = self.panel, self._held_seen
        times: list[tuple[float, FlushReason]] = []
        if panel is not None:
            times.append((oldest + panel.max_wave, FlushReason.WAVE))
            if self._event_due is not None:  # a wave read again after a restart
                times.append((self._event_due, FlushReason.WAVE))
            if self.last_input is not None:
                quiet = max(panel.grace, self.spec.max_seconds)
                times.append((self.last_input + quiet, FlushReason.WAVE))
        elif self.spec.on_hold_timeout is HoldTimeout.SUPPRESS:
            times.append((oldest + self.spec.max_hold_seconds, FlushReason.HOLD_TIMEOUT))
        times = [t for t in times if seen is None or t[0] > seen]
        return min(times, key=lambda t: t[0]) if times else None

    def deadline(self) -> float | None:
        """Monotonic time at which a flush becomes due without new records (None: never)."""
        times: list[float] = []
        if self.opened_at is not None:
            times.append(self.opened_at + self.spec.max_seconds)
        idle_at = self._idle_at()
        if idle_at is not None:
            times.append(idle_at)
        held_at = self._held_at()
        if held_at is not None:
            times.append(held_at[0])
        return min(times) if times else None

    def due(self, now: float, *, quiet: bool = False) -> FlushReason | None:
        """``quiet``: the last fetch found no record (the input is drained)."""
        if len(self.new) >= self.spec.max_records:
            return FlushReason.COUNT
        if self.opened_at is not None and now >= self.opened_at + self.spec.max_seconds:
            return FlushReason.TIME
        idle_at = self._idle_at()
        if quiet and idle_at is not None and now >= idle_at:
            return FlushReason.IDLE
        held_at = self._held_at()
        if held_at is not None and now >= held_at[0]:
            return held_at[1]
        return None

    # -- flush ----------------------------------------------------------------------------
    def take(self, reason: FlushReason, now: float | None = None) -> Flush:
        """The window: held records first, then the new ones. ``now``: the worker's clock (the
        engine is asked at it or just after)."""
        flush = Flush(
            records=self.held + self.new,
            new=len(self.new),
            positions=dict(self._positions),
            reason=reason,
            taken_at=now,
        )
        self._held_kept([], None)
        self.new = []
        self.opened_at = None
        return flush

    def complete(
        self, flush: Flush, held: Sequence[ValidRecord], *, wall_offset: float | None = None
    ) -> dict[TP, int]:
        """Keep what the engine still holds; the offsets now committable (only increases).
        ``wall_offset``: the records' timestamps' clock minus the worker's, now."""
        if wall_offset is not None:
            self._wall_offset = wall_offset
        # held ones first: they arrived earlier
        self._held_kept(list(held) + self.held, flush.taken_at)
        lowest: dict[TP, int] = {}
        for r in self.held:
            src = r.source
            if src is not None:
                tp = src.topic_partition
                if src.offset < lowest.get(tp, src.offset + 1):
                    lowest[tp] = src.offset
        commits: dict[TP, int] = {}
        for tp, position in flush.positions.items():
            if tp not in self._positions or position > self._positions[tp]:
                continue  # revoked meanwhile, or a position in a log the broker has lost
            self._decided[tp] = max(position, self._decided.get(tp, position))
            offset = min(position, lowest.get(tp, position))
            if offset > self._committed.get(tp, -1):
                commits[tp] = offset
        return commits

    def _held_kept(self, held: list[ValidRecord], seen: float | None) -> None:
        self.held = held
        self._oldest_held = min((r.arrived_at for r in held), default=None)
        self._held_seen = seen if held else None
        self._event_due = None
        panel, offset = self.panel, self._wall_offset
        if panel is not None and offset is not None and held:
            # the engine dates a wave by its records' timestamps (a restart reads it again and
            # keeps its age): without this deadline it was handed back only at its maximum
            # counted from the read, and a wave 95 s old of a 100 s maximum waited 100 s more
            stamps = sorted(s.timestamp_ms for r in held if (s := r.source) and s.timestamp_ms > 0)
            if len(stamps) >= panel.k:
                self._event_due = stamps[panel.k - 1] / 1000 - offset + panel.max_wave

    def committed(self, commits: dict[TP, int]) -> None:
        """The broker accepted these commits."""
        for tp, offset in commits.items():
            if offset > self._committed.get(tp, -1):
                self._committed[tp] = offset

    def committed_offsets(self) -> dict[TP, int]:
        """The offsets the broker accepted so far (a partition's log that restarted: none)."""
        return dict(self._committed)

    def decided(self) -> dict[TP, int]:
        """Per partition, the next offset after the records the last completed window decided
        (published, dead-lettered or held): the records from the committed offset up to it
        wait only because some are held on purpose. A copy (the monitor's thread asks)."""
        return dict(self._decided)

    def position(self, tp: TP) -> int | None:
        """The next offset after the last record consumed from ``tp`` (None: none yet)."""
        return self._positions.get(tp)

    def rewind(self, tp: TP, offset: int) -> bool:
        """A partition's log restarted below the offsets already seen (a broker that lost its
        data, or a recreated topic): positions and commits start again from ``offset``.
        Returns True when that was the case."""
        if offset >= self._positions.get(tp, -1):
            return False
        self._positions[tp] = offset
        self._committed.pop(tp, None)
        self._decided.pop(tp, None)
        self._first[tp] = offset
        return True

    def forget(self, partitions: Iterable[TP]) -> int:
        """Drop all records of revoked partitions (the next owner re-reads them from the last
        commit); returns how many held or unflushed records were handed over."""
        gone = set(partitions)

        def keep(r: ValidRecord) -> bool:
            return r.source is None or r.source.topic_partition not in gone

        before = len(self.held) + len(self.new)
        self._held_kept([r for r in self.held if keep(r)], self._held_seen)
        self.new = [r for r in self.new if keep(r)]
        for tp in gone:
            self._positions.pop(tp, None)
            self._committed.pop(tp, None)
            self._decided.pop(tp, None)
            self._first.pop(tp, None)
        return before - len(self.held) - len(self.new)

    def uncommitted(self) -> dict[TP, tuple[int, int]]:
        """Per partition, the offsets consumed in this run that no commit covers yet:
        (first, next) — they are read again by the next owner."""
        out: dict[TP, tuple[int, int]] = {}
        for tp, position in self._positions.items():
            start = self._committed.get(tp, self._first.get(tp, position))
            if position > start:
                out[tp] = (start, position)
        return out

    @property
    def size(self) -> int:
        return len(self.new) + len(self.held)
