"""The k claim of a whole file grouped with strata and l-diversity (``privgw protect`` with
``microaggregation.strata`` / ``microaggregation.l_diversity``): mixed MDAV within each
stratum, then groups merged until l-diverse, each group publishing one centroid tuple."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from gateway.grouping.l_diversity import enforce_l_diversity
from gateway.grouping.mixed_microaggregation import (
    claim_columns,
    embed,
    mixed_centroids,
    mixed_microaggregate,
)
from gateway.grouping.strata import stratified_groups, stratum_ids
from gateway.measures.frequency_risk import key_codes
from gateway.policy import Policy

Int = NDArray[np.int64]


@dataclass(frozen=True)
class GroupedClaim:
    published: pd.DataFrame  # the claim's columns as published (None: suppressed)
    labels: Int  # group of each record, −1 = published with its quasi-identifiers suppressed
    report: dict[str, Any]


def group_claim(
    claim: pd.DataFrame,
    policy: Policy,
    strata: Sequence[Sequence[object]] = (),
    sensitive: pd.Series | None = None,
) -> GroupedClaim:
    """Group ``claim`` (the k claim's columns as the partition takes them) by the policy's k,
    within ``strata`` (value columns, one per strata attribute), then l-diverse on
    ``sensitive`` (the published sensitive values) when the policy asks for it."""
    spec = policy.microaggregation
    k = spec.k
    columns = claim_columns(policy)
    names = [c.name for c in columns]
    n = len(claim)
    complete = claim[names].notna().all(axis=1).to_numpy()
    rows = np.flatnonzero(complete)
    values = [claim[name].to_numpy(dtype=object)[rows].tolist() for name in names]

    def group(local_rows: Int) -> Int:
        sub = [[v[i] for i in local_rows] for v in values]
        return mixed_microaggregate(columns, sub, k, standardize=spec.standardize)[1]

    report: dict[str, Any] = {"k": k, "incomplete_records_suppressed": int(n - rows.size)}
    if strata:
        ids = stratum_ids([[col[int(i)] for i in rows] for col in strata], rows.size)
        res = stratified_groups(ids, k, group, small=spec.small_strata)
        local = res.labels
        report["strata"] = {
            "strata": res.strata,
            "small_strata": res.small_strata,
            "records_in_small_strata": res.records_in_small_strata,
            "small_strata_handling": spec.small_strata.value,
        }
    else:
        local = group(np.arange(rows.size)) if rows.size else np.zeros(0, dtype=np.int64)
    if spec.l_diversity is not None and sensitive is not None and rows.size:
        codes = key_codes(pd.DataFrame({"s": sensitive.to_numpy(dtype=object)[rows]}), ["s"])
        embedded = embed(columns, values, standardize=spec.standardize)
        ld = enforce_l_diversity(local, codes[:, 0], embedded, spec.l_diversity.l)
        local = ld.labels
        report["l_diversity"] = {
            "attribute": spec.l_diversity.attribute,
            "l": spec.l_diversity.l,
            "groups_below_l_before": ld.groups_below_l_before,
            "merges": ld.merges,
        }
    labels = np.full(n, -1, dtype=np.int64)
    labels[rows] = local
    published = pd.DataFrame({name: [None] * n for name in names}, index=claim.index, dtype=object)
    grouped = local >= 0
    if grouped.any():
        _, dense = np.unique(local[grouped], return_inverse=True)
        sub = [[v[i] for i in np.flatnonzero(grouped)] for v in values]
        centroids = mixed_centroids(columns, sub, dense.reshape(-1).astype(np.int64))
        at = rows[grouped]
        for name, col in zip(names, centroids, strict=True):
            published.iloc[at, names.index(name)] = np.asarray(col, dtype=object)
    sizes = np.bincount(labels[labels >= 0]) if (labels >= 0).any() else np.zeros(0, int)
    report["groups"] = int((sizes > 0).sum())
    report["smallest_group"] = int(sizes[sizes > 0].min()) if sizes.size else 0
    report["suppressed_records"] = int((labels < 0).sum())
    return GroupedClaim(published=published, labels=labels, report=report)
