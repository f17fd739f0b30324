"""What a policy change does to a state written under another policy: the facets a state
depends on, their differences, and how each one is classified.

A state written under one policy holds what that policy made: microaggregation groups formed
at its k over its quasi-identifiers, randomized-response draws made with its matrices, noise
drawn at its scale. A changed policy run on that state republishes those values under claims
they were not made for — a k raised from 5 to 6 left 99.7 % of the records in classes below
the new k. So the state records its policy's :class:`PolicyFacets`, and a change is one of:

* **safe** as it is: the state stays valid under the new policy (k lowered, a category added
  to a quasi-identifier, a new published attribute, another pseudonym mode, ...);
* **re-grouping**: stored groups do not meet the new policy — a raised k (groups formed with
  fewer members than the new k) or another quasi-identifier set, algorithm or attribute spec
  (every group). Their memberships are dropped (:mod:`gateway.policy.migration`) and their
  members grouped again, at the new k, when they next appear;
* **fresh draws**: stored draws were made under another mechanism — a new randomized-response
  matrix (an added category changes it) or another noise or coding spec. The attribute's
  stored draws are dropped and drawn again: each respondent's value of it is published anew,
  which an intruder holding both releases can compare. A counted privacy event, like a
  secret rotation.

Only the facets count: a policy whose version changes with none of them (a window size, a
topic, a risk threshold) runs on the state as it is.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.policy import Method, Policy, Role

__all__ = [
    "Change",
    "PolicyFacets",
    "Upgrade",
    "UpgradeAction",
    "diff",
    "facets",
]


class UpgradeAction(enum.StrEnum):
    SAFE = "safe"
    REGROUP = "regroup"
    FRESH_DRAWS = "fresh_draws"


@dataclass(frozen=True, slots=True)
class Change:
    """One difference between two policies' facets."""

    facet: str  # "k", "quasi_identifiers", an attribute name, ...
    detail: str  # what changed, in words (no data: policy settings only)
    action: UpgradeAction
    attribute: str | None = None  # the attribute whose stored draws start again (fresh draws)

    def text(self) -> str:
        return f"{self.detail} ({_ACTION_TEXT[self.action]})"


_ACTION_TEXT = {
    UpgradeAction.SAFE: "safe as it is",
    UpgradeAction.REGROUP: "needs re-grouping",
    UpgradeAction.FRESH_DRAWS: "fresh draws: a privacy event",
}


@dataclass(frozen=True, slots=True)
class PolicyFacets:
    """What a state depends on, as JSON-ready data (stored with the state)."""

    version: str
    name: str | None
    k: int
    microaggregation: Mapping[str, Any]  # algorithm, standardize
    k_claim: Sequence[str]
    quasi_identifiers: Mapping[str, Mapping[str, Any]]  # name -> attribute spec
    randomized: Mapping[str, Mapping[str, Any]]  # name -> matrix version, categories
    noised: Mapping[str, Mapping[str, Any]]  # name -> noise and coding specs
    published: Sequence[str]  # attributes published (not dropped)
    pseudonym: str
    consistency: str
    # republication.mode (None: a record written before it was a facet, not compared): what
    # the state's groups are (a panel's roster of cohorts, or the registry's groups)
    republication: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "name": self.name,
            "k": self.k,
            "microaggregation": dict(self.microaggregation),
            "k_claim": list(self.k_claim),
            "quasi_identifiers": {n: dict(s) for n, s in self.quasi_identifiers.items()},
            "randomized": {n: dict(s) for n, s in self.randomized.items()},
            "noised": {n: dict(s) for n, s in self.noised.items()},
            "published": list(self.published),
            "pseudonym": self.pseudonym,
            "consistency": self.consistency,
            "republication": self.republication,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PolicyFacets:
        return cls(
            version=str(doc["version"]),
            name=doc.get("name"),
            k=int(doc["k"]),
            microaggregation=dict(doc["microaggregation"]),
            k_claim=list(doc["k_claim"]),
            quasi_identifiers=dict(doc["quasi_identifiers"]),
            randomized=dict(doc["randomized"]),
            noised=dict(doc["noised"]),
            published=list(doc["published"]),
            pseudonym=str(doc["pseudonym"]),
            consistency=str(doc["consistency"]),
            republication=doc.get("republication"),
        )


def facets(policy: Policy, matrix_versions: Mapping[str, str]) -> PolicyFacets:
    """The facets of ``policy``; ``matrix_versions``: each randomized attribute's mechanism
    version (``Engine.metadata()["randomized_response"][a]["matrix_version"]``, the one
    stored with each draw)."""
    attrs = policy.attributes
    spec = policy.microaggregation
    return PolicyFacets(
        version=policy.version,
        name=policy.name,
        k=spec.k,
        microaggregation={"algorithm": spec.algorithm.value, "standardize": spec.standardize},
        k_claim=list(policy.k_claim),
        quasi_identifiers={
            n: a.model_dump(mode="json", exclude_none=True)
            for n, a in attrs.items()
            if a.role is Role.QUASI_IDENTIFIER
        },
        randomized={
            n: {"matrix_version": matrix_versions[n], "categories": list(attrs[n].domain)}
            for n in policy.randomized
        },
        noised={
            n: {
                "noise": a.noise.model_dump(mode="json", exclude_none=True),
                "coding": a.coding.model_dump(mode="json", exclude_none=True)
                if a.coding is not None
                else None,
            }
            for n, a in attrs.items()
            if a.method is Method.NOISE and a.noise is not None
        },
        published=[n for n, a in attrs.items() if a.method is not Method.DROP],
        pseudonym=policy.output.pseudonym.value,
        consistency=policy.consistency.mode.value,
        republication=policy.republication.mode.value,
    )


@dataclass(frozen=True, slots=True)
class Upgrade:
    """The changes from ``old`` to ``new`` and what they need."""

    old: PolicyFacets
    new: PolicyFacets
    changes: tuple[Change, ...]

    @property
    def same(self) -> bool:
        """No facet changed (the version may have: windows, topics, thresholds)."""
        return not self.changes

    @property
    def regroup_all(self) -> bool:
        """Every stored group is invalid (another quasi-identifier set or spec)."""
        return any(c.action is UpgradeAction.REGROUP and c.facet != "k" for c in self.changes)

    @property
    def min_group_size(self) -> int | None:
        """With a raised k only: groups formed with fewer members are re-formed."""
        raised = self.new.k > self.old.k
        return self.new.k if raised and not self.regroup_all else None

    @property
    def fresh_draws(self) -> list[str]:
        """Attributes whose stored draws start again (privacy events)."""
        return sorted(
            {
                c.attribute
                for c in self.changes
                if c.action is UpgradeAction.FRESH_DRAWS and c.attribute is not None
            }
        )

    @property
    def needs_migration(self) -> bool:
        return any(c.action is not UpgradeAction.SAFE for c in self.changes)

    def summary(self) -> str:
        """One line: every change with its class."""
        return "; ".join(c.text() for c in self.changes) or "no change to what the state holds"


def diff(old: PolicyFacets, new: PolicyFacets) -> Upgrade:
    """Classify every difference between ``old`` and ``new`` (module docstring)."""
    changes: list[Change] = []
    if new.k != old.k:
        changes.append(
            Change("k", f"k {old.k} -> {new.k}", UpgradeAction.REGROUP)
            if new.k > old.k
            else Change("k", f"k {old.k} -> {new.k}", UpgradeAction.SAFE)
        )
    changes += _quasi_identifier_changes(old, new)
    if new.microaggregation != old.microaggregation:
        changes.append(
            Change(
                "microaggregation",
                f"microaggregation {_settings(old.microaggregation)} -> "
                f"{_settings(new.microaggregation)}",
                UpgradeAction.REGROUP,
            )
        )
    changes += _mechanism_changes(old, new)
    if new.pseudonym != old.pseudonym:
        changes.append(
            Change(
                "pseudonym",
                f"output.pseudonym {old.pseudonym} -> {new.pseudonym}"
                + (" (releases become linkable by pseudonym)" if new.pseudonym != "drop" else ""),
                UpgradeAction.SAFE,
            )
        )
    if new.consistency != old.consistency:
        changes.append(
            Change(
                "consistency",
                f"consistency {old.consistency} -> {new.consistency}",
                UpgradeAction.SAFE,
            )
        )
    if (
        None not in (old.republication, new.republication)
        and new.republication != old.republication
    ):
        # the groups the state holds are another mode's: a panel's cohorts live in its roster,
        # the other modes' groups in the registry, and neither reads the other's, so every
        # respondent is grouped again and a linked set over the history is not kept across
        changes.append(
            Change(
                "republication",
                f"republication.mode {old.republication} -> {new.republication} (every "
                "respondent grouped again: linked sets over the history are not kept across "
                "the change)",
                UpgradeAction.REGROUP,
            )
        )
    changes += _publication_changes(old, new)
    return Upgrade(old=old, new=new, changes=tuple(changes))


def _how(f: PolicyFacets, name: str) -> str:
    if name in f.k_claim:
        return "in the k claim"
    if name in f.randomized:
        return "by randomized response"
    return "noised" if name in f.noised else "as it is"


def _publication_changes(old: PolicyFacets, new: PolicyFacets) -> list[Change]:
    """Attributes published from now on, no longer, or another way (a quasi-identifier now
    randomized, say: its group's value so far, its own randomized value from now on)."""
    out = [
        Change(name, f"{name} published from now on, {_how(new, name)}", UpgradeAction.SAFE)
        for name in sorted(set(new.published) - set(old.published))
        if name not in new.k_claim  # named with the k claim's quasi-identifiers
    ]
    out += [
        Change(name, f"{name} no longer published", UpgradeAction.SAFE)
        for name in sorted(set(old.published) - set(new.published))
    ]
    # into or out of the k claim is named with its quasi-identifiers, and between randomized
    # response and noise as "method changed": what is left is perturbed one side only
    perturbed = {"by randomized response", "noised"}
    for name in sorted(set(old.published) & set(new.published)):
        before, after = _how(old, name), _how(new, name)
        if before != after and len({before, after} & perturbed) == 1:
            out.append(Change(name, f"{name} published {before} -> {after}", UpgradeAction.SAFE))
    return out


def _quasi_identifier_changes(old: PolicyFacets, new: PolicyFacets) -> list[Change]:
    out: list[Change] = []
    added = [n for n in new.k_claim if n not in old.k_claim]
    removed = [n for n in old.k_claim if n not in new.k_claim]
    if added or removed:
        parts = [f"added {', '.join(added)}"] if added else []
        parts += [f"removed {', '.join(removed)}"] if removed else []
        out.append(
            Change(
                "quasi_identifiers",
                f"k-claim quasi-identifiers {'; '.join(parts)}",
                UpgradeAction.REGROUP,
            )
        )
    for name in new.k_claim:
        if name not in old.k_claim:
            continue
        before, after = old.quasi_identifiers.get(name, {}), new.quasi_identifiers.get(name, {})
        if before == after:
            continue
        rest_before = {k: v for k, v in before.items() if k != "categories"}
        rest_after = {k: v for k, v in after.items() if k != "categories"}
        cats_before, cats_after = before.get("categories") or [], after.get("categories") or []
        only_added = rest_before == rest_after and all(
            c in cats_after and cats_after.index(c) == i for i, c in enumerate(cats_before)
        )
        if only_added:  # a new value: existing tuples stay valid tuples of the new domain
            new_cats = [c for c in cats_after if c not in cats_before]
            out.append(
                Change(name, f"{name}: categories added {new_cats}", UpgradeAction.SAFE, name)
            )
        else:
            keys = sorted(
                {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
            )
            out.append(
                Change(name, f"{name}: {', '.join(keys)} changed", UpgradeAction.REGROUP, name)
            )
    return out


def _mechanism_changes(old: PolicyFacets, new: PolicyFacets) -> list[Change]:
    out: list[Change] = []
    for name, spec in sorted(new.randomized.items()):
        was = old.randomized.get(name)
        if was is None:
            continue  # first draws ever: nothing is drawn again
        if was.get("matrix_version") == spec.get("matrix_version"):
            continue
        added = [c for c in spec.get("categories", []) if c not in was.get("categories", [])]
        what = f"categories added {added}" if added else "randomized-response matrix changed"
        out.append(Change(name, f"{name}: {what}", UpgradeAction.FRESH_DRAWS, name))
    for name, spec in sorted(new.noised.items()):
        was = old.noised.get(name)
        if was is not None and was != spec:
            out.append(
                Change(name, f"{name}: noise or coding changed", UpgradeAction.FRESH_DRAWS, name)
            )
    for name in sorted(set(new.randomized) & set(old.noised)) + sorted(
        set(new.noised) & set(old.randomized)
    ):
        out.append(Change(name, f"{name}: method changed", UpgradeAction.FRESH_DRAWS, name))
    return out


def _settings(d: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items()))
