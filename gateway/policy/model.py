"""The policy model: every attribute and section, validated together, and its stable version."""

from __future__ import annotations

import difflib
import hashlib
import math
from dataclasses import dataclass
from typing import Annotated, Self

import numpy as np
import orjson
from pydantic import Field, model_validator

from gateway.policy.attribute import K_CLAIM_METHODS, Attribute, published_categories
from gateway.policy.enums import (
    AttrType,
    GroupingPool,
    Method,
    MicroaggAlgorithm,
    Pseudonym,
    RepublicationMode,
    Role,
)
from gateway.policy.sections import (
    ConsistencySpec,
    InputSpec,
    MicroaggSpec,
    OutputSpec,
    RepublicationSpec,
    RiskSpec,
    WindowSpec,
)
from gateway.policy.specs import Name, StrictModel

#: Largest wave number: the state stores waves as 32-bit integers (a larger one failed every
#: window that held it, on every worker that read it again).
MAX_WAVE = 2**31 - 1
# A sampling weight beyond this is a typo or an attack: 1e308 overflowed the panel's raking
# (the engine failed on the wave, in a loop), and two such weights nulled every weight of it
MAX_WEIGHT = 1e12

# cells of the grid of categories the edit rules are checked on (beyond it, not checked)
_MAX_RULE_GRID = 1 << 22
_KAFKA_RETENTION_MS = 7 * 86_400_000  # a topic's retention.ms unless set


def duration_text(seconds: float) -> str:
    """``seconds`` in the largest unit of days, hours and seconds that is at least one."""
    if seconds >= 86_400:
        return f"{seconds / 86_400:.3g} days"
    if seconds >= 3_600:
        return f"{seconds / 3_600:.3g} hours"
    return f"{seconds:.3g} s"


@dataclass(frozen=True, slots=True)
class LongestWait:
    """How long the stream may keep a record read but uncommitted (seconds), and the policy
    setting that bounds it."""

    seconds: float
    setting: str

    @property
    def retention_ms(self) -> int:
        """The retention.ms a topic whose records wait so long needs: twice the wait (they
        are decided only once a worker reads them: the margin is the outage around their
        decision it tolerates), Kafka's default week at least."""
        return max(_KAFKA_RETENTION_MS, math.ceil(2 * self.seconds * 1000))


class Policy(StrictModel):
    name: Name = "privgw"
    input: InputSpec = Field(default_factory=InputSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)
    window: WindowSpec = Field(default_factory=WindowSpec)
    microaggregation: MicroaggSpec = Field(default_factory=MicroaggSpec)
    consistency: ConsistencySpec = Field(default_factory=ConsistencySpec)
    republication: RepublicationSpec = Field(default_factory=RepublicationSpec)
    risk: RiskSpec = Field(default_factory=RiskSpec)
    attributes: Annotated[dict[Name, Attribute], Field(min_length=1)]

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
        self._default_to_panel()
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
        lo, hi = self.numeric_range(wave)
        if lo is not None and hi is not None and math.floor(hi) < math.ceil(lo):
            raise ValueError(
                f"attributes.{wave}.range holds no wave number: a wave is a whole number in "
                f"[0, {MAX_WAVE}]; widen the range or leave it out"
            )
        weight = self.republication.weight_name
        if self.republication.mode is RepublicationMode.PANEL and weight in self.attributes:
            raise ValueError(
                f"republication.weight_field '{weight}' is also an attribute: the panel "
                "publishes its analysis weight under that name; choose another field name"
            )

    def _default_to_panel(self) -> None:
        """A policy with waves that names no mode is a panel (since 0.3): unless it groups by
        window (``pool: window``) or recodes instead of microaggregating."""
        rep = self.republication
        if (
            "mode" in rep.model_fields_set
            or self.microaggregation.algorithm is not MicroaggAlgorithm.MDAV
            or ("pool" in rep.model_fields_set and rep.pool is GroupingPool.WINDOW)
        ):
            return
        panel = rep.model_copy(update={"mode": RepublicationMode.PANEL})
        object.__setattr__(self, "republication", panel)  # the model is frozen once built

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
        self._check_some_combination_allowed()

    def _check_some_combination_allowed(self) -> None:
        """Rules that together forbid every combination of the attributes they name leave a
        group nothing to publish for them (it would publish them blank): an error. Checked on
        the grid of those attributes' published categories, which is small in practice."""
        rules = self.microaggregation.edit_rules
        names = list(dict.fromkeys(name for rule in rules for name in rule))
        domains = [published_categories(self.attributes[name]) for name in names]
        if not rules or math.prod(len(d) for d in domains) > _MAX_RULE_GRID:
            return
        forbidden = np.zeros([len(d) for d in domains], dtype=bool)
        for rule in rules:
            box = [
                [d.index(c) for c in rule[name]] if name in rule else range(len(d))
                for name, d in zip(names, domains, strict=True)
            ]
            forbidden[np.ix_(*box)] = True
        if forbidden.all():
            raise ValueError(
                f"microaggregation.edit_rules forbid every combination of {', '.join(names)}: "
                "no group could publish them; a rule lists the combinations that cannot occur"
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
            if attr.type is AttrType.CATEGORICAL and ldiv.l > len(attr.domain):
                raise ValueError(
                    f"microaggregation.l_diversity.l is {ldiv.l}, but {ldiv.attribute!r} has "
                    f"{len(attr.domain)} categories: no group can hold {ldiv.l} distinct "
                    "values of it; lower l, or name an attribute with more categories"
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
    def grouped_by_file(self) -> bool:
        """Whether ``privgw protect`` groups the k claim itself (recoding, or strata and
        l-diversity over the whole file) and has the engine publish everything else."""
        spec = self.microaggregation
        return bool(
            spec.algorithm is MicroaggAlgorithm.RECODE_SUPPRESS
            or spec.strata
            or spec.l_diversity is not None
        )

    def numeric_range(self, name: str) -> tuple[float | None, float | None]:
        """The values an attribute takes (None: unbounded): its range (numeric attributes only
        have one), for the wave attribute at most [0, MAX_WAVE] too, and for the sampling
        weight at most ±MAX_WEIGHT."""
        attr = self.attributes[name]
        lo, hi = attr.range if attr.range is not None else (None, None)
        if attr.role is Role.WEIGHT:
            lo = -MAX_WEIGHT if lo is None else max(lo, -MAX_WEIGHT)
            hi = MAX_WEIGHT if hi is None else min(hi, MAX_WEIGHT)
        if name == self.republication.wave_attribute:
            lo = 0.0 if lo is None else max(lo, 0.0)
            hi = float(MAX_WAVE) if hi is None else min(hi, float(MAX_WAVE))
        return lo, hi

    def whole_number(self, name: str) -> bool:
        """Whether an attribute's values must be whole numbers (the wave number)."""
        return name == self.republication.wave_attribute

    @property
    def weight(self) -> str | None:
        """The sampling weight attribute (role ``weight``), if the policy names one."""
        return next((n for n, a in self.attributes.items() if a.role is Role.WEIGHT), None)

    @property
    def longest_wait(self) -> LongestWait:
        """A panel wave's records wait until the wave closes, at the latest max_wave_seconds
        after its first record; other records their hold for k, or the window. The input topic
        must keep records longer: a restart reads the uncommitted ones again from it."""
        rep, window = self.republication, self.window
        if rep.mode is RepublicationMode.PANEL:
            return LongestWait(rep.max_wave, "republication.max_wave_seconds")
        if window.max_seconds > window.max_hold_seconds:
            return LongestWait(window.max_seconds, "window.max_seconds")
        return LongestWait(window.max_hold_seconds, "window.max_hold_seconds")

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
        """Stable hash of the canonical form: same meaning, same version, whatever the layout
        — and whatever privgw version reads it: a setting added later counts only once set."""
        form = self.model_dump(mode="json")
        for section, name in _ADDED_SETTINGS:
            if form[section].get(name) is None:
                del form[section][name]
        if form["risk"].get("max_linked_below_k") is None:  # its default before 0.3
            form["risk"]["max_linked_below_k"] = 1.0
        canonical = orjson.dumps(form, option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(canonical).hexdigest()[:16]


# settings added after policies were deployed: left out of the version while unset, so that a
# policy keeps its version (and the output headers and metadata that carry it) across upgrades
_ADDED_SETTINGS = (
    ("microaggregation", "refine"),
    ("window", "max_idle_seconds"),
    ("republication", "retire_after_waves"),
    ("republication", "close_grace_seconds"),
    ("republication", "max_wave_seconds"),
    ("republication", "weight_field"),
    ("republication", "max_wave_step"),
)


# why a topic may not serve a second role, by the role it has first: input, output, dead
# letters, metadata, repartition (the changelog comes last, never first)
_TOPIC_CLASH = (
    "its records would be read back as input (a feedback loop)",
    "they would land in the protected stream, where raw values must never go",
    "they would mix with the raw dead letters",
    "they would mix with the policy metadata and key announcements analysts and workers read",
    "they would mix with the raw records re-routed to their partition",
)


def topic_clash(named: list[tuple[str, str]]) -> str | None:
    """The first pair of settings naming the same topic, as an error message; None if all
    differ. ``named``: (setting, topic) in the order input, output, dead-letter, metadata."""
    for i, (first, topic) in enumerate(named):
        for second, other in named[i + 1 :]:
            if topic == other:
                return (
                    f"{second} names the same topic as {first} ('{topic}'): "
                    f"{_TOPIC_CLASH[min(i, len(_TOPIC_CLASH) - 1)]}; give each its own topic"
                )
    return None
