"""The policy's sections beside its attributes: input, output, window, microaggregation,
consistency, republication and risk."""

from __future__ import annotations

from typing import Self

from pydantic import Field, field_validator, model_validator

from gateway.policy.enums import (
    ConsistencyMode,
    ExtraFields,
    GroupingPool,
    HoldTimeout,
    MicroaggAlgorithm,
    Pseudonym,
    RepublicationMode,
    SmallStrata,
)
from gateway.policy.specs import (
    MAX_K,
    Name,
    SBool,
    SFloat,
    SInt,
    StrictModel,
    TopicName,
    check_probability,
)


class InputSpec(StrictModel):
    topic: TopicName = "survey.responses"
    respondent_id: Name | None = None
    key_field: Name | None = None  # re-key through a repartition topic when input has no key
    extra_fields: ExtraFields = ExtraFields.ERROR
    missing_tokens: list[str] = Field(default_factory=lambda: ["?", ""])


class OutputSpec(StrictModel):
    topic: TopicName = "survey.protected"
    dlq_topic: TopicName | None = None
    meta_topic: TopicName | None = None
    pseudonym: Pseudonym = Pseudonym.DROP


class WindowSpec(StrictModel):
    max_records: SInt = 5000
    max_seconds: SFloat = 5.0
    max_hold_seconds: SFloat = 60.0
    on_hold_timeout: HoldTimeout = HoldTimeout.SUPPRESS
    # close a window once the input is drained and has been quiet this long (None: wait for
    # max_records or max_seconds)
    max_idle_seconds: SFloat | None = None

    @model_validator(mode="after")
    def _validate(self) -> Self:
        if self.max_records < 1:
            raise ValueError(f"window.max_records must be ≥ 1, got {self.max_records}")
        if not self.max_seconds > 0:
            raise ValueError(f"window.max_seconds must be > 0, got {self.max_seconds}")
        idle = self.max_idle_seconds
        if idle is not None and not 0 < idle <= self.max_seconds:
            raise ValueError(
                f"window.max_idle_seconds must be > 0 and ≤ window.max_seconds "
                f"({self.max_seconds:g}), got {idle:g}; leave it out to wait for a full window"
            )
        if self.max_hold_seconds < 0:
            raise ValueError(f"window.max_hold_seconds must be ≥ 0, got {self.max_hold_seconds}")
        return self


class LDiversitySpec(StrictModel):
    """Groups merged until each publishes ``l`` distinct values of ``attribute``."""

    attribute: str
    l: SInt = 2  # noqa: E741 - the l of l-diversity

    @field_validator("l")
    @classmethod
    def _l(cls, v: int) -> int:
        if v < 2:
            raise ValueError(f"l_diversity.l must be ≥ 2, got {v}; l = 1 asks for nothing")
        return v


class MicroaggSpec(StrictModel):
    k: SInt = 5
    algorithm: MicroaggAlgorithm = MicroaggAlgorithm.MDAV
    standardize: SBool = True
    # forbidden combinations of nominal quasi-identifiers: attribute -> categories; a published
    # tuple breaks a rule when every named attribute has one of the listed values
    edit_rules: list[dict[str, list[str]]] = Field(default_factory=list)
    # recode_suppress: the k claim's attributes, most important (suppressed last) first
    importance: list[str] | None = None
    # groups never cross a stratum (the tuple of these attributes' values); the stream takes
    # small_strata suppress only (a stratum is small only in hindsight there)
    strata: list[str] | None = None
    small_strata: SmallStrata = SmallStrata.MERGE
    l_diversity: LDiversitySpec | None = None
    # MDAV's groups improved by exchanges between neighbouring groups (gateway/grouping/
    # refine.py). Added in 0.4; None leaves the policy's version as it was and means: refine
    # the panel's cohorts and the blocks of a file larger than one block, not other windows
    refine: SBool | None = None

    @field_validator("k")
    @classmethod
    def _k(cls, v: int) -> int:
        if v < 2:
            raise ValueError(f"k must be ≥ 2, got {v}; a group of one record discloses it")
        return v

    @field_validator("k")
    @classmethod
    def _k_bound(cls, v: int) -> int:
        if v > MAX_K:
            raise ValueError(f"k must be ≤ {MAX_K:_} (a group waits for k records), got {v}")
        return v

    @model_validator(mode="after")
    def _refine_needs_mdav(self) -> Self:
        if self.refine and self.algorithm is not MicroaggAlgorithm.MDAV:
            raise ValueError(
                f"microaggregation.refine improves MDAV's groups, not {self.algorithm.value}'s; "
                "remove refine or set algorithm: mdav"
            )
        return self


class ConsistencySpec(StrictModel):
    mode: ConsistencyMode = ConsistencyMode.STICKY


class RepublicationSpec(StrictModel):
    """How groups are republished across releases, and what a release is."""

    mode: RepublicationMode = RepublicationMode.REGROUP
    # releases are the waves this numeric attribute names (per-release k is checked over a
    # wave); without it every output window is a release of its own
    wave_attribute: str | None = None
    # groups are formed with at least k + slack members, so up to `slack` of them can change
    # or skip a release before the group has to be re-formed (cohorts: suppressed)
    slack: SInt = 0
    pool: GroupingPool = GroupingPool.WINDOW
    # panel (settings added in 0.3: None means the default, and leaves the policy's version
    # as it was): a member absent this many waves in a row retires (stops being imputed), when
    # that leaves every other member's linked candidate set >= k (default 3)
    retire_after_waves: SInt | None = None
    # a wave closes once the next wave's records have been arriving this long (event time or
    # arrival; default 10 s), or at max_wave_seconds after its first record (default 7 days)
    close_grace_seconds: SFloat | None = None
    max_wave_seconds: SFloat | None = None
    # panel: how far a wave number may run ahead of the newest wave read (default 10): records
    # further ahead (a producer's stray wave number) close no wave and are published with
    # their quasi-identifiers suppressed, not decided; a panel whose numbers skip more sets more
    max_wave_step: SInt | None = None
    # the published analysis weight's field (default weight)
    weight_field: str | None = None

    @property
    def retire_after(self) -> int:
        return 3 if self.retire_after_waves is None else self.retire_after_waves

    @property
    def close_grace(self) -> float:
        return 10.0 if self.close_grace_seconds is None else self.close_grace_seconds

    @property
    def max_wave(self) -> float:
        return 7 * 86400.0 if self.max_wave_seconds is None else self.max_wave_seconds

    @property
    def wave_step(self) -> int:
        return 10 if self.max_wave_step is None else self.max_wave_step

    @property
    def weight_name(self) -> str:
        return "weight" if self.weight_field is None else self.weight_field

    @field_validator("slack")
    @classmethod
    def _slack(cls, v: int) -> int:
        if not 0 <= v <= MAX_K:
            raise ValueError(f"republication.slack must be between 0 and {MAX_K:_}, got {v}")
        return v

    @model_validator(mode="after")
    def _panel(self) -> Self:
        if self.retire_after < 1:
            raise ValueError(
                f"republication.retire_after_waves must be >= 1, got {self.retire_after}"
            )
        if self.wave_step < 1:
            raise ValueError(f"republication.max_wave_step must be >= 1, got {self.wave_step}")
        if not 0 <= self.close_grace <= self.max_wave:
            raise ValueError(
                "republication.close_grace_seconds must be between 0 and "
                f"republication.max_wave_seconds ({self.max_wave:g}), got {self.close_grace:g}"
            )
        if not self.weight_name.isidentifier():
            raise ValueError(
                f"republication.weight_field must be a plain field name, got {self.weight_name!r}"
            )
        if self.mode is RepublicationMode.PANEL:
            if self.wave_attribute is None:
                raise ValueError(
                    "republication.mode panel publishes waves: name the wave number's attribute "
                    "in republication.wave_attribute"
                )
            if self.pool is GroupingPool.WINDOW and "pool" in self.model_fields_set:
                raise ValueError(
                    "republication.mode panel decides a wave whole when it closes: leave "
                    "republication.pool out or set it to release"
                )
        return self


class RiskSpec(StrictModel):
    interval_pct: SFloat = 10.0  # p% of n around each rank for interval disclosure
    max_dld: SFloat = 0.5  # alert threshold on record-linkage risk (share 0..1)
    max_interval_disclosure: SFloat = 0.9
    # alert threshold on the share of published respondents whose linked candidate set
    # (followed across releases) is below k. Unset: 0, any (panel and cohort keep every set
    # >= k; choosing regroup raises the alert unless the operator sets a threshold on purpose).
    # Before 0.3 the unset threshold was 1.0 (never): the version still reads it so
    max_linked_below_k: SFloat | None = None

    @property
    def linked_below_k_threshold(self) -> float:
        return 0.0 if self.max_linked_below_k is None else self.max_linked_below_k

    sample_every: SInt = 1  # compute risk on every n-th window

    @model_validator(mode="after")
    def _validate(self) -> Self:
        if not 0 < self.interval_pct <= 100:
            raise ValueError(f"risk.interval_pct must be in (0, 100], got {self.interval_pct}")
        check_probability("risk.max_dld", self.max_dld)
        check_probability("risk.max_interval_disclosure", self.max_interval_disclosure)
        check_probability("risk.max_linked_below_k", self.linked_below_k_threshold)
        if self.sample_every < 1:
            raise ValueError(f"risk.sample_every must be ≥ 1, got {self.sample_every}")
        return self
