"""Reading what was published: a published cell's category code, the randomized-response
mechanisms its metadata names, and the true distributions reconstructed from published rows
(``privgw reconstruct``, the utility report, :mod:`gateway.measures.versioned_counts`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from typing import Any

import numpy as np

from gateway.errors import InputDataError
from gateway.measures.reconstruction import DistributionEstimate, reconstruct
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.policy import MISSING_LABEL


def is_missing(v: object, tokens: Set[str] = frozenset()) -> bool:
    """A cell that holds no value: None, NaN (pandas' empty cell) or a missing token."""
    return v is None or (isinstance(v, float) and math.isnan(v)) or str(v) in tokens


def published_code(v: object, index: Mapping[str, int]) -> int | None:
    """The category code of a published value: the missing category's for a missing value
    (None where there is none: not counted), -1 for a value outside the categories."""
    if is_missing(v):
        return index.get(MISSING_LABEL)
    return index.get(v if isinstance(v, str) else str(v), -1)


def mechanisms_from_meta(meta: Mapping[str, Any]) -> dict[str, RRMechanism]:
    rr = meta.get("randomized_response", {})
    if not isinstance(rr, dict):
        raise InputDataError("metadata has no randomized_response section")
    return {name: RRMechanism.from_dict(d) for name, d in rr.items()}


def reconstruct_rows(
    rows: Sequence[Mapping[str, Any]],
    mechanisms: Mapping[str, RRMechanism],
    weight: str | None = None,
    wave: str | None = None,
) -> dict[str, Any]:
    """Estimated true distributions of the randomized attributes from published rows;
    ``weight``: the rows' analysis weight (a panel release's), if they carry one; ``wave``:
    the field naming each row's release, whose count divides the sample size the standard
    errors count (:func:`releases_note`)."""
    out: dict[str, Any] = {}
    for name, mech in mechanisms.items():
        kept = [r for r in rows if name in r]
        weights = None
        if weight is not None and kept and all(r.get(weight) is not None for r in kept):
            weights = [float(r[weight]) for r in kept]
        values = [r[name] for r in kept]
        releases = 1
        if wave is not None:
            releases = max(1, len({r.get(wave) for r in kept} - {None}))
        est = reconstruct_column(name, values, mech, weights, releases=releases)
        if est is not None:
            entry: dict[str, Any] = dict(
                est.to_dict() if hasattr(est, "to_dict") else _estimate_dict(est)
            )
            if releases > 1:
                entry["releases"] = releases
                entry.setdefault("notes", []).append(releases_note(releases))
            out[name] = entry
    return out


def releases_note(releases: int) -> str:
    """Why rows of several releases count as fewer: a respondent's randomized answer is drawn
    once and published again in every release, so its rows are copies, not new draws. With at
    most one row a release per respondent, R rows over W releases are worth at least R / W
    independent ones (the Kish size of rows repeated up to W times), which the standard errors
    count: an upper bound on the error, exact when every respondent answers alike every time."""
    return (
        f"the rows span {releases} releases, and a respondent's randomized answer repeats in "
        f"each: the standard errors count 1/{releases} of the rows (conservative); --wave N "
        "estimates one release"
    )


def reconstruct_column(
    name: str,
    values: Sequence[object],
    mech: RRMechanism,
    weights: Sequence[float] | None = None,
    *,
    releases: int = 1,
) -> DistributionEstimate | None:
    """Both estimates of one randomized column's true distribution from its published values
    (a missing value counts as the missing category where the mechanism has one); None when
    no value counts. ``privgw reconstruct`` and the utility report both take this.

    ``weights``: analysis weights (a panel release's), one per value. The observed shares are
    then weighted, and counted over Kish's effective sample size (Σw)² / Σw², so the standard
    errors carry the weights' design effect. ``releases``: how many releases the values span
    (:func:`releases_note`): the size counted is divided by it."""
    index = {c: i for i, c in enumerate(mech.categories)}
    codes = []
    kept_weights = []
    for at, v in enumerate(values):
        code = published_code(v, index)
        if code == -1:
            raise InputDataError(
                f"published column '{name}' has values outside the published categories"
            )
        if code is not None:
            codes.append(code)
            if weights is not None:
                kept_weights.append(weights[at])
    if not codes:
        return None
    coded = np.array(codes, dtype=np.int64)
    if weights is None:
        if releases == 1:
            return reconstruct(mech, coded)
        return reconstruct(mech, np.bincount(coded, minlength=mech.m) / releases, counts=True)
    w = np.asarray(kept_weights, dtype=np.float64)
    effective = float(w.sum()) ** 2 / float(np.square(w).sum()) / releases
    shares = np.bincount(coded, weights=w, minlength=mech.m) / float(w.sum())
    return reconstruct(mech, shares * effective, counts=True)


def _estimate_dict(est: Any) -> dict[str, Any]:
    return {
        "categories": list(est.categories),
        "n": int(est.n),
        "observed": np.asarray(est.observed).tolist(),
        "inversion": np.asarray(est.inversion).tolist(),
        "inversion_se": np.asarray(est.inversion_se).tolist(),
        "em": np.asarray(est.em).tolist(),
        "em_se": np.asarray(est.em_se).tolist(),
    }
