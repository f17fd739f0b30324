"""What a republication decision measures of the window it publishes: each published member's
linked candidate set (:mod:`gateway.grouping.registry`), how far behind its current values a
published tuple is, and the smallest class (and l-diversity) in each release it published in."""

from __future__ import annotations

from typing import Any

from gateway.grouping.registry import linked_size
from gateway.grouping.window_work import WindowWork


def measure(win: WindowWork, k: int, ell: int | None) -> None:
    """Linked candidate sets, freshness and per-release class sizes of what the window
    publishes, into its decision's measures (``ell``: the policy's l, if any)."""
    w, d = win.w, win.decision
    sizes: list[int] = []
    suppressed = set(d.suppressed)
    keys, states, groups = w.keys, win.states, win.groups
    nothing: dict[str, Any] = {}
    for i, gid in d.group_of.items():
        key = keys[i]
        if key is None or i in suppressed or i in win.replayed:
            continue  # a replay's linkage was measured when it was first decided
        st = states.get(key, nothing)
        g = st.get("g")
        if g is None or g[0] != gid:
            continue
        grp = groups[gid]
        carried = st.get("x")
        if carried is None:  # never moved: its set lies within its group
            sizes.append(grp.linked_mask(g[2]).bit_count())
        elif not carried:  # linked to itself alone since it moved
            sizes.append(1)
        else:
            sizes.append(linked_size(grp, g[2], carried))
    m = d.measures
    m["linked_records"] = float(len(sizes))
    m["linked_below_k"] = float(sum(size < k for size in sizes))
    if sizes:
        m["linked_smallest"] = float(min(sizes))
    m["stale_records"] = float(len(win.stale))
    m["stale_age_max"] = float(max(win.stale.values(), default=0))
    if win.published_groups:
        classes = win.published_groups.values()
        m["release_smallest_class"] = float(min(size for size, _ in classes))
        if ell is not None:  # distinct published values of the classes, per release
            m["release_ldiv_min"] = float(min(values for _, values in classes))
