"""Republication figures of the last sampled window (docs/consistency.md), for Prometheus.

* linked candidate sets: what an intruder who follows a respondent across releases narrows it
  down to (the smallest, and the share of published respondents below k); the ``cohort`` mode
  guarantees ≥ k, ``regroup`` measures it;
* freshness: the share of published respondents whose tuple was not formed from their current
  values, and how many releases the oldest is behind;
* the smallest class within the release the window published into (≥ k by the quorum rule).

Figures come from the engine's window report; nothing here reads respondent data.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gateway.policy import Policy, RepublicationMode

log = logging.getLogger(__name__)

# which modes promise every linked candidate set >= k
LINKED_GUARANTEE = {
    RepublicationMode.COHORT: True,
    RepublicationMode.REGROUP: False,
    RepublicationMode.DEFERRED: False,
    RepublicationMode.PANEL: True,
}
# a panel wave's figures (gateway/panel): kept as the engine reports them
_PANEL = (
    "panel_imputed",
    "panel_repeats",
    "panel_retired",
    "panel_weight_deff",
    "panel_calibration_deff",
    "panel_marginal_gap",
    "panel_stale_ratio",
)


@dataclass(slots=True)
class RepublicationFigures:
    """The last sampled window's figures and the violations counted so far (the caller
    holds its lock)."""

    k: int
    guarantee: bool
    last: dict[str, float] = field(default_factory=dict)
    release_violations: int = 0
    linked_violations: int = 0

    def observe(self, measures: Mapping[str, float]) -> None:
        records = measures.get("linked_records")
        if records is None or not records:
            return
        last = self.last
        last["linked_below_k_ratio"] = measures.get("linked_below_k", 0.0) / records
        last["stale_ratio"] = measures.get("stale_records", 0.0) / records
        last["stale_age_releases_max"] = measures.get("stale_age_max", 0.0)
        for key in ("linked_smallest", "linked_promised", "release_smallest_class", *_PANEL):
            value = measures.get(key)
            if value is not None and math.isfinite(value):
                last[key] = value
        release = measures.get("release_smallest_class")
        if release is not None and release < self.k:
            self.release_violations += 1
            log.error(
                "release violation: a sampled window published a class of %d < k = %d "
                "respondents within its release",
                int(release),
                self.k,
            )
        linked = measures.get("linked_smallest")
        promised = int(measures.get("linked_promised", self.k))  # a panel's k of its history
        if self.guarantee and linked is not None and linked < promised:
            self.linked_violations += 1
            log.error(
                "linkage violation: the republication mode promises linked candidate sets of "
                "k = %d, a sampled window published a respondent linked to %d",
                promised,
                int(linked),
            )


_GAUGES = {
    "linked_promised": (
        "linked_candidates_promised",
        "the size every linked candidate set is kept at: k, or under a panel whose k rose, the "
        "smallest k its history was published under (no later k can grow an intersection)",
    ),
    "linked_smallest": (
        "linked_candidates_smallest",
        "smallest linked candidate set (respondents sharing a published respondent's tuple in "
        "every release it published in) among the last sampled window's records",
    ),
    "linked_below_k_ratio": (
        "linked_below_k_ratio",
        "share of the last sampled window's published respondents whose linked candidate set "
        "is below k",
    ),
    "stale_ratio": (
        "stale_ratio",
        "share of the last sampled window's published respondents whose tuple was not formed "
        "from their current values",
    ),
    "stale_age_releases_max": (
        "stale_age_releases_max",
        "releases the most out-of-date published tuple of the last sampled window is behind",
    ),
    "panel_imputed": (
        "panel_imputed_records",
        "records published for absent panel members in the last decided wave (a count only: "
        "no record says whether it was imputed)",
    ),
    "panel_repeats": (
        "panel_repeated_records",
        "records of the last decided wave that repeated a member's earlier record of it (a "
        "resubmission or a producer's retry: decided, not published; the first stands)",
    ),
    "panel_retired": (
        "panel_retired_members",
        "panel members retired in the last decided wave (absent retire_after_waves in a row)",
    ),
    "panel_weight_deff": (
        "panel_weight_design_effect",
        "Kish design effect of the published analysis weights of the last decided wave",
    ),
    "panel_calibration_deff": (
        "panel_calibration_design_effect",
        "Kish design effect of the raking factors alone (what calibration adds to the "
        "sampling weights)",
    ),
    "panel_marginal_gap": (
        "panel_weighted_marginal_gap_ratio",
        "largest gap between a category's weighted published share and its share among the "
        "wave's current and imputed values",
    ),
    "panel_stale_ratio": (
        "panel_stale_ratio",
        "share of the wave's present respondents whose published categories differ from their "
        "current ones (individual staleness; aggregates are raked)",
    ),
    "release_smallest_class": (
        "release_smallest_class",
        "smallest number of respondents publishing one tuple within its release, among the "
        "groups the last sampled window published (never below k)",
    ),
}


def families(prefix: str, policy: Policy, figures: RepublicationFigures) -> Iterator[Any]:
    """The republication metric families (``figures`` read under the caller's lock)."""
    mode = GaugeMetricFamily(
        f"{prefix}_republication_mode",
        "1 for the policy's republication mode (docs/consistency.md)",
        labels=["mode"],
    )
    mode.add_metric([policy.republication.mode.value], 1)
    yield mode
    yield GaugeMetricFamily(
        f"{prefix}_republication_linked_guarantee",
        "1 when the republication mode keeps every linked candidate set at k or more",
        value=1 if figures.guarantee else 0,
    )
    for key, (stem, doc) in _GAUGES.items():
        if key in figures.last:
            yield GaugeMetricFamily(f"{prefix}_{stem}", doc, value=figures.last[key])
    yield CounterMetricFamily(
        f"{prefix}_release_class_violations",
        "sampled windows that published a class below k within its release",
        value=figures.release_violations,
    )
    yield CounterMetricFamily(
        f"{prefix}_linked_guarantee_violations",
        "sampled windows that published a respondent linked to fewer than k under a mode that "
        "promises k",
        value=figures.linked_violations,
    )
