"""Which protection each method of the policy builds: a new mechanism is a module with its
:class:`~gateway.mechanisms.protection.Protection` and one line here.

The quasi-identifiers of the k claim are not here: they are published as their groups'
centroids, by the grouping (:mod:`gateway.grouping`), whatever their method."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.errors import PolicyError
from gateway.mechanisms import noise_protection, recodings, rr_protection
from gateway.mechanisms.protection import Protection
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.policy import Attribute, Method, Policy

# (attribute name, its settings, the frequencies a fine-grain matrix is fitted to) -> protection
Builder = Callable[[str, Attribute, Mapping[str, float] | None], Protection]

BUILDERS: dict[Method, Builder] = {
    Method.RANDOMIZED_RESPONSE: rr_protection.build,
    Method.NOISE: noise_protection.build,
    Method.TOP_BOTTOM_CODE: recodings.top_bottom_code,
    Method.GENERALIZE: recodings.generalize,
    Method.COARSEN: recodings.coarsen,
    Method.KEEP: recodings.keep,
}


def protections(
    policy: Policy, frequencies: Mapping[str, Mapping[str, float]] | None = None
) -> dict[str, Protection]:
    """Each published attribute outside the k claim, in the policy's order, with its
    protection built once (``frequencies``: attribute -> category -> share, for fine-grain
    randomized response)."""
    claim = set(policy.k_claim)
    freqs = frequencies or {}
    built: dict[str, Protection] = {}
    for name, attr in policy.attributes.items():
        if attr.method is Method.DROP or name in claim:
            continue
        builder = BUILDERS.get(attr.method)
        if builder is None:
            raise PolicyError(
                f"attribute {name!r}: method {attr.method.value} has no mechanism outside the "
                "k claim; use one of "
                f"{sorted(m.value for m in BUILDERS)} or put the attribute in the k claim"
            )
        built[name] = builder(name, attr, freqs.get(name))
    return built


def randomized(protections: Mapping[str, Protection]) -> dict[str, RRMechanism]:
    """The randomized-response mechanisms among ``protections``, by attribute."""
    return {
        name: p.mechanism
        for name, p in protections.items()
        if isinstance(p, rr_protection.RandomizedResponse)
    }
