"""Global recoding then local suppression to k, the non-perturbative route for the k claim
(sdcMicro's ``globalRecode``/``groupAndRename`` then ``kAnon``).

Every key is recoded first, for all records alike: a categorical key climbs its policy
hierarchy (method ``generalize``), a numeric key becomes the interval of its ``bins`` that
holds it (``[25,35)``; ``<25`` and ``>=55`` at the ends). Then cells are suppressed
(:mod:`gateway.mechanisms.local_suppression`) until every record matches at least k records, a
missing value matching any category (sdcMicro's convention). No published value is wrong: a value is
its own category or interval, or missing. Pure functions on a window held as columns; the file
workflow uses them through :func:`protect_keys`; the stream engine recodes with
:func:`recode` and suppresses to exact-tuple k per wave (:mod:`gateway.grouping.recode_stream`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gateway.measures.frequency_risk import MISSING, key_codes
from gateway.mechanisms.local_suppression import Suppression, suppress_to_k
from gateway.policy import Attribute, AttrType, Method, MicroaggAlgorithm, Policy

__all__ = ["RecodedRelease", "engine_policy", "interval_label", "protect_keys", "recode"]


def interval_label(value: float, bins: Sequence[float]) -> str:
    """The interval of ``bins`` holding ``value``: ``<b0``, ``[b0,b1)``, …, ``>=bn``."""
    i = bisect_right(list(bins), value)
    if i == 0:
        return f"<{bins[0]:g}"
    if i == len(bins):
        return f">={bins[-1]:g}"
    return f"[{bins[i - 1]:g},{bins[i]:g})"


def recode(column: Sequence[object], attr: Attribute) -> list[str | None]:
    """A claim column (as :func:`gateway.files.evaluate.claim_frame` gives it for the original:
    numbers as floats, categories already generalized) globally recoded."""
    if attr.type is AttrType.NUMERIC:
        assert attr.bins is not None
        return [None if v is None else interval_label(float(v), attr.bins) for v in column]  # type: ignore[arg-type]
    return [None if v is None else str(v) for v in column]


@dataclass(frozen=True)
class RecodedRelease:
    keys: tuple[str, ...]
    published: pd.DataFrame  # the keys as published: recoded, None where suppressed
    suppression: Suppression

    def summary(self) -> dict[str, Any]:
        s = self.suppression
        return {
            "method": "recode_suppress",
            "keys": list(self.keys),
            "suppressed_cells": s.cells,
            "suppressed_records": s.records,
            "suppressed_per_key": s.per_key(self.keys),
            "min_matches": int(s.fk.min()) if s.fk.size else 0,
        }


def protect_keys(claim: pd.DataFrame, policy: Policy) -> RecodedRelease:
    """Recode and suppress the k claim's columns of ``claim`` (original values, generalized
    categories) to the policy's k, with its importance order."""
    keys = tuple(policy.k_claim)
    recoded = pd.DataFrame(
        {n: recode(claim[n].tolist(), policy.attributes[n]) for n in keys}, index=claim.index
    )
    codes = key_codes(recoded, keys)
    order = policy.microaggregation.importance
    importance = [order.index(n) + 1 for n in keys] if order is not None else None
    result = suppress_to_k(codes, policy.microaggregation.k, importance)
    published = recoded.astype(object)
    for j, name in enumerate(keys):
        published.loc[result.codes[:, j] == MISSING, name] = None
    return RecodedRelease(keys=keys, published=published, suppression=result)


def engine_policy(policy: Policy) -> Policy:
    """The policy the engine runs for everything but the keys: each key of the claim kept as
    it is (declared unprotected there), since :func:`protect_keys` publishes them."""
    attrs = dict(policy.attributes)
    for name in policy.k_claim:
        attrs[name] = attrs[name].model_copy(
            update={
                "method": Method.KEEP,
                "unprotected": True,
                "hierarchy": None,
                "bins": None,
            }
        )
    spec = policy.microaggregation.model_copy(
        update={
            "algorithm": MicroaggAlgorithm.MDAV,
            "importance": None,
            "strata": None,
            "l_diversity": None,
        }
    )
    return policy.model_copy(update={"attributes": attrs, "microaggregation": spec})


def strict_classes_below_k(published: pd.DataFrame, keys: Sequence[str], k: int) -> int:
    """Records whose exact published tuple (a suppressed cell a value of its own) is shared by
    fewer than k records: the stricter count the stream's invariant uses."""
    filled = published[list(keys)].astype(object).where(published[list(keys)].notna(), "\0")
    sizes = filled.groupby(list(keys), dropna=False)[keys[0]].transform("size")
    return int((np.asarray(sizes) < k).sum())
