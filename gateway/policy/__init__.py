"""The policy: one YAML file naming every input attribute, its role and its protection.

Parsed strictly: unknown keys, duplicate keys, wrong types and impossible settings are errors
that name the key and the fix. A policy has a stable version (a hash of its canonical form)
stamped on every output record.

* :mod:`gateway.policy.enums` — roles, types, methods and modes;
* :mod:`gateway.policy.specs` — a method's settings (rr, noise, coding, hierarchy, coarsen);
* :mod:`gateway.policy.attribute` — one attribute, its method checked against its role and type;
* :mod:`gateway.policy.sections` — input, output, window, microaggregation, republication, risk;
* :mod:`gateway.policy.model` — the :class:`Policy`, validated as a whole, and its version;
* :mod:`gateway.policy.loading` — YAML in, a policy or an error naming the key and the fix;
* :mod:`gateway.policy.upgrade` and :mod:`gateway.policy.migration` — what a policy change does
  to a state written under another policy, and that state made valid under the new one.

The names below are the policy's public vocabulary, importable from ``gateway.policy``.
"""

from gateway.policy.attribute import K_CLAIM_METHODS, Attribute, published_categories
from gateway.policy.enums import (
    MISSING_LABEL,
    AttrType,
    ConsistencyMode,
    ExtraFields,
    GroupingPool,
    HoldTimeout,
    Method,
    MicroaggAlgorithm,
    MissingHandling,
    Pseudonym,
    RepublicationMode,
    Role,
    RRMode,
    SmallStrata,
    TimeUnit,
)
from gateway.policy.loading import load_policy, parse_policy, policy_from_yaml
from gateway.policy.model import MAX_WAVE, LongestWait, Policy, duration_text, topic_clash
from gateway.policy.sections import (
    ConsistencySpec,
    InputSpec,
    LDiversitySpec,
    MicroaggSpec,
    OutputSpec,
    RepublicationSpec,
    RiskSpec,
    WindowSpec,
)
from gateway.policy.specs import (
    MAX_K,
    CoarsenSpec,
    CodingSpec,
    HierarchySpec,
    NoiseSpec,
    RRSpec,
    TopicName,
    topic_name_problem,
)

__all__ = [
    "K_CLAIM_METHODS",
    "MAX_K",
    "MAX_WAVE",
    "MISSING_LABEL",
    "AttrType",
    "Attribute",
    "CoarsenSpec",
    "CodingSpec",
    "ConsistencyMode",
    "ConsistencySpec",
    "ExtraFields",
    "GroupingPool",
    "HierarchySpec",
    "HoldTimeout",
    "InputSpec",
    "LDiversitySpec",
    "LongestWait",
    "Method",
    "MicroaggAlgorithm",
    "MicroaggSpec",
    "MissingHandling",
    "NoiseSpec",
    "OutputSpec",
    "Policy",
    "Pseudonym",
    "RRMode",
    "RRSpec",
    "RepublicationMode",
    "RepublicationSpec",
    "RiskSpec",
    "Role",
    "SmallStrata",
    "TimeUnit",
    "TopicName",
    "WindowSpec",
    "duration_text",
    "load_policy",
    "parse_policy",
    "policy_from_yaml",
    "published_categories",
    "topic_clash",
    "topic_name_problem",
]
