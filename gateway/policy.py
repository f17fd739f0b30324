"""The policy: one YAML file naming every input attribute, its role and its protection.

Parsed strictly: unknown keys, duplicate keys, wrong types and impossible settings are errors
that name the key and the fix. A policy has a stable version (a hash of its canonical form)
stamped on every output record.
"""

from __future__ import annotations

import difflib
import hashlib
import math
from enum import StrEnum
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Self

import orjson
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.errors import PolicyError


class Role(StrEnum):
    IDENTIFIER = "identifier"
    QUASI_IDENTIFIER = "quasi_identifier"
    SENSITIVE = "sensitive"
    OTHER = "other"  # carried through unchanged (wave number, timestamps)
    WEIGHT = "weight"  # the sampling weight: never a key, weights Fk, risk and estimates


class AttrType(StrEnum):
    NUMERIC = "numeric"
    CATEGORICAL = "categorical"
    TIMESTAMP = "timestamp"  # ISO 8601 text; never published verbatim


class Method(StrEnum):
    DROP = "drop"
    KEEP = "keep"
    MICROAGGREGATION = "microaggregation"
    NOISE = "noise"
    TOP_BOTTOM_CODE = "top_bottom_code"
    GENERALIZE = "generalize"
    RANDOMIZED_RESPONSE = "randomized_response"
    COARSEN = "coarsen"  # timestamps: truncated to the policy's unit


class TimeUnit(StrEnum):
    MINUTE = "minute"
    HOUR = "hour"
    DAY = "day"
    WEEK = "week"  # the Monday that starts the ISO week
    MONTH = "month"


class RRMode(StrEnum):
    UNIFORM = "uniform"
    FINE_GRAIN = "fine_grain"
    MATRIX = "matrix"
    # invariant PRAM (Kooiman, Willenborg & Gouweleeuw 1997): a uniform P of the given
    # strength, then R = Q·P with Q its Bayes reverse under the reference distribution π
    # (rr.weights, else the file's frequencies, else equal), so that R·π = π
    INVARIANT = "invariant"


class MissingHandling(StrEnum):
    KEEP = "keep"  # published as missing, not perturbed
    CATEGORY = "category"  # an extra category, perturbed like the others


class MicroaggAlgorithm(StrEnum):
    MDAV = "mdav"
    RANKING = "ranking"  # univariate individual ranking
    # global recoding (hierarchies, bins) then local suppression to k: no wrong values, some
    # missing ones (sdcMicro's globalRecode + kAnon); the file workflow (gateway/recode_suppress)
    RECODE_SUPPRESS = "recode_suppress"


class HoldTimeout(StrEnum):
    SUPPRESS = "suppress"
    HOLD = "hold"


class Pseudonym(StrEnum):
    DROP = "drop"
    HMAC = "hmac"


class ExtraFields(StrEnum):
    ERROR = "error"
    IGNORE = "ignore"


class ConsistencyMode(StrEnum):
    STICKY = "sticky"
    NONE = "none"  # fresh randomness per release: only for demonstrating the averaging attack


class RepublicationMode(StrEnum):
    """How a returning respondent's quasi-identifier group is republished (docs/consistency.md)."""

    # changed respondents are regrouped at once among the window's new and changed records; a
    # group left with fewer than k live members is re-formed the same way (fresh; a mover's
    # linked candidate set is an intersection, measured)
    REGROUP = "regroup"
    # fixed cohorts: a cohort's tuple is recomputed from its present members' current values;
    # every respondent's linked candidate set stays >= k (marginals of nominal attributes lag)
    COHORT = "cohort"
    # before 0.2: a changed respondent stays in its group while its departure would leave it
    # with fewer than k live members (republishes its first tuple; no per-release k)
    DEFERRED = "deferred"


class GroupingPool(StrEnum):
    """When new and changed respondents are microaggregated."""

    WINDOW = "window"  # in every window, once k of them wait there
    # when their release closes (a later wave, hold time over, the last flush): one pool per
    # release, so groups are formed from nearer neighbours (less information loss) at the
    # price of waiting up to a wave
    RELEASE = "release"


MISSING_LABEL = "<missing>"

_ALLOWED_METHODS: dict[tuple[Role, AttrType], frozenset[Method]] = {
    (Role.IDENTIFIER, AttrType.NUMERIC): frozenset({Method.DROP}),
    (Role.IDENTIFIER, AttrType.CATEGORICAL): frozenset({Method.DROP}),
    (Role.IDENTIFIER, AttrType.TIMESTAMP): frozenset({Method.DROP}),
    # NOISE, TOP_BOTTOM_CODE and KEEP leave a quasi-identifier outside the k claim: allowed only
    # with `unprotected: true` (see Attribute._validate)
    (Role.QUASI_IDENTIFIER, AttrType.NUMERIC): frozenset(
        {Method.MICROAGGREGATION, Method.NOISE, Method.TOP_BOTTOM_CODE, Method.KEEP}
    ),
    (Role.QUASI_IDENTIFIER, AttrType.CATEGORICAL): frozenset(
        {Method.MICROAGGREGATION, Method.GENERALIZE, Method.KEEP}
    ),
    (Role.QUASI_IDENTIFIER, AttrType.TIMESTAMP): frozenset(),
    # a sensitive number is masked by noise (after optional top/bottom coding) or dropped:
    # coding alone publishes every value inside [bottom, top] unchanged
    (Role.SENSITIVE, AttrType.NUMERIC): frozenset({Method.NOISE, Method.DROP}),
    (Role.SENSITIVE, AttrType.CATEGORICAL): frozenset(
        {Method.RANDOMIZED_RESPONSE, Method.KEEP, Method.GENERALIZE, Method.DROP}
    ),
    (Role.SENSITIVE, AttrType.TIMESTAMP): frozenset(),
    (Role.OTHER, AttrType.NUMERIC): frozenset({Method.KEEP, Method.DROP}),
    (Role.OTHER, AttrType.CATEGORICAL): frozenset({Method.KEEP, Method.DROP}),
    (Role.OTHER, AttrType.TIMESTAMP): frozenset({Method.COARSEN, Method.DROP}),
    (Role.WEIGHT, AttrType.NUMERIC): frozenset({Method.KEEP, Method.DROP}),
    (Role.WEIGHT, AttrType.CATEGORICAL): frozenset(),
    (Role.WEIGHT, AttrType.TIMESTAMP): frozenset(),
}

# A quasi-identifier with one of these methods is part of the k-anonymity claim: it is
# microaggregated with all the others (a generalized one at its generalized level).
K_CLAIM_METHODS = frozenset({Method.MICROAGGREGATION, Method.GENERALIZE})


def _fits(v: int) -> int:
    # beyond 2^53 no JSON consumer reads the number exactly (and orjson cannot hash it)
    if not -(2**53) <= v <= 2**53:
        raise ValueError(f"a {len(str(abs(v)))}-digit number is too large for this setting")
    return v


# Numbers and switches as YAML writes them: `k: '5'` or `standardize: 'true'` (strings) are
# refused instead of converted; an int where a float goes is fine.
SInt = Annotated[int, Strict(), AfterValidator(_fits)]
SFloat = Annotated[float, Strict()]
SBool = Annotated[bool, Strict()]

#: Largest microaggregation k: a group is held until k records arrive, so k beyond any
#: window size only holds records forever.
MAX_K = 1_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, use_enum_values=False)


def _check_probability(name: str, value: float | None) -> None:
    if value is not None and not (0.0 <= value <= 1.0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a probability in [0, 1], got {value}")


class RRSpec(_Strict):
    """Randomized response. Give exactly one strength: retention, epsilon, gamma or rho1+rho2."""

    mode: RRMode
    retention: SFloat | None = None
    epsilon: SFloat | None = None
    gamma: SFloat | None = None
    rho1: SFloat | None = None
    rho2: SFloat | None = None
    weights: dict[str, SFloat] | None = None  # fine_grain: value weights; None = equal weights
    matrix: list[list[SFloat]] | None = None  # mode matrix: P[j][i] = Pr(publish j | true i)

    @model_validator(mode="after")
    def _validate(self) -> Self:
        _check_probability("rr.retention", self.retention)
        _check_probability("rr.rho1", self.rho1)
        _check_probability("rr.rho2", self.rho2)
        if (self.rho1 is None) != (self.rho2 is None):
            raise ValueError("rr.rho1 and rr.rho2 go together: give both or neither")
        if (
            self.rho1 is not None
            and self.rho2 is not None
            and not 0.0 < self.rho1 < self.rho2 < 1.0
        ):
            raise ValueError(
                f"rr needs 0 < rho1 < rho2 < 1, got rho1={self.rho1}, rho2={self.rho2}; "
                "rho1 is the prior bound, rho2 the larger posterior bound"
            )
        if self.epsilon is not None and not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"rr.epsilon must be > 0 and finite, got {self.epsilon}")
        if self.gamma is not None and not (self.gamma > 1 and math.isfinite(self.gamma)):
            raise ValueError(f"rr.gamma must be > 1 and finite, got {self.gamma}")
        strengths = [
            n
            for n, v in (
                ("retention", self.retention),
                ("epsilon", self.epsilon),
                ("gamma", self.gamma),
                ("rho1/rho2", self.rho1),
            )
            if v is not None
        ]
        if self.mode is RRMode.MATRIX:
            if self.matrix is None:
                raise ValueError("rr.mode matrix needs rr.matrix (a list of rows P[j][i])")
            if strengths or self.weights is not None:
                raise ValueError(
                    "rr.mode matrix takes only rr.matrix; remove retention/epsilon/gamma/"
                    "rho1/rho2/weights"
                )
        else:
            if self.matrix is not None:
                raise ValueError(f"rr.matrix is only for mode matrix, not mode {self.mode.value}")
            if len(strengths) != 1:
                raise ValueError(
                    f"rr.mode {self.mode.value} needs exactly one of retention, epsilon, gamma "
                    f"or rho1+rho2; got {strengths or 'none'}"
                )
            if self.mode is RRMode.FINE_GRAIN and self.retention is not None:
                raise ValueError(
                    "rr.mode fine_grain solves for per-value retention: give epsilon, gamma "
                    "or rho1+rho2 instead of retention"
                )
            if self.mode is RRMode.UNIFORM and self.weights is not None:
                raise ValueError(
                    "rr.weights only applies to modes fine_grain and invariant (as the "
                    "reference distribution)"
                )
        if self.weights is not None:
            for cat, w in self.weights.items():
                if not (w >= 0 and math.isfinite(w)):
                    raise ValueError(f"rr.weights[{cat!r}] must be ≥ 0 and finite, got {w}")
        return self

    @model_validator(mode="after")
    def _finite_gamma(self) -> Self:
        """A matrix row with a zero and a positive entry has γ = ∞: publishing that value rules
        a true value out (the identity publishes every true value). Refused, as retention 1 is."""
        for j, row in enumerate(self.matrix or []):
            if any(v > 0 for v in row) and any(v <= 0 for v in row):
                raise ValueError(
                    f"rr.matrix row {j} mixes zero and positive entries, so γ (and ε) is "
                    "infinite: publishing that value rules true values out; give every entry "
                    "of a used row a positive probability"
                )
        return self


class NoiseSpec(_Strict):
    """Uncorrelated additive Gaussian noise. Its standard deviation is the larger of ``sd``
    (absolute) and √ratio·S, S the standard deviation of the attribute in the window. A stream
    window may hold one record (S = 0): give ``sd`` there, or the value is published as
    missing rather than unmasked."""

    ratio: SFloat | None = None
    sd: SFloat | None = None

    @model_validator(mode="after")
    def _validate(self) -> Self:
        if self.ratio is None and self.sd is None:
            raise ValueError("noise needs ratio (e.g. 0.1 of the variance), sd, or both")
        if self.ratio is not None and not (self.ratio > 0 and math.isfinite(self.ratio)):
            raise ValueError(f"noise.ratio must be > 0 (e.g. 0.1), got {self.ratio}")
        if self.sd is not None and not (self.sd > 0 and math.isfinite(self.sd)):
            raise ValueError(f"noise.sd must be > 0 and finite, got {self.sd}")
        return self


class CoarsenSpec(_Strict):
    """Timestamps truncated to ``unit`` (published as ISO 8601 text of the unit's start)."""

    unit: TimeUnit = TimeUnit.DAY


class CodingSpec(_Strict):
    """Top/bottom coding: values above top become top, values below bottom become bottom."""

    top: SFloat | None = None
    bottom: SFloat | None = None

    @model_validator(mode="after")
    def _validate(self) -> Self:
        if self.top is None and self.bottom is None:
            raise ValueError("coding needs top, bottom or both")
        if self.top is not None and self.bottom is not None and self.bottom >= self.top:
            raise ValueError(f"coding.bottom must be < coding.top, got {self.bottom} ≥ {self.top}")
        return self


class HierarchySpec(_Strict):
    """A user-given generalization hierarchy: levels[i] maps a level-i value to its parent."""

    levels: list[dict[str, str]] = Field(min_length=1)
    level: SInt = 1

    @model_validator(mode="after")
    def _validate(self) -> Self:
        if not 1 <= self.level <= len(self.levels):
            raise ValueError(
                f"hierarchy.level must be between 1 and {len(self.levels)} (the number of "
                f"levels given), got {self.level}"
            )
        for i in range(1, len(self.levels)):
            missing = sorted(set(self.levels[i - 1].values()) - set(self.levels[i]))
            if missing:
                raise ValueError(
                    f"hierarchy.levels[{i}] must map every value produced by level {i}; "
                    f"{len(missing)} value(s) lack a parent"
                )
        return self


class Attribute(_Strict):
    role: Role
    type: AttrType
    method: Method
    categories: list[str] | None = None
    ordered: SBool = False  # categories are ordinal, listed in order (distance by rank)
    unprotected: SBool = False  # a quasi-identifier deliberately left out of the k claim
    missing: MissingHandling = MissingHandling.KEEP
    required: SBool = True
    range: tuple[SFloat, SFloat] | None = None
    rr: RRSpec | None = None
    noise: NoiseSpec | None = None
    coding: CodingSpec | None = None
    hierarchy: HierarchySpec | None = None
    coarsen: CoarsenSpec | None = None
    # published rounded to a multiple of this: a weight kept, or a noised number (after the
    # noise, so that equal published values pool respondents and stop linking releases)
    round_to: SFloat | None = None
    bins: list[SFloat] | None = None  # recode_suppress: a numeric key recoded to intervals

    @model_validator(mode="after")
    def _validate(self) -> Self:
        allowed = _ALLOWED_METHODS[(self.role, self.type)]
        if self.role is Role.WEIGHT and self.type is not AttrType.NUMERIC:
            raise ValueError("a weight must be type numeric (the sampling weight of a record)")
        if self.round_to is not None:
            self._validate_round_to(self.round_to)
        if self.bins is not None:
            if self.type is not AttrType.NUMERIC or self.role is not Role.QUASI_IDENTIFIER:
                raise ValueError("bins only apply to a numeric quasi_identifier")
            if not self.bins or any(b >= c for b, c in pairwise(self.bins)):
                raise ValueError("bins must be increasing break points, e.g. [25, 35, 45, 55]")
        if not allowed:
            raise ValueError(
                f"a {self.type.value} attribute cannot have role {self.role.value}; a timestamp "
                "is role other (method coarsen or drop) or identifier (drop)"
            )
        if self.method not in allowed:
            hint = ""
            if self.role is Role.SENSITIVE and self.method is Method.TOP_BOTTOM_CODE:
                hint = (
                    " (coding alone publishes every value inside [bottom, top] unchanged: "
                    "use method noise with 'coding' to code and then add noise)"
                )
            elif self.type is AttrType.TIMESTAMP and self.method is Method.KEEP:
                hint = " (a timestamp is never published verbatim: coarsen it or drop it)"
            raise ValueError(
                f"method {self.method.value} does not apply to a {self.type.value} "
                f"{self.role.value}; use one of {sorted(m.value for m in allowed)}{hint}"
            )
        self._validate_claim()
        needs = {
            Method.RANDOMIZED_RESPONSE: "rr",
            Method.NOISE: "noise",
            Method.TOP_BOTTOM_CODE: "coding",
            Method.GENERALIZE: "hierarchy",
            Method.COARSEN: "coarsen",
        }
        for method, key in needs.items():
            given = getattr(self, key) is not None
            if self.method is method and not given:
                raise ValueError(f"method {method.value} needs the '{key}' settings")
            # noise may follow top/bottom coding: the coding then applies first
            combined = key == "coding" and self.method is Method.NOISE
            if self.method is not method and given and not combined:
                raise ValueError(f"'{key}' settings only apply to method {method.value}")
        if self.categories is not None:
            if len(self.categories) < 2:
                raise ValueError("categories must list at least 2 values")
            if len(set(self.categories)) != len(self.categories):
                raise ValueError("categories lists a value twice; list each value once")
            if self.type is AttrType.NUMERIC:
                raise ValueError("categories only apply to categorical attributes")
        if self.method is Method.RANDOMIZED_RESPONSE:
            if self.categories is None:
                raise ValueError(
                    "randomized_response needs 'categories': the full domain must be public "
                    "so the matrix P can be published"
                )
            assert self.rr is not None
            m = len(self.domain)
            if self.rr.matrix is not None:
                rows = self.rr.matrix
                if len(rows) != m or any(len(r) != m for r in rows):
                    raise ValueError(
                        f"rr.matrix must be {m}×{m} (one row and column per category"
                        f"{', including the missing category' if self.missing_is_category else ''})"
                    )
            if self.rr.weights is not None:
                unknown = sorted(set(self.rr.weights) - set(self.domain))
                if unknown:
                    raise ValueError(f"rr.weights names values not in categories: {unknown}")
        if self.range is not None:
            lo, hi = self.range
            if self.type is not AttrType.NUMERIC:
                raise ValueError("range only applies to numeric attributes")
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"range must be [low, high] with low < high, got [{lo}, {hi}]")
        if self.hierarchy is not None and self.categories is not None:
            unmapped = sorted(set(self.categories) - set(self.hierarchy.levels[0]))
            if unmapped:
                raise ValueError(
                    f"hierarchy.levels[0] must map every category; missing {len(unmapped)}"
                )
        return self

    def _validate_round_to(self, step: float) -> None:
        weight_kept = self.role is Role.WEIGHT and self.method is Method.KEEP
        if not weight_kept and self.method is not Method.NOISE:
            raise ValueError(
                "round_to only applies to a weight published with method keep or to a "
                "numeric attribute with method noise"
            )
        if not (step > 0 and math.isfinite(step)):
            raise ValueError(f"round_to must be a number > 0 (e.g. 100), got {step}")
        if self.method is Method.NOISE and self.noise is not None:
            # with the noise's sd at least half the step, the rounding error is nearly uniform
            # on ±step/2 and independent of the value (Sheppard): per value, mean bias under
            # 0.23 % of a step and variance within 2.4 % of sd² + step²/12 (docs/policy.md);
            # at 3 sd the variance is off by 31 %
            floor = self.noise.sd
            if floor is None or step > 2 * floor:
                given = "not given" if floor is None else f"{floor:g}"
                raise ValueError(
                    f"round_to ({step:g}) must be at most 2 × noise.sd (the noise's floor, "
                    f"{given}) so that the rounding error stays independent of the value: set "
                    f"noise.sd ≥ {step / 2:g} or round to a smaller step"
                )

    @property
    def missing_is_category(self) -> bool:
        return self.missing is MissingHandling.CATEGORY

    def _validate_claim(self) -> None:
        """Honest k claims: a quasi-identifier is microaggregated with the others (or
        generalized, then microaggregated), or explicitly declared unprotected."""
        in_claim = self.method in K_CLAIM_METHODS
        if self.unprotected and (self.role is not Role.QUASI_IDENTIFIER or in_claim):
            raise ValueError(
                "unprotected: true only applies to a quasi-identifier published with method "
                "keep, noise or top_bottom_code (it declares the attribute outside the k claim)"
            )
        if self.role is Role.QUASI_IDENTIFIER and not in_claim and not self.unprotected:
            raise ValueError(
                f"a quasi-identifier with method {self.method.value} is published without "
                "k-anonymity; use method microaggregation (numeric, ordinal or nominal) or "
                "generalize, or set unprotected: true to leave it out of the k claim explicitly"
            )
        if (
            self.type is AttrType.CATEGORICAL
            and self.role in (Role.QUASI_IDENTIFIER, Role.SENSITIVE)
            and self.method is not Method.DROP
            and self.categories is None
        ):
            raise ValueError(
                f"a categorical {self.role.value} needs 'categories' (its full domain): free "
                "text cannot be microaggregated, randomized or checked for unknown values"
            )
        if self.ordered:
            if self.type is not AttrType.CATEGORICAL or self.categories is None:
                raise ValueError("ordered: true needs a categorical attribute with categories")
            if self.missing_is_category:
                raise ValueError(
                    "an ordered attribute cannot have missing: category (a missing value has no "
                    "rank); use missing: keep"
                )
            if self.method is Method.GENERALIZE:
                raise ValueError("ordered: true does not combine with method generalize")
        if self.type is AttrType.TIMESTAMP and (self.categories or self.range):
            raise ValueError("a timestamp takes neither categories nor range")

    @property
    def domain(self) -> list[str]:
        """Categories in published order; the missing label comes last if it is a category."""
        cats = list(self.categories or [])
        if self.missing_is_category:
            cats.append(MISSING_LABEL)
        return cats


class InputSpec(_Strict):
    topic: str = "survey.responses"
    respondent_id: str | None = None
    key_field: str | None = None  # re-key through a repartition topic when input has no key
    extra_fields: ExtraFields = ExtraFields.ERROR
    missing_tokens: list[str] = Field(default_factory=lambda: ["?", ""])


class OutputSpec(_Strict):
    topic: str = "survey.protected"
    dlq_topic: str | None = None
    meta_topic: str | None = None
    pseudonym: Pseudonym = Pseudonym.DROP


class WindowSpec(_Strict):
    max_records: SInt = 5000
    max_seconds: SFloat = 5.0
    max_hold_seconds: SFloat = 60.0
    on_hold_timeout: HoldTimeout = HoldTimeout.SUPPRESS

    @model_validator(mode="after")
    def _validate(self) -> Self:
        if self.max_records < 1:
            raise ValueError(f"window.max_records must be ≥ 1, got {self.max_records}")
        if not self.max_seconds > 0:
            raise ValueError(f"window.max_seconds must be > 0, got {self.max_seconds}")
        if self.max_hold_seconds < 0:
            raise ValueError(f"window.max_hold_seconds must be ≥ 0, got {self.max_hold_seconds}")
        return self


class SmallStrata(StrEnum):
    MERGE = "merge"  # strata below k pooled (the pool, if still below k, joins the smallest)
    SUPPRESS = "suppress"  # their records published with the quasi-identifiers suppressed


class LDiversitySpec(_Strict):
    """Groups merged until each publishes ``l`` distinct values of ``attribute``."""

    attribute: str
    l: SInt = 2  # noqa: E741 - the l of l-diversity

    @field_validator("l")
    @classmethod
    def _l(cls, v: int) -> int:
        if v < 2:
            raise ValueError(f"l_diversity.l must be ≥ 2, got {v}; l = 1 asks for nothing")
        return v


class MicroaggSpec(_Strict):
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


class ConsistencySpec(_Strict):
    mode: ConsistencyMode = ConsistencyMode.STICKY


class RepublicationSpec(_Strict):
    """How groups are republished across releases, and what a release is."""

    mode: RepublicationMode = RepublicationMode.REGROUP
    # releases are the waves this numeric attribute names (per-release k is checked over a
    # wave); without it every output window is a release of its own
    wave_attribute: str | None = None
    # groups are formed with at least k + slack members, so up to `slack` of them can change
    # or skip a release before the group has to be re-formed (cohorts: suppressed)
    slack: SInt = 0
    pool: GroupingPool = GroupingPool.WINDOW

    @field_validator("slack")
    @classmethod
    def _slack(cls, v: int) -> int:
        if not 0 <= v <= MAX_K:
            raise ValueError(f"republication.slack must be between 0 and {MAX_K:_}, got {v}")
        return v


class RiskSpec(_Strict):
    interval_pct: SFloat = 10.0  # p% of n around each rank for interval disclosure
    max_dld: SFloat = 0.5  # alert threshold on record-linkage risk (share 0..1)
    max_interval_disclosure: SFloat = 0.9
    # alert threshold on the share of published respondents whose linked candidate set
    # (followed across releases) is below k; 1.0: never (regroup lets movers fall below k)
    max_linked_below_k: SFloat = 1.0
    sample_every: SInt = 1  # compute risk on every n-th window

    @model_validator(mode="after")
    def _validate(self) -> Self:
        if not 0 < self.interval_pct <= 100:
            raise ValueError(f"risk.interval_pct must be in (0, 100], got {self.interval_pct}")
        _check_probability("risk.max_dld", self.max_dld)
        _check_probability("risk.max_interval_disclosure", self.max_interval_disclosure)
        _check_probability("risk.max_linked_below_k", self.max_linked_below_k)
        if self.sample_every < 1:
            raise ValueError(f"risk.sample_every must be ≥ 1, got {self.sample_every}")
        return self


class Policy(_Strict):
    name: str = "privgw"
    input: InputSpec = Field(default_factory=InputSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)
    window: WindowSpec = Field(default_factory=WindowSpec)
    microaggregation: MicroaggSpec = Field(default_factory=MicroaggSpec)
    consistency: ConsistencySpec = Field(default_factory=ConsistencySpec)
    republication: RepublicationSpec = Field(default_factory=RepublicationSpec)
    risk: RiskSpec = Field(default_factory=RiskSpec)
    attributes: Annotated[dict[str, Attribute], Field(min_length=1)]

    @model_validator(mode="after")
    def _validate(self) -> Self:
        rid = self.input.respondent_id
        if rid is not None and rid in self.attributes:
            raise ValueError(
                f"input.respondent_id '{rid}' must not also be listed under attributes; "
                "output.pseudonym decides what is published for it"
            )
        if self.output.pseudonym is Pseudonym.HMAC and rid is None:
            raise ValueError("output.pseudonym hmac needs input.respondent_id")
        key = self.input.key_field
        if key is not None and key != rid and key not in self.attributes:
            raise ValueError(
                f"input.key_field '{key}' is neither input.respondent_id nor an attribute; "
                "name the field that identifies the respondent (usually input.respondent_id)"
            )
        self._validate_recode_suppress()
        weights = [n for n, a in self.attributes.items() if a.role is Role.WEIGHT]
        if len(weights) > 1:
            raise ValueError(
                f"attributes {', '.join(weights)} all have role weight; a file has one sampling "
                "weight: give the others role other"
            )
        claim = self.k_claim
        self._check_republication()
        self._check_edit_rules()
        if self.microaggregation.algorithm is MicroaggAlgorithm.RANKING and (
            len(claim) > 1 or any(self.attributes[n].type is not AttrType.NUMERIC for n in claim)
        ):
            raise ValueError(
                "microaggregation.algorithm ranking groups each attribute on its own, which "
                "gives no k-anonymity on the tuple of several quasi-identifiers; use mdav"
            )
        return self

    def _check_republication(self) -> None:
        wave = self.republication.wave_attribute
        if wave is None:
            return
        attr = self.attributes.get(wave)
        if attr is None:
            close = difflib.get_close_matches(wave, list(self.attributes), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(
                f"republication.wave_attribute '{wave}' is not an attribute{hint}; name the "
                "numeric attribute that carries the wave number, or leave it out (each window "
                "is then a release)"
            )
        if attr.type is not AttrType.NUMERIC or attr.role is not Role.OTHER:
            raise ValueError(
                f"republication.wave_attribute '{wave}' must be a numeric attribute of role "
                f"other (the wave number), not a {attr.type.value} {attr.role.value}"
            )

    def _check_edit_rules(self) -> None:
        for i, rule in enumerate(self.microaggregation.edit_rules):
            if not rule:
                raise ValueError(f"microaggregation.edit_rules[{i}] names no attribute")
            for name, cats in rule.items():
                attr = self.attributes.get(name)
                if (
                    attr is None
                    or name not in self.k_claim
                    or attr.type is not AttrType.CATEGORICAL
                    or attr.ordered
                ):
                    raise ValueError(
                        f"microaggregation.edit_rules[{i}] names '{name}', which is not a "
                        "nominal quasi-identifier of the k claim; rules constrain the "
                        "combinations of those only"
                    )
                known = set(published_categories(attr))
                unknown = [c for c in cats if c not in known]
                if not cats or unknown:
                    raise ValueError(
                        f"microaggregation.edit_rules[{i}].{name} must list categories it can "
                        f"publish ({', '.join(sorted(known))}); {len(unknown)} unknown"
                    )

    def _validate_recode_suppress(self) -> None:
        spec, claim = self.microaggregation, self.k_claim
        recode = spec.algorithm is MicroaggAlgorithm.RECODE_SUPPRESS
        binned = [n for n, a in self.attributes.items() if a.bins is not None]
        if binned and not recode:
            raise ValueError(
                f"bins ({', '.join(binned)}) only apply with microaggregation.algorithm "
                "recode_suppress; remove them or choose that algorithm"
            )
        if spec.importance is not None and not recode:
            raise ValueError("microaggregation.importance only applies to recode_suppress")
        for name in spec.strata or []:
            attr = self.attributes.get(name)
            if attr is None or attr.role in (Role.WEIGHT, Role.IDENTIFIER):
                raise ValueError(
                    f"microaggregation.strata names {name!r}: a stratum is an attribute of the "
                    "policy that is neither an identifier nor the weight (e.g. a region)"
                )
        ldiv = spec.l_diversity
        if ldiv is not None:
            attr = self.attributes.get(ldiv.attribute)
            if attr is None or attr.role is not Role.SENSITIVE or attr.method is Method.DROP:
                raise ValueError(
                    f"microaggregation.l_diversity.attribute {ldiv.attribute!r} must be a "
                    "published sensitive attribute of the policy"
                )
        if recode and (spec.strata or ldiv is not None):
            raise ValueError(
                "recode_suppress takes neither strata nor l_diversity; use algorithm mdav"
            )
        if not recode:
            return
        unbinned = [
            n for n in claim if self.attributes[n].type is AttrType.NUMERIC and n not in binned
        ]
        if unbinned:
            raise ValueError(
                f"recode_suppress recodes numeric keys to intervals: give bins to "
                f"{', '.join(unbinned)}"
            )
        if spec.importance is not None and sorted(spec.importance) != sorted(claim):
            raise ValueError(
                f"microaggregation.importance must list each attribute of the k claim once "
                f"({', '.join(claim)}), most important first"
            )

    @model_validator(mode="after")
    def _distinct_topics(self) -> Self:
        """Each topic has one role: dead letters (raw input) in the output would publish raw
        values, an output read as input is a feedback loop."""
        clash = topic_clash(
            [
                ("input.topic", self.input.topic),
                ("output.topic", self.output.topic),
                ("output.dlq_topic", self.dlq_topic),
                ("output.meta_topic", self.meta_topic),
            ]
        )
        if clash is not None:
            raise ValueError(clash)
        return self

    # -- derived views ---------------------------------------------------------------
    def by_method(self, method: Method) -> list[str]:
        return [n for n, a in self.attributes.items() if a.method is method]

    @property
    def k_claim(self) -> list[str]:
        """The quasi-identifiers the k-anonymity claim covers: microaggregated together
        (generalized ones at their generalized level), so every published tuple of them is
        shared by at least k respondents."""
        return [
            n
            for n, a in self.attributes.items()
            if a.role is Role.QUASI_IDENTIFIER and a.method in K_CLAIM_METHODS
        ]

    @property
    def unprotected_quasi_identifiers(self) -> list[str]:
        """Quasi-identifiers declared ``unprotected``: published outside the k claim."""
        return [n for n, a in self.attributes.items() if a.unprotected]

    @property
    def published_outside_claim(self) -> list[str]:
        """Attributes of role ``other`` that are published (kept, coarsened, coded...): beside
        the k claim, not in it, so an adversary who can know one of them may split a class."""
        return [
            n
            for n, a in self.attributes.items()
            if a.role is Role.OTHER and a.method is not Method.DROP
        ]

    @property
    def numeric_claim(self) -> list[str]:
        """The numeric attributes of the k claim (what the numeric-only measures cover)."""
        return [n for n in self.k_claim if self.attributes[n].type is AttrType.NUMERIC]

    @property
    def file_only(self) -> list[str]:
        """Settings the stream engine does not run (the file workflow does)."""
        spec = self.microaggregation
        out = []
        if spec.algorithm is MicroaggAlgorithm.RECODE_SUPPRESS:
            out.append("microaggregation.algorithm recode_suppress")
        return out

    @property
    def grouped_by_file(self) -> bool:
        """Whether ``privgw protect`` groups the k claim itself (recoding, or strata and
        l-diversity over the whole file) and has the engine publish everything else."""
        spec = self.microaggregation
        return bool(self.file_only or spec.strata or spec.l_diversity is not None)

    @property
    def weight(self) -> str | None:
        """The sampling weight attribute (role ``weight``), if the policy names one."""
        return next((n for n, a in self.attributes.items() if a.role is Role.WEIGHT), None)

    @property
    def randomized(self) -> list[str]:
        return self.by_method(Method.RANDOMIZED_RESPONSE)

    @property
    def dlq_topic(self) -> str:
        return self.output.dlq_topic or f"{self.input.topic}.dlq"

    @property
    def meta_topic(self) -> str:
        return self.output.meta_topic or f"{self.output.topic}.meta"

    @property
    def version(self) -> str:
        """Stable hash of the canonical form: same meaning, same version, whatever the layout."""
        canonical = orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(canonical).hexdigest()[:16]


def published_categories(attr: Attribute) -> list[str]:
    """The categories a categorical attribute can publish: its domain, or the values its
    hierarchy climbs to at the policy's level for method generalize."""
    if attr.method is not Method.GENERALIZE or attr.hierarchy is None:
        return attr.domain
    values = [c for c in attr.domain if c != MISSING_LABEL]
    for level in attr.hierarchy.levels[: attr.hierarchy.level]:
        values = [level.get(v, v) for v in values]
    out = list(dict.fromkeys(values))
    if attr.missing_is_category:
        out.append(MISSING_LABEL)
    return out


# why a topic may not serve a second role, by the role it has first
_TOPIC_CLASH = (
    "its records would be read back as input (a feedback loop)",
    "they would land in the protected stream, where raw values must never go",
    "they would mix with the raw dead letters",
)


def topic_clash(named: list[tuple[str, str]]) -> str | None:
    """The first pair of settings naming the same topic, as an error message; None if all
    differ. ``named``: (setting, topic) in the order input, output, dead-letter, metadata."""
    for i, (first, topic) in enumerate(named):
        for second, other in named[i + 1 :]:
            if topic == other:
                return (
                    f"{second} names the same topic as {first} ('{topic}'): "
                    f"{_TOPIC_CLASH[min(i, 2)]}; give each its own topic"
                )
    return None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise PolicyError(
                f"policy line {key_node.start_mark.line + 1}: key '{key}' is given twice; "
                "name each attribute and setting once"
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _format_loc(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not item.startswith("function-"):
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "policy"


_STRICT_TYPES = {
    "int_type": "must be a whole number, written without quotes (e.g. 5)",
    "float_type": "must be a number, written without quotes (e.g. 0.2; YAML reads 1e3 as "
    "text: write 1.0e3)",
    "bool_type": "must be true or false, written without quotes",
}


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors(include_url=False, include_input=False):
        loc = _format_loc(tuple(e["loc"]))
        msg = str(e["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key; remove it or fix its spelling (see docs/policy.md)"
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif e["type"] in _STRICT_TYPES:
            msg = _STRICT_TYPES[e["type"]]
        lines.append(f"{loc}: {msg}")
    return "invalid policy:\n  " + "\n  ".join(lines)


def parse_policy(data: object) -> Policy:
    if not isinstance(data, dict):
        raise PolicyError("invalid policy: the top level must be a mapping of settings")
    try:
        return Policy.model_validate(data)
    except ValidationError as err:
        raise PolicyError(_format_validation_error(err)) from None


def policy_from_yaml(text: str) -> Policy:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PolicyError(
            f"policy is not valid YAML{where}: {getattr(err, 'problem', err)}"
        ) from None
    return parse_policy(data)


def load_policy(path: str | Path) -> Policy:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError(f"policy file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise PolicyError(f"cannot read policy file {p}: {err.__class__.__name__}") from None
    return policy_from_yaml(text)
