"""What the metadata topic publishes for a policy version: everything an analyst needs to
reconstruct statistics from the protected records (the k claim, each attribute's method, the
randomized-response matrices with their versions, noise and coding parameters, how keyed draws
derive), and nothing of the secret."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.grouping.guarantees import republication_statement
from gateway.grouping.mixed_microaggregation import claim_columns
from gateway.grouping.recode_stream import importance_order
from gateway.keyed.draw_derivation import META_NAME, DrawDerivation
from gateway.mechanisms.protection import Protection
from gateway.policy import Method, MicroaggAlgorithm, Policy, Role


def release_metadata(
    p: Policy,
    *,
    protections: Mapping[str, Protection],
    draws: DrawDerivation | None,
) -> dict[str, object]:
    """Everything an analyst needs to reconstruct statistics (the meta topic's value):
    ``protections``, each published attribute's protection outside the k claim, which says
    what of it is published (randomized response: its matrix and version; noise, coding and
    rounding: their settings); ``draws``, the derivation of the keyed draws (None: not
    keyed)."""
    keyed = {} if draws is None else {META_NAME: draws.value}
    claim = p.k_claim
    ldiv = p.microaggregation.l_diversity if claim else None
    return {
        **keyed,
        "policy_version": p.version,
        "policy_name": p.name,
        "k": p.microaggregation.k,
        "microaggregation": p.microaggregation.algorithm.value,
        # groups never cross these strata; each publishes l distinct values of the attribute
        "strata": list(p.microaggregation.strata or []) if claim else [],
        "l_diversity": None if ldiv is None else {"attribute": ldiv.attribute, "l": ldiv.l},
        "quasi_identifiers": [
            n for n, a in p.attributes.items() if a.role is Role.QUASI_IDENTIFIER
        ],
        "microaggregated": claim,
        # what the k claim covers: every published tuple of these is shared by >= k
        # respondents over the whole history; the unprotected ones are outside it
        "k_claim": claim,
        "quasi_identifier_kinds": {c.name: c.kind.value for c in claim_columns(p)},
        "unprotected_quasi_identifiers": p.unprotected_quasi_identifiers,
        "published_outside_k_claim": p.published_outside_claim,
        "methods": {n: a.method.value for n, a in p.attributes.items()},
        "consistency": p.consistency.mode.value,
        "republication": republication_statement(p),
        "edit_rules": p.microaggregation.edit_rules,
        # only where set (a file's blocks set it): MDAV's groups were improved by exchanges
        **({} if (refine := p.microaggregation.refine) is None else {"refine": refine}),
        # only where the policy recodes: other policies' metadata keeps its bytes
        **_recoding(p),
        **_sections(protections),
    }


def _recoding(p: Policy) -> dict[str, dict[str, object]]:
    """recode_suppress: the keys, how each is recoded, the suppression order and the
    invariant (an empty cell is suppressed or missing; analysts treat it as unknown)."""
    if p.microaggregation.algorithm is not MicroaggAlgorithm.RECODE_SUPPRESS:
        return {}
    attrs = p.attributes
    section: dict[str, object] = {
        "keys": p.k_claim,
        "bins": {n: attrs[n].bins for n in p.k_claim if attrs[n].bins is not None},
        "generalized": [n for n in p.k_claim if attrs[n].method is Method.GENERALIZE],
        "suppressed_first": [p.k_claim[j] for j in importance_order(p)],
        "invariant": "exact tuple: every published key tuple, an empty cell a value of its "
        "own, is shared by at least k respondents within its release",
    }
    return {"recode_suppress": section}


def _sections(protections: Mapping[str, Protection]) -> dict[str, dict[str, object]]:
    """Each protection's entries by section, in the policy's order: randomized response,
    noise, top/bottom coding and round_to (published as multiples of this step; a noised
    number is rounded after the noise, which adds step²/12 to its error variance) always
    present, a new mechanism's own sections after them."""
    sections: dict[str, dict[str, object]] = {
        "randomized_response": {},
        "noise": {},
        "top_bottom_coding": {},
        "round_to": {},
    }
    for name, protection in protections.items():
        for section, entry in protection.release().items():
            sections.setdefault(section, {})[name] = entry
    return sections
