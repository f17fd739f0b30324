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
) -> dict[str, Any]:
    """Estimated true distributions of the randomized attributes from published rows;
    ``weight``: the rows' analysis weight (a panel release's), if they carry one."""
    out: dict[str, Any] = {}
    for name, mech in mechanisms.items():
        kept = [r for r in rows if name in r]
        weights = None
        if weight is not None and kept and all(r.get(weight) is not None for r in kept):
            weights = [float(r[weight]) for r in kept]
        est = reconstruct_column(name, [r[name] for r in kept], mech, weights)
        if est is not None:
            out[name] = est.to_dict() if hasattr(est, "to_dict") else _estimate_dict(est)
    return out


def reconstruct_column(
    name: str,
    values: Sequence[object],
    mech: RRMechanism,
    weights: Sequence[float] | None = None,
) -> DistributionEstimate | None:
    """Both estimates of one randomized column's true distribution from its published values
    (a missing value counts as the missing category where the mechanism has one); None when
    no value counts. ``privgw reconstruct`` and the utility report both take this.

    ``weights``: analysis weights (a panel release's), one per value. The observed shares are
    then weighted, and counted over Kish's effective sample size (Σw)² / Σw², so the standard
    errors carry the weights' design effect."""
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
        return reconstruct(mech, coded)
    w = np.asarray(kept_weights, dtype=np.float64)
    effective = float(w.sum()) ** 2 / float(np.square(w).sum())
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
