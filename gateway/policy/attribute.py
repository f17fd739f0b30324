"""One attribute of the policy: its role, type and method, and the settings the method takes,
checked together (which methods a role and type allow, honest k claims)."""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Self

from pydantic import model_validator

from gateway.policy.enums import MISSING_LABEL, AttrType, Method, MissingHandling, Role
from gateway.policy.specs import (
    CoarsenSpec,
    CodingSpec,
    HierarchySpec,
    NoiseSpec,
    RRSpec,
    SBool,
    SFloat,
    StrictModel,
)

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


class Attribute(StrictModel):
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
        self._validate_settings()
        if self.categories is not None:
            if len(self.categories) < 2:
                raise ValueError("categories must list at least 2 values")
            if len(set(self.categories)) != len(self.categories):
                raise ValueError("categories lists a value twice; list each value once")
            if self.type is AttrType.NUMERIC:
                raise ValueError("categories only apply to categorical attributes")
        if self.method is Method.RANDOMIZED_RESPONSE:
            self._validate_rr()
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

    def _validate_settings(self) -> None:
        """Each method has its settings, and settings go with their method only."""
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

    def _validate_rr(self) -> None:
        """Randomized response over a public domain, its matrix and weights sized to it."""
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
