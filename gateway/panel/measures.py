"""What the engine measures of a panel window's releases, under the names every mode reports
(the dashboard's utility and risk rows): utility and interval-disclosure risk of the numeric
quasi-identifiers over the present members (true against published values; an imputed
record has no current truth), and risk over the whole key and the published sensitive values
over every published record, present or imputed, class by class within its wave's release."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from gateway.measures.key_risk import combine_codes, l_diversity, value_codes
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
    release_sizes: Mapping[int, int] | None = None,
) -> dict[str, float]:
    """``names``/``cols``: the published columns, aligned with ``pub_idx`` (below ``n_in``: a
    present record, whose true values are ``truth[name][i]``; from ``n_in``: an imputed one).
    Classes are counted on codes, not on tuples of values (a window's release holds every
    active member: the per-record tuples were the largest cost of the panel's measures).
    ``release_sizes``: for a record republished from its wave's stored outcome (a record
    read again), its class's size in that release, of which the window holds only part."""
    by_name = dict(zip(names, cols, strict=True))
    idx = np.asarray(pub_idx, dtype=np.int64)
    shown = ~np.isin(idx, np.fromiter(suppressed, dtype=np.int64, count=len(suppressed)))
    rows = np.flatnonzero(shown)
    out: dict[str, float] = {
        "key_records": float(rows.size),
        "key_suppressed": float(len(suppressed)),
    }
    present = rows[idx[rows] < n_in]
    if spec.numeric and present.size > 1:
        # (None: NaN, which the measures leave out)
        x = np.column_stack([np.asarray(truth[n], dtype=float)[idx[present]] for n in spec.numeric])
        masked = np.column_stack(
            [np.asarray(by_name[n], dtype=float)[present] for n in spec.numeric]
        )
        ok = np.isfinite(x).all(axis=1) & np.isfinite(masked).all(axis=1)
        out.update(window_measures(x[ok], masked[ok], spec.p_pct))
    if not rows.size:
        return out
    n = rows.size
    codes = [_codes_at(by_name[name], rows) for name in (spec.wave, *spec.claim)]
    classes, count = combine_codes(codes, n)
    counts = np.bincount(classes, minlength=count)  # the window's records by class
    sizes = _release_sizes(counts, classes, idx[rows], release_sizes or {})
    out["key_smallest_class"] = float(sizes.min())
    out["key_share_below_k"] = int(counts[sizes < spec.k].sum()) / n
    out["key_uniques"] = float(np.count_nonzero(sizes == 1))
    # Σ 1/fk over the release's records: one per class when the window holds the release
    # (a cohort keeps its tuple over waves)
    expected = float((counts / sizes).sum())
    out["key_expected_reidentifications"] = expected
    out["key_global_risk"] = expected / n
    sensitive = [_codes_at(by_name[name], rows) for name in spec.sensitive]
    for name, values in zip(spec.sensitive, sensitive, strict=True):
        out[f"ldiv_min:{name}"] = float(l_diversity(classes, count, counts, values).min_l)
    if spec.sensitive:
        combos, m = combine_codes(sensitive, n)
        out["sensitive_records"] = float(n)
        out["sensitive_uniques"] = float(np.count_nonzero(np.bincount(combos, minlength=m) == 1))
    return out


def _release_sizes(
    counts: NDArray[np.int64],
    classes: NDArray[np.int64],
    at: NDArray[np.int64],
    release_sizes: Mapping[int, int],
) -> NDArray[np.int64]:
    """Each class's size in its release: the window's count, or more where a record of it was
    republished from a release the window holds only part of."""
    if not release_sizes:
        return counts
    sizes = counts.copy()
    for j in np.flatnonzero(np.isin(at, np.fromiter(release_sizes, dtype=np.int64))):
        c = classes[j]
        sizes[c] = max(sizes[c], release_sizes[int(at[j])])
    return sizes


def _codes_at(values: Sequence[Any], rows: NDArray[np.int64]) -> NDArray[np.int64]:
    """Dense codes of a published column at ``rows`` (equal values, one code; every missing
    value one code of its own kind, as key_risk counts them)."""
    return value_codes(pd.Series(np.asarray(values, dtype=object)[rows], dtype=object))


def combine_measure(name: str, old: float | None, new: float) -> float:
    """A measure over several waves or scopes of one window: the worst, or the sum."""
    if old is None:
        return new
    if name in (
        "linked_smallest",
        "linked_promised",
        "release_smallest_class",
        "panel_raking_converged",
    ):
        return min(old, new)
    if name.startswith("panel_") and name not in (
        "panel_weight_deff",
        "panel_calibration_deff",
        "panel_marginal_gap",
        "panel_stale_ratio",
    ):
        return old + new
    if name in ("linked_records", "linked_below_k"):
        return old + new
    return max(old, new)
