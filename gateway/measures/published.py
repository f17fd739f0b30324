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
    rows: Sequence[Mapping[str, Any]], mechanisms: Mapping[str, RRMechanism]
) -> dict[str, Any]:
    """Estimated true distributions of the randomized attributes from published rows."""
    out: dict[str, Any] = {}
    for name, mech in mechanisms.items():
        est = reconstruct_column(name, [r[name] for r in rows if name in r], mech)
        if est is not None:
            out[name] = est.to_dict() if hasattr(est, "to_dict") else _estimate_dict(est)
    return out


def reconstruct_column(
    name: str, values: Sequence[object], mech: RRMechanism
) -> DistributionEstimate | None:
    """Both estimates of one randomized column's true distribution from its published values
    (a missing value counts as the missing category where the mechanism has one); None when
    no value counts. ``privgw reconstruct`` and the utility report both take this."""
    index = {c: i for i, c in enumerate(mech.categories)}
    codes = []
    for v in values:
        code = published_code(v, index)
        if code == -1:
            raise InputDataError(
                f"published column '{name}' has values outside the published categories"
            )
        if code is not None:
            codes.append(code)
    if not codes:
        return None
    return reconstruct(mech, np.array(codes, dtype=np.int64))


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
