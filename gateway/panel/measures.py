"""What the engine measures of a panel window's releases, under the names every mode reports
(the dashboard's utility and risk rows): utility and interval-disclosure risk of the numeric
quasi-identifiers over the present members (true against published values; an imputed
record has no current truth), and risk over the whole key and the published sensitive values
over every published record, present or imputed, class by class within its wave's release."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.measures.attack import unique_combinations
from gateway.measures.window_risk import window_measures


@dataclass(frozen=True, slots=True)
class PanelMeasureSpec:
    wave: str
    claim: Sequence[str]
    numeric: Sequence[str]
    sensitive: Sequence[str]
    k: int
    p_pct: float


def panel_measures(
    spec: PanelMeasureSpec,
    names: Sequence[str],
    cols: Sequence[Sequence[Any]],
    pub_idx: Sequence[int],
    truth: Mapping[str, Sequence[Any]],
    *,
    n_in: int,
    suppressed: set[int],
) -> dict[str, float]:
    """``names``/``cols``: the published columns, aligned with ``pub_idx`` (below ``n_in``: a
    present record, whose true values are ``truth[name][i]``; from ``n_in``: an imputed one)."""
    by_name = dict(zip(names, cols, strict=True))
    rows = [j for j, i in enumerate(pub_idx) if i not in suppressed]
    out: dict[str, float] = {
        "key_records": float(len(rows)),
        "key_suppressed": float(len(suppressed)),
    }
    present = [j for j in rows if pub_idx[j] < n_in]
    if spec.numeric and len(present) > 1:
        x = np.array([[truth[n][pub_idx[j]] for n in spec.numeric] for j in present], dtype=float)
        masked = np.array([[by_name[n][j] for n in spec.numeric] for j in present], dtype=float)
        ok = np.isfinite(x).all(axis=1) & np.isfinite(masked).all(axis=1)
        out.update(window_measures(x[ok], masked[ok], spec.p_pct))
    if not rows:
        return out
    waves = by_name[spec.wave]
    tuples = [(waves[j], *(by_name[n][j] for n in spec.claim)) for j in rows]
    sizes = Counter(tuples)
    n = len(rows)
    out["key_smallest_class"] = float(min(sizes.values()))
    out["key_share_below_k"] = sum(c for c in sizes.values() if c < spec.k) / n
    out["key_uniques"] = float(sum(1 for c in sizes.values() if c == 1))
    # Σ 1/fk over the release's records: one per class (a cohort keeps its tuple over waves)
    out["key_expected_reidentifications"] = float(len(sizes))
    out["key_global_risk"] = len(sizes) / n
    for name in spec.sensitive:
        values = by_name[name]
        distinct = Counter(t for t, _ in set(zip(tuples, (values[j] for j in rows), strict=True)))
        out[f"ldiv_min:{name}"] = float(min(distinct.values()))
    if spec.sensitive:
        out["sensitive_records"] = float(n)
        out["sensitive_uniques"] = float(
            unique_combinations([[by_name[s][j] for j in rows] for s in spec.sensitive])
        )
    return out
