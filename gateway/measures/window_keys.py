"""Risk over the whole key for a sampled window's published records: class sizes over the
history (a lower bound from the groups' formation sizes), records below k, uniques, expected
re-identifications and global risk, and l-diversity within the window's new groups."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import compress
from typing import Any, cast

from gateway.grouping.decision import QIDecision
from gateway.grouping.live_view import StateView


def key_measures(
    published: Mapping[str, Sequence[Any]],
    pub_idx: Sequence[int],
    qi: QIDecision,
    view: StateView,
    suppressed: set[int],
    *,
    k: int,
    claim: Sequence[str],
    sensitive: Sequence[str],
) -> dict[str, float]:
    """Risk over the whole key for a sampled window's published records (``published``:
    the published values by attribute, aligned with ``pub_idx``).

    A published tuple's class over the whole history is at least the largest formation
    size among the groups that publish it (a group's members keep its tuple; departures do
    not unpublish it), so ``key_smallest_class`` is a lower bound that holds over the
    history, not only within the window. Fully suppressed records carry no
    quasi-identifier value and are counted apart (``key_suppressed``). l-diversity is
    measured within the groups formed in this window, whose members are all here."""
    group_of = qi.group_of
    sizes = view.sizes  # the engine's, kept across windows
    gids = [group_of.get(i) for i in pub_idx]
    grouped = (
        [g is not None and i not in suppressed for g, i in zip(gids, pub_idx, strict=True)]
        if suppressed
        else [g is not None for g in gids]
    )
    view.prefetch({g for g in compress(gids, grouped) if g is not None and g not in sizes})
    tuples = zip(*(published[n] for n in claim), strict=True)
    known = [g in sizes for g in gids]  # else formed before formation sizes were kept
    counted = [a and b for a, b in zip(grouped, known, strict=True)]
    # (published tuple, group) -> records: the tuple is read from what is published, so a
    # group whose members published different tuples would show, not be assumed away
    pairs = cast(
        "Counter[tuple[tuple[Any, ...], str]]",
        Counter(compress(zip(tuples, gids, strict=True), counted)),
    )
    n = sum(pairs.values())
    groups_of_tuple: dict[tuple[Any, ...], list[str]] = {}
    for t, gid in pairs:
        groups_of_tuple.setdefault(t, []).append(gid)
    # the largest group publishing a tuple: its members are distinct respondents (a sum
    # could count a respondent who was in two such groups twice)
    size_of = sizes.__getitem__
    bound = {t: max(map(size_of, gids)) for t, gids in groups_of_tuple.items()}
    out: dict[str, float] = {
        "key_records": float(n),
        "key_suppressed": float(len(suppressed)),
        "key_unknown_class": float(sum(grouped) - n),
    }
    if n:
        classes = [(bound[t], count) for (t, _), count in pairs.items()]
        out["key_smallest_class"] = float(min(c for c, _ in classes))
        out["key_share_below_k"] = sum(m for c, m in classes if c < k) / n
        out["key_uniques"] = float(sum(m for c, m in classes if c == 1))
        # sdcMicro's risk_ER without weights: Σ 1/fk over the release's records, fk the
        # tuple's class over the history (the bound above: a release may hold only some
        # of a class, whose other members an intruder with the history still sees)
        expected = sum(m / c for c, m in classes)
        out["key_expected_reidentifications"] = expected
        out["key_global_risk"] = expected / n
    formed = {gid for gid, _ in qi.groups}
    if formed:
        in_formed = [a and g in formed for a, g in zip(grouped, gids, strict=True)]
        for name in sensitive:
            # distinct (group, value) pairs, then distinct values per group
            distinct = Counter(
                g for g, _ in set(compress(zip(gids, published[name], strict=True), in_formed))
            )
            if distinct:
                out[f"ldiv_min:{name}"] = float(min(distinct.values()))
    return out
