"""The engine's k-claim step: a window's claim inputs (values, keyed digests, releases) and the
republication mode's decision over them — ``regroup`` and ``cohort`` by
:class:`gateway.grouping.republish.Republisher`, ``deferred`` and stateless runs by
:class:`gateway.grouping.deferred.DeferredGrouping` — with the records a wave pool parks."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.engine.keyed_inputs import CATEGORIES_DIGEST_ATTR, RECODED_DIGEST_ATTR, KeyedInputs
from gateway.engine.records import Columns, ValidRecord, attribute_values, record_ids_at, window_id
from gateway.errors import PolicyError
from gateway.grouping.claim_partition import ClaimPartition
from gateway.grouping.decision import QIDecision
from gateway.grouping.deferred import ClaimInputs, DeferredGrouping
from gateway.grouping.live_view import StateView
from gateway.grouping.mixed_microaggregation import claim_inputs
from gateway.grouping.parking import Parking
from gateway.grouping.recode_stream import RecodeStream, RecodeWindow, digests_of
from gateway.grouping.registry import Group
from gateway.grouping.release import ReleaseClock, Source, release_keys
from gateway.grouping.republish import Republisher
from gateway.grouping.scope import Diversifier, GroupingInputs
from gateway.grouping.window_work import WindowQI
from gateway.measures.window_risk import window_measures
from gateway.policy import (
    GroupingPool,
    HoldTimeout,
    MicroaggAlgorithm,
    Policy,
    RepublicationMode,
)
from gateway.state_store.state_api import StateStore
from gateway.state_store.state_codec import decode_state
from gateway.state_store.state_keys import group_id, group_key


@dataclass(frozen=True, slots=True)
class ClaimWindow:
    """What the claim step reads of a window."""

    records: Sequence[ValidRecord]
    rids: Sequence[str]
    rkeys: Sequence[bytes | None]  # respondent state keys
    columns: Columns  # the records' values (gateway.engine.records.window_columns)
    view: StateView
    grouping: GroupingInputs
    qi_digests: list[str] | None  # the claim digests the caller brought (None: taken here)
    scopes: Sequence[int] | None  # state partitions groups never span (None: the window)
    sampled: bool  # a window whose risk is measured


def event_time(record: ValidRecord) -> float | None:
    """When the record was produced, in seconds (its broker timestamp), if known."""
    src = record.source
    return None if src is None or src.timestamp_ms < 0 else src.timestamp_ms / 1000.0


def source_of(record: ValidRecord) -> Source:
    """The record's input partition, for the release clock (None: not from a stream)."""
    src = record.source
    return None if src is None else src.topic_partition


def _respondents_at(records: Sequence[ValidRecord], positions: Sequence[int]) -> list[object]:
    """The respondent ids of the records at ``positions`` (the release clock counts them)."""
    return [records[i].respondent_id for i in positions]


def _origins(
    records: Sequence[ValidRecord], positions: range
) -> tuple[list[float], list[Source], list[float | None]]:
    """The records' arrival times, input partitions and event times (NaN: unknown), as
    columns (:func:`source_of` and :func:`event_time` over a window, in C where it can)."""
    recs = (
        records[positions.start : positions.stop]
        if positions.step == 1
        else [records[i] for i in positions]
    )
    arrived = list(map(_ARRIVED, recs))
    sources = list(map(_SOURCE, recs))
    if None in sources:  # records without an input position (files, tests)
        return (
            arrived,
            [None if s is None else (s.topic, s.partition) for s in sources],
            [None if s is None or s.timestamp_ms < 0 else s.timestamp_ms / 1000.0 for s in sources],
        )
    stamps = np.fromiter(map(_STAMP, sources), dtype=np.float64, count=len(sources))
    events: list[float | None] = np.where(stamps < 0, np.nan, stamps / 1000.0).tolist()
    return arrived, list(map(_TOPIC_PARTITION, sources)), events


_ARRIVED = operator.attrgetter("arrived_at")
_SOURCE = operator.attrgetter("source")
_STAMP = operator.itemgetter(3)  # SourceRef.timestamp_ms
_TOPIC_PARTITION = operator.itemgetter(0, 1)  # (SourceRef.topic, SourceRef.partition)


class ClaimStep:
    """The policy's k-claim decision, built once. ``inputs``: keyed digests (None without a
    secret); ``store``: the state, whose group registry the republication modes read;
    ``measure_risk=False``: a shard's sampled rows go back unmeasured."""

    def __init__(
        self,
        policy: Policy,
        *,
        inputs: KeyedInputs | None,
        store: StateStore | None,
        measure_risk: bool,
    ) -> None:
        self.policy = policy
        self.names = policy.k_claim
        self.claim = ClaimPartition(policy)
        self._inputs = inputs
        self._store = store
        self._measure_risk = measure_risk
        spec, rep, window = policy.microaggregation, policy.republication, policy.window
        # groups hold l distinct published values of one attribute
        ldiv = spec.l_diversity if self.names else None
        self.ldiv = None if ldiv is None else ldiv.attribute
        self.diversify = (
            None if ldiv is None else Diversifier(self.claim.columns, spec.standardize, ldiv.l)
        )
        # a partition that sent nothing for a window's max_seconds holds no wave back; a wave
        # of fewer than k respondents so far (a mistyped wave number) closes none before it
        panel = rep.mode is RepublicationMode.PANEL
        step = rep.wave_step if panel else None
        self.releases = ReleaseClock(window.max_seconds, min_records=spec.k, max_step=step)
        pooled = (
            (rep.pool is GroupingPool.RELEASE or panel)
            and rep.wave_attribute is not None
            and rep.mode is not RepublicationMode.DEFERRED
            and store is not None
        )
        # a panel's wave closes by its grace or its maximum, never by a record's hold time
        self._parking = (
            None
            if not pooled
            else Parking(rep.max_wave, grace=rep.close_grace)
            if panel
            else Parking(window.max_hold_seconds)
        )
        suppress = window.on_hold_timeout is HoldTimeout.SUPPRESS
        # recode_suppress: exact-tuple k per wave (gateway.grouping.recode_stream)
        self._recode: RecodeStream | None = None
        if spec.algorithm is MicroaggAlgorithm.RECODE_SUPPRESS and self.names:
            if inputs is None or store is None:
                raise PolicyError(
                    "microaggregation.algorithm recode_suppress in the stream keeps each "
                    "respondent's suppressed cells: it needs a secret (PRIVGW_SECRET) and a "
                    "state store; privgw protect runs it on files"
                )
            digest = digests_of(inputs.claim_digests, RECODED_DIGEST_ATTR)
            self._recode = RecodeStream(policy, digest)
        self._republisher = (
            Republisher(
                rep.mode,
                k=spec.k,
                slack=rep.slack,
                numeric=self.claim.numeric,
                partition=self.claim.partition,
                centroids=self.claim.centroids,
                on_timeout_suppress=suppress,
                pool_per_release=rep.pool is GroupingPool.RELEASE,
                ell=None if ldiv is None else ldiv.l,
                diversify=self.diversify,
            )
            if rep.mode not in (RepublicationMode.DEFERRED, RepublicationMode.PANEL)
            and self.names
            and store
            and self._recode is None
            else None
        )
        self._deferred = DeferredGrouping(
            k=spec.k,
            claim=self.claim,
            diversify=self.diversify,
            max_hold_seconds=window.max_hold_seconds,
            suppress_on_timeout=suppress,
            measure=DeferredGrouping.measuring(policy.risk.interval_pct) if measure_risk else None,
        )

    def republishes(self, sticky: bool) -> bool:
        """Whether windows are decided by a mode that keeps its own respondent entries
        (``regroup``, ``cohort``, or recoding with suppression) rather than ``deferred``'s."""
        return (self._republisher is not None or self._recode is not None) and sticky

    def parked_ids(self) -> list[str]:
        """The record ids of the records :meth:`parked` set aside last, in order."""
        return [] if self._parking is None else self._parking.rids

    def parked(
        self,
        records: Sequence[ValidRecord],
        waves: Callable[[Sequence[int]], list[Any]],
        *,
        now: float,
        flush_all: bool,
        wall: float | None = None,
    ) -> list[int]:
        """The records set aside unread in this window (:mod:`gateway.grouping.parking`);
        ``waves``: the wave attribute's values of the records at the positions asked;
        ``wall``: the time now in the records' event time (:class:`InputMarks`)."""
        parking, wave = self._parking, self.policy.republication.wave_attribute
        if parking is None or wave is None or not records:
            return []

        def releases_at(positions: Sequence[int]) -> list[str]:
            return release_keys(waves(positions), str)  # no wave: a window release (never parked)

        return parking.split(
            records,
            functools.partial(_origins, records),
            lambda positions: record_ids_at(records, positions),
            releases_at,
            self.releases,
            now=now,
            flush_all=flush_all,
            who=functools.partial(_respondents_at, records),
            wall=wall,
        )

    def decide(
        self, cw: ClaimWindow, *, now: float, flush_all: bool
    ) -> tuple[QIDecision, dict[str, Group]]:
        """The window's decision and the groups the republication modes read or formed."""
        if not self.names:
            decision = QIDecision()
            decision.sampled = cw.sampled
            return decision, {}
        # the partition's inputs: floats, categories (generalized where the policy says so),
        # None where a value is missing and not a category of its own
        names = self.names
        attributes = self.policy.attributes
        values = attribute_values(cw.columns, len(cw.records), names)
        cols = [claim_inputs(attributes[n], c) for n, c in zip(names, values, strict=True)]
        complete: list[bool] = [None not in row for row in zip(*cols, strict=True)]
        if self._recode is not None and cw.view.sticky:
            return self._recoded(cw, cols, now=now, flush_all=flush_all), {}
        if self.republishes(cw.view.sticky):
            return self._republish(cw, cols, complete, now=now, flush_all=flush_all)
        return self._deferred_decision(cw, cols, complete, now=now, flush_all=flush_all), {}

    def _digests(self, cw: ClaimWindow, cols: list[list[Any]], complete: list[bool]) -> list[str]:
        assert self._inputs is not None
        if cw.qi_digests is not None:
            return cw.qi_digests
        return self._inputs.claim_digests(cols, complete, strata=cw.grouping.strata)

    def _deferred_decision(
        self,
        cw: ClaimWindow,
        cols: list[list[Any]],
        complete: list[bool],
        *,
        now: float,
        flush_all: bool,
    ) -> QIDecision:
        """The ``deferred`` mode and stateless runs: no group is re-formed. A respondent's state
        maps each claim digest it published to its tuple, so a replay needs no offsets."""
        sticky = cw.view.sticky and self._inputs is not None and bool(cw.records)
        inputs = ClaimInputs(
            rids=cw.rids,
            keys=cw.rkeys,
            cols=cols,
            complete=complete,
            digests=self._digests(cw, cols, complete) if sticky else [],
            arrived=[r.arrived_at for r in cw.records],
            scopes=cw.scopes,
        )
        return self._deferred.decide(
            inputs, cw.view, cw.grouping, now=now, flush_all=flush_all, sampled=cw.sampled
        )

    def _republish(
        self,
        cw: ClaimWindow,
        cols: list[list[Any]],
        complete: list[bool],
        *,
        now: float,
        flush_all: bool,
    ) -> tuple[QIDecision, dict[str, Group]]:
        """The ``regroup`` and ``cohort`` modes (:mod:`gateway.grouping.republish`)."""
        assert self._republisher is not None and self._inputs is not None
        records, grouping, policy = cw.records, cw.grouping, self.policy
        categorical = [
            c for c, numeric in zip(cols, self.claim.numeric, strict=True) if not numeric
        ]
        # a changed stratum counts as a changed category: the respondent moves
        categories = self._inputs.claim_digests(
            categorical, complete, CATEGORIES_DIGEST_ATTR, strata=grouping.strata
        )
        releases = self._release_keys(cw)
        max_hold = policy.window.max_hold_seconds
        closed = {r: self.releases.closed(r, now) for r in set(releases)}
        window_qi = WindowQI(
            rids=cw.rids,
            keys=cw.rkeys,
            cols=cols,
            complete=complete,
            digests=self._digests(cw, cols, complete),
            categories=categories,
            releases=releases,
            scopes=list(cw.scopes) if cw.scopes is not None else [None] * len(records),
            expired=[True] * len(records)
            if flush_all
            else [now - r.arrived_at >= max_hold for r in records],
            closed=[closed[r] for r in releases],
            strata=grouping.stratum_digests,
            sensitive=None
            if self.ldiv is None or grouping.sensitive is None
            else self._inputs.published_digests(self.ldiv, grouping.sensitive),
        )
        decision, groups = self._republisher.decide(
            window_qi,
            cw.view.states,
            cw.view.touched,
            self._load_groups,
            sampled=cw.sampled,
        )
        for gid, grp in groups.items():
            cw.view.sizes[gid] = grp.size
        if decision.sampled and decision.aggregated is not None and self._measure_risk:
            decision.measures.update(
                window_measures(*decision.aggregated, policy.risk.interval_pct)
            )
            decision.aggregated = None
        elif not decision.sampled:
            decision.aggregated = None
        return decision, groups

    def _recoded(
        self, cw: ClaimWindow, cols: list[list[Any]], *, now: float, flush_all: bool
    ) -> QIDecision:
        """``recode_suppress`` (:mod:`gateway.grouping.recode_stream`)."""
        assert self._recode is not None
        max_hold, records = self.policy.window.max_hold_seconds, cw.records
        w = RecodeWindow(
            keys=cw.rkeys,
            cols=cols,
            releases=self._release_keys(cw),
            scopes=list(cw.scopes) if cw.scopes is not None else [None] * len(records),
            expired=[flush_all or now - r.arrived_at >= max_hold for r in records],
        )
        return self._recode.decide(w, cw.view, sampled=cw.sampled)

    def _release_keys(self, cw: ClaimWindow) -> list[str]:
        """Each record's release (its wave, else the window's), seen by the release clock."""
        records = cw.records
        wave = self.policy.republication.wave_attribute
        if wave is None:
            releases = ["w" + window_id(records)] * len(records)
        else:
            releases = release_keys(
                attribute_values(cw.columns, len(records), [wave])[0], lambda: window_id(records)
            )
        if self._parking is None:  # else parking showed the clock these records as they came
            self.releases.see(
                releases,
                [source_of(r) for r in records],
                [r.arrived_at for r in records],
                who=functools.partial(_respondents_at, records),
            )
        return releases

    def _load_groups(self, group_ids: Sequence[str]) -> dict[str, Group]:
        assert self._store is not None
        found = self._store.get_many([group_key(g) for g in group_ids])
        out: dict[str, Group] = {}
        for key, raw in found.items():
            grp = Group.from_doc(decode_state(raw))
            if grp is not None:
                out[group_id(key)] = grp
        return out
