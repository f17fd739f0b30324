"""The ``regroup`` and ``cohort`` republication modes: one window's quasi-identifier decision.

Every record of the window is, for its respondent, one of:

* **replayed**: decided before a crash, published as then (:mod:`gateway.grouping.replay`).
* **returning** to its group (``g`` in its state: group id, the digest of the values its tuple
  was formed from, its member index). It publishes the group's tuple once the group has a
  *quorum* in the record's release: at least k of its members publishing it there, counting
  those already published in the release and those in hand now. Until then it is held; when
  its release closes (a later wave, its hold time over, or the last flush) it stops waiting:
  ``regroup`` forms a new group for it, ``cohort`` publishes it with its quasi-identifiers
  suppressed.
* **pending**: new, or (``regroup``) changed, or a member of a group that can no longer reach k
  live members. Pending records are microaggregated among themselves, per release and scope,
  into groups of ≥ k + slack once ≥ k wait; fewer wait, or past their hold are suppressed.

``cohort`` keeps its members for good: a changed member stays, and the first publishers of
each release recompute the cohort's tuple from their current values when one of them changed.
A member publishes only if its linked candidate set stays ≥ k (:mod:`gateway.grouping.registry`),
so that holds for everyone, under attrition too; ``regroup`` measures it instead.

Per-release k and k over the history follow from the quorum: a tuple is published in a release
only by groups with ≥ k publishers there, and every group was formed from ≥ k respondents.
With strata (``WindowQI.strata``) pools are formed per (scope, stratum, release), a group keeps
its stratum, and a member found in another stratum cannot publish with it: ``regroup`` moves
it (as a changed category), ``cohort`` publishes it suppressed. With l-diversity (``ell``) a
pool's groups are merged until each holds l distinct published sensitive values (a pool with
fewer waits, as one below k does), and the quorum also needs l distinct values among the
release's publishers, so every class of every release holds l of them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gateway.grouping.decision import QIDecision, published_column
from gateway.grouping.registry import (
    Group,
    carried_after_leaving,
    is_wave,
    linked_fixpoint,
    member_digest,
    newer,
)
from gateway.grouping.release import pool_order, release_order
from gateway.grouping.replay import (
    publish_replays,
    recall,
    recall_unknown,
    window_outcomes,
)
from gateway.grouping.republish_measures import measure
from gateway.grouping.window_work import WindowQI, WindowWork
from gateway.policy import RepublicationMode

# (rows of one list per claim column, k) -> (published values per column, group label per row)
Partition = Callable[[list[list[object]], int], tuple[list[list[object]], NDArray[np.int64]]]
# rows (one list per claim column), their group labels 0..n-1 -> each group's published tuple
Centroids = Callable[[list[list[object]], NDArray[np.int64]], list[list[Any]]]
# rows, their group labels, each row's published sensitive value -> labels merged until every
# group holds l distinct values, or None when the rows hold fewer
Diversify = Callable[[list[list[object]], NDArray[np.int64], list[bytes]], NDArray[np.int64] | None]


class Republisher:
    """Decides windows for one policy's ``regroup`` or ``cohort`` mode."""

    def __init__(
        self,
        mode: RepublicationMode,
        *,
        k: int,
        slack: int,
        numeric: Sequence[bool],
        partition: Partition,
        centroids: Centroids,
        on_timeout_suppress: bool,
        pool_per_release: bool = False,
        ell: int | None = None,
        diversify: Diversify | None = None,
    ) -> None:
        if mode is RepublicationMode.DEFERRED:
            raise ValueError("the deferred mode is the engine's own, not a Republisher's")
        self.mode = mode
        self.k = k
        self.slack = slack
        self._numeric = list(numeric)
        self._partition = partition
        self._centroids = centroids
        self._suppress_on_timeout = on_timeout_suppress
        self._pool_per_release = pool_per_release
        if (ell is None) != (diversify is None):
            raise ValueError("l-diversity needs both l and the function that merges groups")
        self.ell = ell
        self._diversify = diversify

    @property
    def cohort(self) -> bool:
        return self.mode is RepublicationMode.COHORT

    # ------------------------------------------------------------------------------------
    def decide(
        self,
        w: WindowQI,
        states: dict[bytes, dict[str, Any]],
        touched: set[bytes],
        load: Callable[[Sequence[str]], Mapping[str, Group]],
        *,
        sampled: bool = False,
    ) -> tuple[QIDecision, dict[str, Group]]:
        """The window's decision; ``states`` (the respondents' decoded states) are updated in
        place and their keys added to ``touched``. Returns the decision and every group read or
        formed, whose changed entries the caller writes with the states. ``sampled``: a window
        whose risk is measured (``QIDecision.aggregated`` holds its new groups' rows)."""
        win = WindowWork(w, states, touched, {})
        win.decision.sampled = sampled  # its new groups' true and masked rows are kept
        followers, later = self._scan(win)
        gids = {m[0] for m in win.member.values()}
        gids.update(o[0] for o in win.replayed.values() if o is not None)
        win.groups.update(load(sorted(gids)))
        if recall_unknown(win):  # some are decided again: their groups too
            win.groups.update(load(sorted({m[0] for m in win.member.values()} - gids)))
        batches = self._classify(win)
        for (gid, release), idx in batches:
            self._quorum(win, gid, release, idx)
        self._recompute(win)
        self._form(win)
        d = win.decision
        publish_replays(win)
        suppressed = set(d.suppressed)
        for i, f in followers:  # the same respondent again, same tuple: the same outcome
            if f in d.tuples:
                d.tuples[i], d.group_of[i], d.digests[i] = d.tuples[f], d.group_of[f], w.digests[f]
                win.emitted[i] = win.emitted[f]
            elif f in suppressed:
                d.suppressed.append(i)
            else:
                self._hold_or_suppress(win, i)
        for i in later:  # another tuple of a respondent decided here: the next window's
            self._hold_or_suppress(win, i)
        window_outcomes(win)
        if sampled:
            measure(win, self.k, self.ell)
        return d, win.groups

    # -- the window's records --------------------------------------------------------------
    def _scan(self, win: WindowWork) -> tuple[list[tuple[int, int]], list[int]]:
        """Sort the records: incomplete (suppressed), first of their respondent (member of a
        group, or pending), or a repeat of a respondent already seen here."""
        w, d = win.w, win.decision
        first: dict[bytes, int] = {}
        followers: list[tuple[int, int]] = []
        later: list[int] = []
        states = win.states
        for i, key in enumerate(w.keys):
            if not w.complete[i]:
                d.suppressed.append(i)  # a missing quasi-identifier cannot be aggregated
                continue
            if key is None:
                win.pool.append(i)
                continue
            st = states.get(key)
            if st is not None and "p" in st:
                known = recall(st, w.rids[i], w.digests[i])
                if known is not False:  # decided before a crash: published as then
                    win.replayed[i] = known
                    continue
            f = first.get(key)
            if f is not None:
                same = w.digests[f] == w.digests[i] and w.releases[f] == w.releases[i]
                if same:
                    followers.append((i, f))
                else:
                    later.append(i)
                continue
            first[key] = i
            win.enter(i, st)
        return followers, later

    def _classify(self, win: WindowWork) -> list[tuple[tuple[str, str], list[int]]]:
        """Members by (group, release), oldest release first; the others join the pool."""
        w, k = win.w, self.k
        batches: dict[tuple[str, str], list[int]] = {}
        departing: dict[str, int] = {}
        for i, (gid, formed, j, categories) in win.member.items():
            grp = win.groups.get(gid)
            if grp is None or grp.size < k or j >= len(grp.members):
                # lost, of another mode, or formed under a smaller k: grouped afresh
                self._leave_for_pool(win, i)
                continue
            if w.strata is not None and w.strata[i] != grp.stratum:
                # in another stratum now: it cannot publish with the group (one formed before
                # the policy had strata is grouped afresh); a cohort keeps its members, so a
                # member that moved is suppressed
                if grp.stratum is None:
                    self._leave_for_pool(win, i)
                elif self.cohort:
                    self._wait(win, i, regroup_if_closed=False, force_close=True)
                else:
                    departing[gid] = departing.get(gid, 0) + 1
                    self._leave_for_pool(win, i)
                continue
            if not self.cohort and w.digests[i] != formed and w.categories[i] != categories:
                # a changed category moves it: its group publishes one member's categories,
                # which would outvote it (a changed number stays, and the mean follows it)
                departing[gid] = departing.get(gid, 0) + 1
                self._leave_for_pool(win, i)
                continue
            batches.setdefault((gid, w.releases[i]), []).append(i)
        if not self.cohort:
            # a group that cannot have k live members again is re-formed: its members that are
            # here join the pool, unless its release already has a quorum
            for (gid, release), idx in list(batches.items()):
                grp = win.groups[gid]
                quorum = release == grp.release and grp.publishers() >= k
                if grp.live - departing.get(gid, 0) < k and not quorum:
                    del batches[(gid, release)]
                    for i in idx:
                        self._leave_for_pool(win, i)
        return sorted(batches.items(), key=lambda kv: release_order(kv[0][1]))

    def _leave_for_pool(self, win: WindowWork, i: int) -> None:
        if i in win.member:
            win.leaving.add(i)
        win.pool.append(i)

    # -- returning members -----------------------------------------------------------------
    def _quorum(self, win: WindowWork, gid: str, release: str, idx: list[int]) -> None:
        grp = win.groups[gid]
        if not grp.enter(release):  # a straggler of a release the group has left behind
            for i in idx:
                self._wait(win, i, regroup_if_closed=True, force_close=True)
            return
        member = win.member
        batch = idx
        if self.cohort:
            batch = linked_fixpoint(grp, batch, {i: 1 << member[i][2] for i in idx}, self.k)
        mask = 0
        for i in batch:
            mask |= 1 << member[i][2]
        if (
            batch
            and (grp.published | mask).bit_count() >= self.k
            and self._diverse(win, grp, batch)
        ):
            self._publish(win, gid, grp, batch, mask)
            if len(batch) == len(idx):
                return
            waiting = [i for i in idx if not mask >> member[i][2] & 1]
        else:
            waiting = idx
        for i in waiting:
            self._wait(win, i, regroup_if_closed=True)

    def _diverse(self, win: WindowWork, grp: Group, batch: list[int]) -> bool:
        """Whether the release's publishers, with ``batch``, hold l distinct published values
        (always, without l-diversity)."""
        sensitive = win.w.sensitive
        if self.ell is None or sensitive is None:
            return True
        return len(grp.values.union(sensitive[i] for i in batch)) >= self.ell

    def _publish(self, win: WindowWork, gid: str, grp: Group, batch: list[int], mask: int) -> None:
        w = win.w
        if gid in win.recompute:  # a second release of the group here: its tuple first
            self._recompute(win)
        if grp.published == 0 and newer(grp.release, grp.tuple_release):
            digests, member = w.digests, win.member
            if any(digests[i] != member[i][1] for i in batch):
                # the release's first publishers bring current values: recompute
                grp.retune(grp.release)  # _recompute sets the tuple
                for i in batch:
                    j = win.member[i][2]
                    self._set_member(win, i, gid, j)
                    win.member[i] = (gid, w.digests[i], j, w.categories[i])
                win.recompute[gid] = batch  # in one pass over every such group
        grp.publish(mask)
        grp.changed = True
        sensitive = w.sensitive
        if sensitive is not None:
            grp.values.update(sensitive[i] for i in batch)
        win.published_groups[gid, grp.release] = (grp.publishers(), len(grp.values))
        if gid not in win.recompute:
            self._emit(win, gid, grp.tuple_, batch)

    def _recompute(self, win: WindowWork) -> None:
        """The tuples of the groups whose first publishers of a release brought changed values:
        their centroids over those publishers' current values, all groups in one pass."""
        if not win.recompute:
            return
        w = win.w
        batches = list(win.recompute.items())
        win.recompute.clear()
        rows = [i for _, batch in batches for i in batch]
        labels = np.repeat(np.arange(len(batches)), [len(batch) for _, batch in batches])
        tuples = self._centroids([[col[i] for i in rows] for col in w.cols], labels)
        for (gid, batch), tuple_ in zip(batches, tuples, strict=True):
            win.groups[gid].tuple_ = tuple_
            self._emit(win, gid, tuple_, batch)

    def _emit(self, win: WindowWork, gid: str, tuple_: list[Any], batch: list[int]) -> None:
        """The records of ``batch`` publish ``gid``'s tuple."""
        d, digests, member = win.decision, win.w.digests, win.member
        tuples, group_of, published = d.tuples, d.group_of, d.digests
        emitted, tuple_release = win.emitted, win.groups[gid].tuple_release
        for i in batch:
            tuples[i] = tuple_
            group_of[i] = gid
            emitted[i] = tuple_release
            published[i] = digest = digests[i]
            if digest != member[i][1]:
                win.stale[i] = self._stale_for(win, i)
        d.hits += len(batch)

    def _wait(
        self, win: WindowWork, i: int, *, regroup_if_closed: bool, force_close: bool = False
    ) -> None:
        """A record that cannot publish now: held while its release is open and its hold time
        lasts; then grouped afresh (``regroup``) or published suppressed."""
        w, d = win.w, win.decision
        closed = force_close or w.closed[i] or w.expired[i]
        if not closed:
            d.held.append(i)
        elif regroup_if_closed and not self.cohort and i in win.member:
            self._leave_for_pool(win, i)
        elif w.expired[i] and not self._suppress_on_timeout:
            d.held.append(i)
        else:
            d.suppressed.append(i)

    def _hold_or_suppress(self, win: WindowWork, i: int) -> None:
        if win.w.expired[i] and self._suppress_on_timeout:
            win.decision.suppressed.append(i)
        else:
            win.decision.held.append(i)

    def _stale_for(self, win: WindowWork, i: int) -> int:
        """A cohort member publishing a tuple its current values are not in: since when (its
        state keeps the release of its first such publication), in releases."""
        key = win.w.keys[i]
        assert key is not None
        st = win.states[key]
        release = win.w.releases[i]
        since = st.get("s")
        if since is None:
            st["s"] = release
            win.touched.add(key)
            return 1
        if is_wave(since) and is_wave(release):
            return int(release) - int(since) + 1
        return 1

    # -- new groups --------------------------------------------------------------------------
    def _form(self, win: WindowWork) -> None:
        """Microaggregate the pool, per (scope, release): one slot per respondent."""
        w, d, k = win.w, win.decision, self.k
        slot_of: dict[bytes | int, int] = {}
        slots: list[int] = []
        for i in win.pool:
            key = w.keys[i]
            ident: bytes | int = key if key is not None else i
            if ident not in slot_of:
                slot_of[ident] = len(slots)
                slots.append(i)
        parts: dict[tuple[int | None, str, str], list[int]] = {}
        strata = w.strata
        for i in slots:
            stratum = strata[i] if strata is not None else ""
            parts.setdefault((w.scopes[i], stratum, w.releases[i]), []).append(i)
        originals: list[NDArray[np.float64]] = []
        maskeds: list[NDArray[np.float64]] = []
        numeric = [j for j, n in enumerate(self._numeric) if n]
        for (scope, stratum, release), rows in sorted(parts.items(), key=pool_order):
            if self._pool_per_release and is_wave(release) and not self._closing(w, rows):
                d.held.extend(rows)  # the wave's pool grows until the wave closes
                continue
            if len(rows) < k:
                for i in rows:
                    self._pool_waits(win, i)
                continue
            sub = [[col[i] for i in rows] for col in w.cols]
            size = k + self.slack
            if len(rows) >= size:
                published, labels = self._partition(sub, size)
            else:  # between k and k + slack: one group of all of them
                published, labels = self._partition(sub, len(rows))
            out_rows = list(zip(*map(published_column, published, self._numeric), strict=True))
            sensitive = w.sensitive
            if self._diversify is not None and sensitive is not None:
                merged = self._diversify(sub, labels, [sensitive[i] for i in rows])
                if merged is None:  # fewer than l distinct values here: they wait
                    for i in rows:
                        self._pool_waits(win, i)
                    continue
                if not np.array_equal(merged, labels):  # a merged group publishes one tuple
                    labels = merged
                    tuples = self._centroids(sub, labels)
                    out_rows = [tuple(tuples[t]) for t in labels.tolist()]
                    published = [list(col) for col in zip(*out_rows, strict=True)]
            if numeric:
                originals.append(np.array([sub[j] for j in numeric], dtype=np.float64).T)
                maskeds.append(np.array([published[j] for j in numeric], dtype=np.float64).T)
            prefix = f"{scope}." if scope is not None else ""
            order = np.argsort(labels, kind="stable")
            for at in np.split(order, np.flatnonzero(np.diff(labels[order])) + 1):
                members = [rows[t] for t in at.tolist()]
                ident = b"".join(sorted(w.rids[i].encode() for i in members))
                gid = prefix + hashlib.sha256(ident).hexdigest()[:16]
                digests = [member_digest(w.keys[i] or b"") for i in members]
                grp = Group.formed(
                    list(out_rows[at[0]]),
                    digests,
                    release,
                    stratum=stratum if strata is not None else None,
                    values=() if sensitive is None else (sensitive[i] for i in members),
                )
                win.groups[gid] = grp
                win.published_groups[gid, release] = (grp.publishers(), len(grp.values))
                d.groups.append((gid, len(members)))
                for j, i in enumerate(members):
                    self._join(win, i, gid, grp, j)
        if d.sampled and numeric:
            width = len(numeric)
            d.aggregated = (
                np.vstack(originals) if originals else np.empty((0, width)),
                np.vstack(maskeds) if maskeds else np.empty((0, width)),
            )

    @staticmethod
    def _closing(w: WindowQI, rows: Sequence[int]) -> bool:
        """Whether a pool is grouped now: its release is closed or a member's hold is over."""
        return any(w.closed[i] or w.expired[i] for i in rows)

    def _pool_waits(self, win: WindowWork, i: int) -> None:
        """Fewer than k pending in its part: held, or past its hold time suppressed — and then
        it has left its group for good (its state no longer names one)."""
        w = win.w
        self._hold_or_suppress(win, i)
        if not (w.expired[i] and self._suppress_on_timeout):
            return
        if i in win.leaving:
            self._depart(win, i)
            key = w.keys[i]
            assert key is not None
            win.states[key].pop("g", None)
            win.touched.add(key)

    def _join(self, win: WindowWork, i: int, gid: str, grp: Group, j: int) -> None:
        w, d = win.w, win.decision
        d.tuples[i] = grp.tuple_
        d.group_of[i] = gid
        d.digests[i] = w.digests[i]
        win.emitted[i] = grp.tuple_release
        if w.keys[i] is None:
            return
        if i in win.leaving:
            self._depart(win, i)
        self._set_member(win, i, gid, j)

    def _depart(self, win: WindowWork, i: int) -> None:
        """Respondent ``i`` leaves its group: one live member less, and it carries on the
        respondents its linked set still holds."""
        key = win.w.keys[i]
        assert key is not None
        gid, _, j, _ = win.member[i]
        grp = win.groups.get(gid)
        st = win.states[key]
        if grp is not None:
            grp.live -= 1
            grp.changed = True
            st["x"] = carried_after_leaving(grp, j, st.get("x"))
        else:  # its group's entry is gone: nothing known to carry, assume the worst
            st["x"] = []
        win.touched.add(key)

    def _set_member(self, win: WindowWork, i: int, gid: str, j: int) -> None:
        """Respondent ``i`` is member ``j`` of ``gid``, its tuple formed from its current
        values."""
        w = win.w
        key = w.keys[i]
        assert key is not None
        st = win.states.get(key)
        if st is None:
            st = win.states[key] = {}
        g = [gid, w.digests[i], j, w.categories[i]]
        if st.get("g") == g and "s" not in st:
            return  # an unchanged member of a recomputed group: nothing to write
        st["g"] = g
        st.pop("s", None)
        st.pop("current", None)  # the deferred mode's entries, superseded
        st.pop("qi", None)
        win.touched.add(key)
