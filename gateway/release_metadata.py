"""What the metadata topic publishes for a policy version: everything an analyst needs to
reconstruct statistics from the protected records (the k claim, each attribute's method, the
randomized-response matrices with their versions, noise and coding parameters, how keyed draws
derive), and nothing of the secret."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.claim_step import ClaimStep
from gateway.draw_derivation import META_NAME, DrawDerivation
from gateway.grouping.guarantees import republication_statement
from gateway.mechanisms.protection import Protection
from gateway.policy import Policy, Role


def release_metadata(
    p: Policy,
    *,
    claims: ClaimStep,
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
    return {
        **keyed,
        "policy_version": p.version,
        "policy_name": p.name,
        "k": p.microaggregation.k,
        "microaggregation": p.microaggregation.algorithm.value,
        # groups never cross these strata; each publishes l distinct values of the attribute
        "strata": list(p.microaggregation.strata or []) if claim else [],
        "l_diversity": None
        if (diversify := claims.diversify) is None
        else {"attribute": claims.ldiv, "l": diversify.ell},
        "quasi_identifiers": [
            n for n, a in p.attributes.items() if a.role is Role.QUASI_IDENTIFIER
        ],
        "microaggregated": claim,
        # what the k claim covers: every published tuple of these is shared by >= k
        # respondents over the whole history; the unprotected ones are outside it
        "k_claim": claim,
        "quasi_identifier_kinds": {c.name: c.kind.value for c in claims.claim.columns},
        "unprotected_quasi_identifiers": p.unprotected_quasi_identifiers,
        "published_outside_k_claim": p.published_outside_claim,
        "methods": {n: a.method.value for n, a in p.attributes.items()},
        "consistency": p.consistency.mode.value,
        "republication": republication_statement(p),
        "edit_rules": p.microaggregation.edit_rules,
        **_sections(protections),
    }


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
