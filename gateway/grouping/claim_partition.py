"""How the k claim's rows are grouped and what each group publishes: MDAV over every claim
column together (mixed numeric and categorical, Domingo-Ferrer & Torra 2005, with the policy's
edit rules), or individual ranking when the policy allows it on a single numeric column."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from gateway.grouping.decision import published_column
from gateway.grouping.microaggregation import microaggregate
from gateway.grouping.mixed_microaggregation import (
    EditRule,
    QIKind,
    claim_columns,
    mixed_group_centroids,
    mixed_microaggregate,
)
from gateway.policy import MicroaggAlgorithm, Policy


class ClaimPartition:
    """The policy's partition of k-claim rows (one list per claim column) into groups."""

    __slots__ = ("columns", "numeric", "numeric_pos", "rules", "spec")

    def __init__(self, policy: Policy) -> None:
        self.spec = policy.microaggregation
        self.columns = claim_columns(policy)
        self.numeric = [c.kind is QIKind.NUMERIC for c in self.columns]
        self.numeric_pos = [j for j, numeric in enumerate(self.numeric) if numeric]
        self.rules = [EditRule.of(rule) for rule in self.spec.edit_rules]

    def partition(
        self, sub: list[list[object]], k: int | None = None, *, refine: bool | None = None
    ) -> tuple[list[list[object]], NDArray[np.int64]]:
        """Group the rows in groups of ``k`` (default: the policy's) or more and give each
        row's published values. ``refine`` (default: the policy's ``refine: true``): MDAV's
        groups improved by exchanges between neighbouring groups."""
        spec = self.spec
        size = spec.k if k is None else k
        if spec.algorithm is MicroaggAlgorithm.RANKING:  # the policy allows one numeric column
            masked, labels = microaggregate(
                np.array(sub, dtype=np.float64).T, size, algorithm="ranking"
            )
            return [masked[:, 0].tolist()], labels[:, 0]
        return mixed_microaggregate(
            self.columns,
            sub,
            size,
            standardize=spec.standardize,
            rules=self.rules,
            refine=spec.refine is True if refine is None else refine,
        )

    def cohorts(self, sub: list[list[object]], k: int) -> NDArray[np.int64]:
        """Groups of ``k``..2k-1 rows meant to last (the panel's cohorts): refined unless the
        policy says ``refine: false``, worth the extra pass because the groups are published
        for many waves."""
        return self.partition(sub, k, refine=self.spec.refine is not False)[1]

    def centroids(self, rows: list[list[object]], labels: NDArray[np.int64]) -> list[list[Any]]:
        """The tuple each group of rows (groups labelled 0..n-1) publishes."""
        values = mixed_group_centroids(self.columns, rows, labels, self.rules)
        present = np.unique(labels)
        columns = [
            published_column(column[present].tolist(), numeric)
            for column, numeric in zip(values, self.numeric, strict=True)
        ]
        return [list(t) for t in zip(*columns, strict=True)]
