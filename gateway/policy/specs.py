"""The settings of one attribute's protection: randomized response, noise, coding, a
generalization hierarchy, coarsening; and the strict base every policy model shares."""

from __future__ import annotations

import math
import re
from typing import Annotated, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, model_validator

from gateway.policy.enums import RRMode, TimeUnit


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

_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]{1,249}")


def topic_name_problem(name: str) -> str | None:
    """Why Kafka would refuse ``name`` as a topic name (None: it would not). A broker refuses
    it at creation, or a development broker takes it, and the worker then waits on a topic
    nobody writes; checked when the setting is read instead."""
    if not _TOPIC_CHARS.fullmatch(name) or name in (".", ".."):
        shown = repr(name) if len(name) <= 60 else f"{name[:40]!r}… ({len(name)} characters)"
        return (
            f"must be 1 to 249 of the characters a-z A-Z 0-9 . _ - (a Kafka topic name), got "
            f"{shown}"
        )
    return None


def _topic(name: str) -> str:
    problem = topic_name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return name


TopicName = Annotated[str, AfterValidator(_topic)]


def _printable(name: str) -> str:
    # names reach terminals, logs, metric labels and CSV headers: an escape sequence in one
    # would rewrite what an operator reads
    if not name or not name.isprintable():
        raise ValueError(
            "must be a non-empty name without control characters (newline, tab, escape…), "
            f"got {name!r}"
        )
    return name


#: An attribute's, a field's or the policy's name.
Name = Annotated[str, AfterValidator(_printable)]

#: Largest microaggregation k: a group is held until k records arrive, so k beyond any
#: window size only holds records forever.
MAX_K = 1_000_000


class StrictModel(BaseModel):
    # no ±inf or NaN anywhere: a deadline of .inf seconds overflowed the worker's poll timeout
    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=False, use_enum_values=False, allow_inf_nan=False
    )


def check_probability(name: str, value: float | None) -> None:
    if value is not None and not (0.0 <= value <= 1.0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a probability in [0, 1], got {value}")


class RRSpec(StrictModel):
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
        check_probability("rr.retention", self.retention)
        check_probability("rr.rho1", self.rho1)
        check_probability("rr.rho2", self.rho2)
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


class NoiseSpec(StrictModel):
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


class CoarsenSpec(StrictModel):
    """Timestamps truncated to ``unit`` (published as ISO 8601 text of the unit's start)."""

    unit: TimeUnit = TimeUnit.DAY


class CodingSpec(StrictModel):
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


class HierarchySpec(StrictModel):
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
