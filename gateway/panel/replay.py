"""A decided wave's records read again: republished as the wave published them, or dropped."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gateway.panel.imputed import PanelWindow
from gateway.panel.measures import combine_measure
from gateway.panel.plan import WindowPlan, read_before
from gateway.panel.roster import Roster


def replay_wave(
    roster: Roster,
    wave: int,
    idx: list[int],
    pw: PanelWindow,
    plan: WindowPlan,
    *,
    id_of: Callable[[int], str],
) -> None:
    """A decided wave again: when the wave's own records are read again (a restart may have
    lost the outputs), each record its member's class as published and every imputed record
    of it too, as stored (the same ids and bytes: a consumer keeps one). A late copy of a
    member's record, appended after the wave was decided, is dropped as a repeat: its record
    was published; republished alone it told that its member answered the wave, where an
    absent member's late record is dropped (its imputed record stands for it)."""
    outcome = roster.outcome_of(wave)
    assert outcome is not None
    imputed = set(outcome.imputed_members)
    classes = np.asarray(outcome.class_of)
    sizes = np.bincount(classes[classes >= 0])  # every member's class, imputed too
    seen: set[bytes] = set()
    late = 0
    for i in idx:
        key = pw.rkeys[i]
        row = None if key is None else roster.row_of(key)
        cls = -1 if row is None or row >= len(outcome.class_of) else int(outcome.class_of[row])
        if row is not None and row in imputed:
            plan.dropped.add(i)  # its imputed record stands for it
            continue
        if row is not None and not read_before(pw.records[i].source, outcome.through):
            plan.dropped.add(i)  # a late copy: the member's record of the wave stands
            late += 1
            continue
        if key is not None and key in seen:
            plan.dropped.add(i)  # a repeat, as when the wave was decided
            continue
        if key is not None:
            seen.add(key)
        plan.ids[i] = id_of(i)
        if cls < 0:
            plan.suppressed.append(i)
        else:
            plan.tuples[i], plan.weights[i] = outcome.tuples[cls], outcome.weights[cls]
            plan.release_sizes[i] = int(sizes[cls])
    if late:
        old = plan.measures.get("panel_repeats")
        plan.measures["panel_repeats"] = combine_measure("panel_repeats", old, float(late))
    # the imputed records again only when the wave's own records are read again: re-sent
    # for a late copy, they would single out which records stand for absent members
    if outcome.imputed_rids and any(
        read_before(pw.records[i].source, outcome.through) for i in idx
    ):
        plan.replayed.append((outcome.imputed_names, outcome.imputed_rows, outcome.imputed_rids))
