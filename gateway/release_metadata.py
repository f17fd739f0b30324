"""What the metadata topic publishes for a policy version: everything an analyst needs to
reconstruct statistics from the protected records (the k claim, each attribute's method, the
randomized-response matrices with their versions, noise and coding parameters, how keyed draws
derive), and nothing of the secret."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.claim_step import ClaimStep
from gateway.draw_derivation import META_NAME, DrawDerivation
from gateway.grouping.guarantees import republication_statement
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.policy import Policy, Role


def release_metadata(
    p: Policy,
    *,
    claims: ClaimStep,
    mechanisms: Mapping[str, RRMechanism],
    versions: Mapping[str, str],
    draws: DrawDerivation | None,
) -> dict[str, object]:
    """Everything an analyst needs to reconstruct statistics (the meta topic's value):
    ``mechanisms`` and ``versions``, each randomized attribute's matrix and its version;
    ``draws``, the derivation of the keyed draws (None: not keyed)."""
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
        "randomized_response": {
            a: {**m.to_dict(), "matrix_version": versions[a]} for a, m in mechanisms.items()
        },
        "noise": {
            n: a.noise.model_dump(mode="json", exclude_none=True)
            for n, a in p.attributes.items()
            if a.noise is not None
        },
        "top_bottom_coding": {
            n: a.coding.model_dump(mode="json", exclude_none=True)
            for n, a in p.attributes.items()
            if a.coding is not None
        },
        # published as multiples of this step (a noised number: rounded after the noise,
        # which adds step²/12 to its error variance)
        "round_to": {n: a.round_to for n, a in p.attributes.items() if a.round_to is not None},
    }
