"""``recode_suppress`` in the stream: recoded keys, suppressed to exact-tuple k per wave.

The policy runs it with ``consistency: sticky`` and ``republication.pool: release`` over waves
(:func:`gateway.grouping.scope.refuse_in_stream`), so a wave reaches :meth:`RecodeStream.decide`
whole when it closes (:mod:`gateway.grouping.parking`). Per (scope, wave):

* **deciding** (the wave has no decision yet): every record's keys are recoded (stateless, as
  ``privgw protect`` does); a respondent whose recoded tuple equals the one it last published
  (keyed digests in its state, never values) starts from the cells it had suppressed then
  (sticky), others from none; cells are then suppressed until every exact published tuple,
  a suppressed cell a value of its own, holds ≥ k distinct respondents
  (:mod:`gateway.grouping.exact_suppression`). A fully suppressed class that cannot reach k is
  withheld (published as suppressed records).
* **late** (a record of a wave already decided): a record its respondent's state says was
  published in the wave publishes that again (a replay: same mask, nothing counted); an
  unchanged respondent joins the class of its stored mask, or of the fewest further
  suppressions; a new or changed one the class of its recoded tuple under the fewest
  suppressions (least important keys first). Only classes the wave published with ≥ k are
  joined (looked up by keyed digest); none: the record is held until its hold time, then
  withheld.

The state: per respondent ``rs`` = {``d``: digest of the recoded tuple it published in its
newest wave ``w``, ``m``: that publication's mask, ``r``: [wave, digest prefix, mask] of its
last :data:`KEPT_RELEASES` publications (one per wave and recoded tuple; mask -1: withheld)};
per (scope, wave) a registry entry ``rs.<wave>`` (decided), and per class ``rs.<wave>.<digest
of the published tuple>`` with its respondents as the formation size and no live members
(:mod:`gateway.state_store.state_codec`; no respondent is a "member", so the live-count audit sees
nothing to repair). Counts only grow: a class enters the registry at ≥ k and late records join it,
so existence at ≥ k is all a late record needs (a respondent counted twice changes nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.grouping.decision import QIDecision
from gateway.grouping.exact_suppression import Key, apply_mask, present_bits, suppress_exact
from gateway.grouping.live_view import StateView
from gateway.grouping.recode_suppress import recode
from gateway.grouping.release import release_order
from gateway.policy import MISSING_LABEL, AttrType, Policy, published_categories

__all__ = ["KEPT_RELEASES", "RecodeStream", "RecodeWindow", "importance_order"]

KEPT_RELEASES = 4  # publications a respondent's state keeps for replays
WITHHELD = -1
_PREFIX = 8  # digest characters kept per publication

Digest = Callable[[Sequence[Key]], list[str]]
Pool = tuple[int | None, str]  # (scope, release)


@dataclass(frozen=True, slots=True)
class RecodeWindow:
    """A window's inputs, one entry per record."""

    keys: Sequence[bytes | None]  # respondent state keys (None: no respondent id)
    cols: Sequence[Sequence[object]]  # the k claim's inputs, one list per attribute
    releases: Sequence[str]
    scopes: Sequence[int | None]
    expired: Sequence[bool]  # hold time over (or the last flush)


def importance_order(policy: Policy) -> list[int]:
    """The claim's columns, least important (suppressed first) first: the policy's
    ``importance`` reversed; without it, more published values is less important (sdcMicro's
    default, from the policy's domains rather than a wave's data, so it never changes)."""
    names = policy.k_claim
    order = policy.microaggregation.importance
    if order is not None:
        return [names.index(n) for n in reversed(order)]

    def values(j: int) -> int:
        attr = policy.attributes[names[j]]
        if attr.type is AttrType.NUMERIC:
            return len(attr.bins or []) + 1
        return len(published_categories(attr))

    return sorted(range(len(names)), key=lambda j: (-values(j), -j))


def _class_id(pool: Pool, digest: str | None) -> str:
    """A class's registry id (None: the wave's decided marker); scoped ids lead with the
    partition, as every registry id in partition scope does."""
    scope, release = pool
    head = "" if scope is None else f"{scope}."
    return f"{head}rs.{release}" if digest is None else f"{head}rs.{release}.{digest}"


class RecodeStream:
    """Decides windows for a ``recode_suppress`` policy. ``digest``: keyed digests of recoded
    tuples (a missing cell a value of its own)."""

    def __init__(self, policy: Policy, digest: Digest) -> None:
        self.names = policy.k_claim
        self._attrs = [policy.attributes[n] for n in self.names]
        self.k = policy.microaggregation.k
        self.order = importance_order(policy)
        # a mask's cost: its suppressed columns' weights, the most important dearest
        self._weight = [0] * len(self.names)
        for rank, j in enumerate(self.order):
            self._weight[j] = 1 << rank
        self.digest = digest

    def recoded(self, cols: Sequence[Sequence[object]]) -> list[Key]:
        """Each record's keys recoded; a missing value (or the missing category) None."""
        columns = [
            [None if v == MISSING_LABEL else v for v in recode(c, a)]
            for c, a in zip(cols, self._attrs, strict=True)
        ]
        return list(zip(*columns, strict=True))

    def decide(self, w: RecodeWindow, view: StateView, *, sampled: bool) -> QIDecision:
        """The window's decision; respondent states and registry counts are updated in
        ``view`` (the caller writes the touched ones)."""
        d = QIDecision()
        d.sampled = sampled
        recoded = self.recoded(w.cols)
        own = self.digest(recoded)
        pools: dict[Pool, list[int]] = {}
        for i, pool in enumerate(zip(w.scopes, w.releases, strict=True)):
            pools.setdefault(pool, []).append(i)
        view.prefetch(_class_id(p, None) for p in pools)
        masks: dict[int, int] = {}
        for pool in sorted(pools, key=_pool_order):
            step = _Step(self, w, view, d, recoded, own, pool, masks)
            if _class_id(pool, None) in view.sizes:
                step.late(pools[pool])
            else:
                step.release(pools[pool])
        if sampled:
            d.measures.update(self._measures(masks))
        return d

    def candidates(self, values: Key, base: int) -> list[int]:
        """The masks a late record may publish, fewest and least important suppressions
        first: every superset of ``base`` over the cells that hold a value."""
        free = present_bits(values) & ~base
        bits = [j for j in range(len(values)) if free >> j & 1]
        subsets = [0]
        for j in bits:
            subsets += [s | 1 << j for s in subsets]
        weight = self._weight

        def cost(s: int) -> tuple[int, int]:
            return (s.bit_count(), sum(weight[j] for j in bits if s >> j & 1))

        return [base | s for s in sorted(subsets, key=cost)]

    def _measures(self, masks: dict[int, int]) -> dict[str, float]:
        """Suppressed cells per attribute among the window's published records."""
        out = {f"suppressed_cells:{n}": 0.0 for n in self.names}
        for m in masks.values():
            for j, n in enumerate(self.names):
                if m >> j & 1:
                    out[f"suppressed_cells:{n}"] += 1
        out["suppressed_records"] = float(sum(1 for m in masks.values() if m))
        return out


def _pool_order(pool: Pool) -> tuple[bool, int, tuple[int, int], str]:
    scope, release = pool
    return (scope is None, scope or 0, release_order(release), release)


@dataclass(slots=True)
class _Step:
    """One (scope, release) of a window."""

    rs: RecodeStream
    w: RecodeWindow
    view: StateView
    d: QIDecision
    recoded: list[Key]
    own: list[str]
    pool: Pool
    masks: dict[int, int]  # published record -> its mask

    def _entry(self, i: int) -> dict[str, Any] | None:
        key = self.w.keys[i]
        st = self.view.states.get(key) if key is not None else None
        return st.get("rs") if st is not None else None

    def _start(self, i: int) -> int:
        """The mask an unchanged respondent published last (sticky), else none."""
        entry = self._entry(i)
        return int(entry["m"]) if entry is not None and entry.get("d") == self.own[i] else 0

    def release(self, ix: list[int]) -> None:
        """Decide a wave with all its records in hand."""
        k = self.rs.k
        who: list[object] = [self.w.keys[i] if self.w.keys[i] is not None else i for i in ix]
        exact = suppress_exact(
            [self.recoded[i] for i in ix],
            [self._start(i) for i in ix],
            who,
            k=k,
            order=self.rs.order,
        )
        withheld = {ix[j] for j in exact.withheld}
        shown = [(i, m) for i, m in zip(ix, exact.masks, strict=True) if i not in withheld]
        tuples = [apply_mask(self.recoded[i], m) for i, m in shown]
        distinct = list(dict.fromkeys(tuples))
        ids = dict(zip(distinct, map(self._cid, self.rs.digest(distinct)), strict=True))
        respondent = dict(zip(ix, who, strict=True))
        people: dict[str, set[object]] = {}
        for (i, m), t in zip(shown, tuples, strict=True):
            people.setdefault(ids[t], set()).add(respondent[i])
            self._publish(i, m, t, ids[t])
        for cid, members in people.items():
            self._count(cid, len(members))
            self.d.groups.append((cid, len(members)))
        for i in sorted(withheld):
            self._withhold(i)
        self._count(_class_id(self.pool, None), len(set(who)))

    def late(self, ix: list[int]) -> None:
        """Records of a wave decided before: replays publish what they did, others join."""
        recalled: list[tuple[int, int]] = []
        joining: list[tuple[int, list[int]]] = []
        for i in ix:
            kept = self._recall(i)
            if kept == WITHHELD:
                self.d.suppressed.append(i)
            elif kept is not None:
                recalled.append((i, kept))
            else:
                joining.append((i, self.rs.candidates(self.recoded[i], self._start(i))))
        wanted = [apply_mask(self.recoded[i], m) for i, m in recalled]
        wanted += [apply_mask(self.recoded[i], m) for i, ms in joining for m in ms]
        ids = dict(zip(wanted, map(self._cid, self.rs.digest(wanted)), strict=True))
        self.view.prefetch(ids.values())
        for i, m in recalled:
            t = apply_mask(self.recoded[i], m)
            self.d.tuples[i], self.d.group_of[i] = t, ids[t]
            self.masks[i] = m
            self.d.hits += 1
        sizes, k = self.view.sizes, self.rs.k
        for i, ms in joining:
            values = self.recoded[i]
            found = next((m for m in ms if sizes.get(ids[apply_mask(values, m)], 0) >= k), None)
            if found is not None:
                t = apply_mask(self.recoded[i], found)
                self._publish(i, found, t, ids[t])
                self._count(ids[t], sizes[ids[t]] + 1)
            elif self.w.expired[i]:
                self._withhold(i)
            else:
                self.d.held.append(i)

    # -- helpers ------------------------------------------------------------------------
    def _cid(self, digest: str) -> str:
        return _class_id(self.pool, digest)

    def _count(self, cid: str, size: int) -> None:
        """A registry entry's respondents (formation size; no live members)."""
        view = self.view
        view.sizes[cid] = size
        view.live[cid] = 0
        view.live_touched.add(cid)

    def _recall(self, i: int) -> int | None:
        """The mask the record's respondent published in this release (a replay), if kept."""
        entry = self._entry(i)
        release, prefix = self.pool[1], self.own[i][:_PREFIX]
        for kept in entry.get("r", ()) if entry is not None else ():
            if kept[0] == release and kept[1] == prefix:
                return int(kept[2])
        return None

    def _publish(self, i: int, mask: int, t: Key, cid: str) -> None:
        self.d.tuples[i], self.d.group_of[i] = t, cid
        self.masks[i] = mask
        self._remember(i, mask)

    def _withhold(self, i: int) -> None:
        self.d.suppressed.append(i)
        self._remember(i, WITHHELD)

    def _remember(self, i: int, mask: int) -> None:
        """Keep the publication in the respondent's state: sticky mask and replay entry."""
        key = self.w.keys[i]
        if key is None:
            return
        st = self.view.states.setdefault(key, {})
        entry = st.setdefault("rs", {})
        release, prefix = self.pool[1], self.own[i][:_PREFIX]
        # one entry per (release, recoded tuple): a respondent that answered a wave twice,
        # differently, replays both answers
        kept = [e for e in entry.get("r", ()) if e[0] != release or e[1] != prefix]
        kept.append([release, prefix, mask])
        entry["r"] = kept[-KEPT_RELEASES:]
        # the sticky mask is the newest wave's: a late record of an older wave, with other
        # values, must not reset what the respondent suppressed since
        newest = entry.get("w")
        if mask != WITHHELD and (newest is None or release_order(release) >= release_order(newest)):
            entry["d"], entry["m"], entry["w"] = self.own[i], mask, release
        self.view.touched.add(key)


def digests_of(claim_digests: Callable[..., list[str]], attribute: str) -> Digest:
    """A :data:`Digest` over :meth:`gateway.engine.keyed_inputs.KeyedInputs.claim_digests`: a
    missing cell digested as a text no category has."""

    def digest(rows: Sequence[Key]) -> list[str]:
        if not rows:
            return []
        texts = [[v if v is not None else "\x00" for v in r] for r in rows]
        cols = [list(c) for c in zip(*texts, strict=True)]
        return claim_digests(cols, [True] * len(rows), attribute)

    return digest
