"""A window's respondent states, written back before its outputs leave (DESIGN §6: a crash
replays from the last commit against this state). A respondent's entry is written when it is
new, when something published for it changes, and under every mode with what each record
published for a replay (:mod:`gateway.grouping.replay`); a group's entry when its live count
or, under ``regroup`` and ``cohort``, its registry entry changed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.grouping.decision import QIDecision
from gateway.grouping.live_view import StateView
from gateway.grouping.registry import Group
from gateway.grouping.replay import Committed, remember
from gateway.state_store.state_api import StateStore
from gateway.state_store.state_codec import encode_state, registry_value
from gateway.state_store.state_keys import group_key


def write_states(
    store: StateStore,
    view: StateView,
    qi: QIDecision,
    regroups: Mapping[str, Group],
    *,
    published: Sequence[int],
    rkeys: Sequence[bytes | None],
    rids: Sequence[str],
    waves: Sequence[Any],
    republish: bool,
    stratum_digests: Sequence[str] | None,
    committed: Committed | None,
) -> None:
    """Update the states of the ``published`` records' respondents and write every changed
    entry in one batch. ``republish``: the regroup and cohort modes, whose decision updated the
    respondents' grouping entries itself."""
    states, touched = view.states, view.touched
    outcomes, done = qi.outcomes, committed or {}
    for i in published:
        rkey = rkeys[i]
        if rkey is None:
            continue
        st = states.get(rkey)
        if st is None:
            st = states[rkey] = {}
            touched.add(rkey)
        if _first_wave(st, waves[i]):
            touched.add(rkey)
        kept = outcomes.get(i)
        if kept is not None:  # what it published, for a replay
            remember(st, rids[i], kept[0], kept[1], done)
            touched.add(rkey)
        if not republish and _deferred_entries(st, qi, i, strata=stratum_digests):
            touched.add(rkey)
    for i in qi.departed:  # no longer a live member of the group it left
        rkey = rkeys[i]
        st = states.get(rkey) if rkey is not None else None
        if rkey is not None and st is not None and st.pop("current", None) is not None:
            touched.add(rkey)
    entries = {key: encode_state(states[key]) for key in touched}
    for gid in view.live_touched:
        entries[group_key(gid)] = registry_value(view.live[gid], view.sizes.get(gid))
    for gid, grp in regroups.items():
        if grp.changed:
            entries[group_key(gid)] = encode_state(grp.to_doc())
    if entries:
        store.put_many(entries)


def _first_wave(st: dict[str, Any], wave: Any) -> bool:
    """Keep the first wave the respondent was seen in; whether it changed."""
    if isinstance(wave, int | float) and math.isfinite(float(wave)):
        w = int(wave)
        if w < st.get("first_wave", math.inf):
            st["first_wave"] = w
            return True
    return False


def _deferred_entries(
    st: dict[str, Any], qi: QIDecision, i: int, *, strata: Sequence[str] | None
) -> bool:
    """The deferred mode's entries for record ``i``: the tuple stored for its claim digest
    and its current group. Returns whether the state changed."""
    digests, group_of, current_digest = qi.digests, qi.group_of, qi.current_digest
    if i in qi.unchanged or i not in group_of or i not in digests:
        return False  # stored as they are (replays among them)
    digest, gid = digests[i], group_of[i]
    changed = False
    if i not in current_digest:  # a deferred move keeps its old mapping
        known = st.setdefault("qi", {})
        if digest not in known:
            known[digest] = [gid, list(qi.tuples[i])]
            changed = True
    current = [gid, current_digest.get(i, digest)]
    if strata is not None:  # a deferred move never leaves it
        current.append(strata[i])
    if st.get("current") != current:
        st["current"] = current
        changed = True
    return changed
