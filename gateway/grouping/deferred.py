"""The ``deferred`` republication mode's quasi-identifier decision, and the file workflow's.

A returning respondent republishes the tuple stored for its k-claim digest. A changed one moves
to a new group, unless leaving would drop the group it is a live member of below k: then it
stays and publishes its group's tuple (the move is deferred until the group can spare it). New
and changed records are microaggregated among themselves, per scope (window or state
partition) and stratum, once at least k of them wait; fewer are held or, past their hold time,
published with their quasi-identifiers suppressed. A record decided before a crash publishes
what it published then (:mod:`gateway.grouping.replay`). Without digests (no state: the file
workflow, or consistency ``none``) every record is new.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gateway.grouping.claim_partition import ClaimPartition
from gateway.grouping.decision import QIDecision, published_column
from gateway.grouping.live_view import StateView
from gateway.grouping.replay import recall
from gateway.grouping.scope import Diversifier, GroupingInputs, same_stratum
from gateway.measures.window_risk import window_measures

_NOTHING: Mapping[str, Any] = {}  # the default of chained look-ups; never written to


@dataclass(frozen=True, slots=True)
class ClaimInputs:
    """A window's k-claim inputs, one entry per record."""

    rids: Sequence[str]
    keys: Sequence[bytes | None]  # respondent state keys (None: no respondent id)
    cols: Sequence[Sequence[object]]  # the claim's inputs, one list per attribute
    complete: Sequence[bool]  # every claim value present
    digests: Sequence[str]  # keyed digest of the claim tuple (empty: no state)
    arrived: Sequence[float]  # when the worker first saw the record (hold timeout)
    scopes: Sequence[int] | None  # state partitions groups never span (None: the window)


@dataclass(slots=True)
class _Work:
    """Working state of one decision."""

    w: ClaimInputs
    view: StateView
    grouping: GroupingInputs
    decision: QIDecision
    now: float
    flush_all: bool
    pending: list[int] = field(default_factory=list)  # new or changed: to be grouped
    # a respondent's second, different new tuple in one window waits for the next one: two
    # slots of one respondent could land in one group and count twice towards k
    deferred: list[int] = field(default_factory=list)
    pending_digest: dict[bytes, str] = field(default_factory=dict)
    seen: dict[bytes, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Slots:
    """One slot per distinct (respondent, tuple) among the pending records, and each one's
    group and published tuple once formed."""

    first: list[int] = field(default_factory=list)  # a record of each slot
    of_record: list[int] = field(default_factory=list)  # each pending record's slot
    gid: dict[int, str] = field(default_factory=dict)
    masked: dict[int, tuple[object, ...]] = field(default_factory=dict)


class DeferredGrouping:
    """Decides windows for a policy's ``deferred`` mode (and stateless runs)."""

    def __init__(
        self,
        *,
        k: int,
        claim: ClaimPartition,
        diversify: Diversifier | None,
        max_hold_seconds: float,
        suppress_on_timeout: bool,
        measure: Callable[[NDArray[np.float64], NDArray[np.float64]], dict[str, float]] | None,
    ) -> None:
        """``measure``: the window's risk and utility of its new groups (None: a shard, whose
        sampled rows go back in ``QIDecision.aggregated`` to be measured once merged)."""
        self.k = k
        self._claim = claim
        self._diversify = diversify
        self._max_hold = max_hold_seconds
        self._suppress_on_timeout = suppress_on_timeout
        self._measure = measure

    @staticmethod
    def measuring(interval_pct: float) -> Callable[..., dict[str, float]]:
        """The ``measure`` of an engine that measures its own windows."""
        return lambda x, masked: window_measures(x, masked, interval_pct)

    def decide(
        self,
        w: ClaimInputs,
        view: StateView,
        grouping: GroupingInputs,
        *,
        now: float,
        flush_all: bool,
        sampled: bool,
    ) -> QIDecision:
        """Each record's k-claim tuple: stored, a new group's, held or suppressed. ``view``'s
        live counts follow the moves and joins."""
        decision = QIDecision()
        decision.sampled = sampled
        work = _Work(w, view, grouping, decision, now, flush_all)
        undecided: Sequence[int] = range(len(w.keys))
        if w.digests:
            undecided = self._stored(work)
        for i in undecided:
            self._one(work, i)
        slots = self._slots(work)
        self._group(work, slots)
        self._assign(work, slots)
        for i in work.deferred:  # no departure was reserved for these
            self._hold_or_suppress(work, i)
        _outcomes(work)
        return decision

    # -- stored tuples ------------------------------------------------------------------------
    def _stored(self, work: _Work) -> list[int]:
        """Replays and returning members that keep their tuple, decided in a few passes; the
        others' live counts read in one batch (the group left and, on a revert, the one
        rejoined). Returns the records still to decide."""
        w, states = work.w, work.view.states
        replays = _replays(w, states, work.decision)
        kept = _keep_stored_tuples(w, states, decision=work.decision, replays=replays)
        undecided = [i for i in range(len(w.keys)) if i not in kept]
        moves: set[str] = set()
        for i in undecided:
            key, digest = w.keys[i], w.digests[i]
            st = states.get(key) if key is not None else None
            now_in = st.get("current") if st is not None else None
            if st is not None and now_in is not None and now_in[1] != digest:
                moves.add(now_in[0])
                back = st.get("qi", {}).get(digest)
                if back is not None:
                    moves.add(back[0])
        work.view.prefetch(moves)
        return undecided

    def _one(self, work: _Work, i: int) -> None:
        """Record ``i``: suppressed (incomplete), its respondent's earlier decision here, a
        stored tuple (kept, or a deferred move), or pending."""
        w, decision, view = work.w, work.decision, work.view
        if not w.complete[i]:
            decision.suppressed.append(i)  # a missing quasi-identifier cannot be aggregated
            return
        key = w.keys[i]
        if not w.digests or key is None:
            work.pending.append(i)
            return
        tuples, digests, k = decision.tuples, decision.digests, self.k
        digest = digests[i] = w.digests[i]
        first = work.seen.get(key)
        if first is not None and digests.get(first) == digest and first in decision.group_of:
            # the same respondent twice in a window: one decision, counted once
            tuples[i] = tuples[first]
            decision.group_of[i] = decision.group_of[first]
            if first in decision.current_digest:
                decision.current_digest[i] = decision.current_digest[first]
            return
        waiting = work.pending_digest.get(key)
        if waiting is not None:
            # same tuple: the same slot (and one departure); another one: next window
            (work.pending if waiting == digest else work.deferred).append(i)
            return
        if first is not None:
            # another tuple after one already decided here (kept or rejoined): also the next
            # window's, which sees that decision as the respondent's current
            work.deferred.append(i)
            return
        work.seen[key] = i
        st = view.states.get(key, {})
        current: list[str] | None = st.get("current")
        stored = st.get("qi", {}).get(digest)
        cur_gid = current[0] if current is not None else None
        moving = cur_gid is not None and (stored is None or stored[0] != cur_gid)
        if (
            current is not None
            and moving
            and view.members(current[0], k + 1) - 1 < k
            and same_stratum(current, work.grouping.stratum_digests, i)
        ):
            # leaving would drop the current group below k live members: stay in it
            stored = st["qi"][current[1]]
            decision.current_digest[i] = current[1]
            decision.deferred += 1
        elif stored is not None:
            decision.hits += 1
        if cur_gid is not None and moving:
            view.leave(cur_gid)  # reserved now; undone if the record is held
        if stored is not None:
            tuples[i] = stored[1]
            decision.group_of[i] = stored[0]
            if moving or current is None:
                view.join(stored[0])
            return
        work.pending_digest[key] = digest
        work.pending.append(i)

    # -- new groups ---------------------------------------------------------------------------
    @staticmethod
    def _slots(work: _Work) -> _Slots:
        """One slot per distinct (respondent, tuple): a respondent counts once in a group."""
        slots = _Slots()
        slot_of: dict[tuple[bytes | int, str | int], int] = {}
        keys, digests = work.w.keys, work.decision.digests
        for i in work.pending:
            key = keys[i]
            ident: tuple[bytes | int, str | int] = (
                (key, digests[i]) if key is not None and i in digests else (i, i)
            )
            if ident not in slot_of:
                slot_of[ident] = len(slots.first)
                slots.first.append(i)
            slots.of_record.append(slot_of[ident])
        return slots

    def _group(self, work: _Work, slots: _Slots) -> None:
        """Microaggregate the slots per scope and stratum (fewer than k in one wait), and
        measure the sampled window's new groups."""
        w, claim = work.w, self._claim
        scopes: dict[tuple[int | None, str], list[int]] = {}
        strata = work.grouping.strata
        for s_index, i in enumerate(slots.first):
            scope = w.scopes[i] if w.scopes is not None else None
            stratum = strata[i] if strata is not None else ""
            scopes.setdefault((scope, stratum), []).append(s_index)
        originals: list[NDArray[np.float64]] = []
        maskeds: list[NDArray[np.float64]] = []
        for (scope, _), scope_slots in sorted(
            scopes.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1])
        ):
            if len(scope_slots) < self.k:
                continue  # these wait (below) for k new neighbours in their scope
            rec_idx = [slots.first[s_index] for s_index in scope_slots]  # record per row
            sub = [[c[t] for t in rec_idx] for c in w.cols]
            formed = self._partition(work, sub, rec_idx)
            if formed is None:
                continue
            published, label_rows, published_rows = formed
            if num := claim.numeric_pos:
                originals.append(np.array([sub[j] for j in num], dtype=np.float64).T)
                maskeds.append(np.array([published[j] for j in num], dtype=np.float64).T)
            prefix = f"{scope}." if scope is not None else ""
            # each group's rows, label by label, in one sort (a scan per label was quadratic:
            # ~1 s for the 33,000 groups of 100,000 rows at k = 3)
            order = np.argsort(label_rows, kind="stable")
            for idx in np.split(order, np.flatnonzero(np.diff(label_rows[order])) + 1):
                rows_of_group: list[int] = idx.tolist()
                ident = b"".join(sorted(w.rids[rec_idx[t]].encode() for t in rows_of_group))
                gid = prefix + hashlib.sha256(ident).hexdigest()[:16]
                work.decision.groups.append((gid, len(rows_of_group)))
                work.view.sizes[gid] = len(rows_of_group)  # slots: distinct respondents
                for t in rows_of_group:
                    slots.gid[scope_slots[t]] = gid
            for pos, s_index in enumerate(scope_slots):
                slots.masked[s_index] = published_rows[pos]
        self._measure_new(work.decision, originals, maskeds)

    def _partition(
        self, work: _Work, sub: list[list[object]], rec_idx: list[int]
    ) -> tuple[list[list[object]], NDArray[np.int64], list[tuple[object, ...]]] | None:
        """One pool's groups: published values per column, labels, each row's tuple; merged
        until l-diverse (None: too few distinct values here, they all wait)."""
        claim = self._claim
        published, label_rows = claim.partition(sub)
        published_rows = list(zip(*map(published_column, published, claim.numeric), strict=True))
        sensitive = work.grouping.sensitive
        if sensitive is not None and self._diversify is not None:
            merged = self._diversify(sub, label_rows, [sensitive[t] for t in rec_idx])
            if merged is None:
                return None
            if not np.array_equal(merged, label_rows):
                label_rows = merged
                centroids = claim.centroids(sub, label_rows)
                published_rows = [tuple(centroids[t]) for t in label_rows.tolist()]
                published = [list(c) for c in zip(*published_rows, strict=True)]
        return published, label_rows, published_rows

    def _measure_new(
        self,
        decision: QIDecision,
        originals: list[NDArray[np.float64]],
        maskeds: list[NDArray[np.float64]],
    ) -> None:
        if not (decision.sampled and self._claim.numeric_pos):
            return
        width = len(self._claim.numeric_pos)
        both = (
            np.vstack(originals) if originals else np.empty((0, width)),
            np.vstack(maskeds) if maskeds else np.empty((0, width)),
        )
        if self._measure is not None:
            decision.measures = self._measure(*both)
        else:  # a shard: its records, even none, so that the merge knows it was sampled
            decision.aggregated = both

    def _assign(self, work: _Work, slots: _Slots) -> None:
        """Each pending record: its slot's new group, or held (then still a live member of the
        group it was leaving) or suppressed (it has left that group for good)."""
        decision, view, keys = work.decision, work.view, work.w.keys
        view.prefetch(gid for gid, _ in decision.groups)  # a replayed window's groups exist
        joined: set[int] = set()
        first_of_slot = set(slots.first)  # a slot reserved one departure, not one per record
        for i, s_index in zip(work.pending, slots.of_record, strict=True):
            slot_gid = slots.gid.get(s_index)
            if slot_gid is None:
                held = self._hold_or_suppress(work, i)
                if i in first_of_slot:
                    if held:
                        _undo_departure(view, keys[i])
                    else:
                        decision.departed.append(i)
                continue
            decision.tuples[i] = slots.masked[s_index]
            decision.group_of[i] = slot_gid
            if keys[i] is not None and s_index not in joined:
                joined.add(s_index)
                view.join(slot_gid)

    def _hold_or_suppress(self, work: _Work, i: int) -> bool:
        """A record that cannot be grouped now: held (True) or, once its hold time is over and
        the policy says so, published with its quasi-identifiers suppressed (False)."""
        expired = work.flush_all or work.now - work.w.arrived[i] >= self._max_hold
        if expired and self._suppress_on_timeout:
            work.decision.suppressed.append(i)
            return False
        work.decision.held.append(i)
        return True


def _undo_departure(view: StateView, key: bytes | None) -> None:
    """A held record stays, for now, a live member of the group it was leaving."""
    current = view.states.get(key, {}).get("current") if key is not None else None
    if current is not None:
        view.join(current[0])


def _keep_stored_tuples(
    w: ClaimInputs,
    states: Mapping[bytes, Mapping[str, Any]],
    *,
    decision: QIDecision,
    replays: set[int],
) -> set[int]:
    """Decide the records whose respondent, here once in the window, brings a tuple stored for
    the group it is a live member of: it publishes that group's tuple again and nothing moves
    (most of a panel's returning respondents). The same outcome as the record-by-record
    decision, taken in a few passes over the window; returns those records' indices, with the
    ``replays`` already decided."""
    nothing = _NOTHING
    rkeys, qi_hex = w.keys, w.digests
    occurrences = Counter(rkeys)
    sts = [nothing if key is None else states.get(key, nothing) for key in rkeys]
    currents: list[Any] = [st.get("current") for st in sts]
    found: list[Any] = [
        None if current is None else st.get("qi", nothing).get(digest)
        for st, current, digest in zip(sts, currents, qi_hex, strict=True)
    ]
    kept = [
        i
        for i, (entry, current, ok, key) in enumerate(
            zip(found, currents, w.complete, rkeys, strict=True)
        )
        if entry is not None
        and ok
        and entry[0] == current[0]
        and occurrences[key] == 1
        and i not in replays
    ]
    decision.digests.update(zip(kept, [qi_hex[i] for i in kept], strict=True))
    decision.tuples.update(zip(kept, [found[i][1] for i in kept], strict=True))
    decision.group_of.update(zip(kept, [found[i][0] for i in kept], strict=True))
    decision.hits += len(kept)
    decision.unchanged = {i for i in kept if currents[i][1] == qi_hex[i]} | replays
    return set(kept) | replays


def _replays(
    w: ClaimInputs, states: Mapping[bytes, Mapping[str, Any]], decision: QIDecision
) -> set[int]:
    """The records decided before a crash (:mod:`gateway.grouping.replay`): each publishes
    the tuple stored under the claim digest it published then (its own, or the one of a move
    it deferred) and changes nothing. Returns their indices."""
    replays: set[int] = set()
    for i, key in enumerate(w.keys):
        st = states.get(key) if key is not None and w.complete[i] else None
        if st is None or "p" not in st:
            continue
        outcome = recall(st, w.rids[i], w.digests[i])
        if outcome is False:
            continue
        if outcome is None:
            decision.suppressed.append(i)
        else:
            stored = st.get("qi", _NOTHING).get(outcome[1])
            if stored is None:  # not kept: decided again
                continue
            decision.tuples[i], decision.group_of[i] = stored[1], stored[0]
            decision.digests[i] = w.digests[i]
            decision.hits += 1
        replays.add(i)
    decision.replayed = replays
    return replays


def _outcomes(work: _Work) -> None:
    """What each published record (not replayed) published, into the decision's ``outcomes``:
    the claim digest its tuple is stored under (its own, or the one of a move it deferred)."""
    d, keys = work.decision, work.w.keys
    held, suppressed = set(d.held), set(d.suppressed)
    for i, digest in d.digests.items():
        if i in held or i in d.replayed or keys[i] is None:
            continue
        gid = None if i in suppressed else d.group_of.get(i)
        d.outcomes[i] = (digest, None if gid is None else (gid, d.current_digest.get(i, digest)))
