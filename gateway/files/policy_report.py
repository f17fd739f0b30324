"""What a policy guarantees, per attribute (``privgw check-policy``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gateway.files.fileio import (
    read_table,
    records_from_frame,
)
from gateway.files.protect import value_frequencies
from gateway.grouping.guarantees import republication_statement
from gateway.grouping.mixed_microaggregation import (
    claim_columns,
)
from gateway.grouping.scope import stream_refusal
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.mechanisms.rr_constructions import from_spec
from gateway.policy import (
    Method,
    Policy,
    RRMode,
)

RHO1_GRID = (0.05, 0.1, 0.2, 0.3)


def policy_report(policy: Policy, data: str | Path | None = None) -> dict[str, Any]:
    """What the policy guarantees, per attribute. With ``data``, fine-grain mechanisms
    without rr.weights are built from its value frequencies, as ``protect_file`` builds them."""
    freqs: dict[str, dict[str, float]] = {}
    if data is not None:
        freqs = value_frequencies(
            records_from_frame(read_table(data, as_text=True), policy, data), policy
        )
    attrs: dict[str, Any] = {}
    claim, wait = policy.k_claim, policy.longest_wait
    kinds = {c.name: c.kind.value for c in claim_columns(policy)}
    for name, attr in policy.attributes.items():
        entry: dict[str, Any] = {
            "role": attr.role.value,
            "type": attr.type.value,
            "method": attr.method.value,
        }
        if attr.method is Method.RANDOMIZED_RESPONSE:
            mech = from_spec(attr, freqs.get(name), name=name)
            entry.update(_mechanism_report(mech))
            assert attr.rr is not None
            if attr.rr.mode in (RRMode.FINE_GRAIN, RRMode.INVARIANT) and attr.rr.weights is None:
                entry["note"] = (
                    f"no rr.weights: the matrix of {data}'s value frequencies, as `privgw "
                    "protect` builds it for that file"
                    if name in freqs
                    else "no rr.weights: equal weights, the matrix `privgw run` uses; `privgw "
                    "protect` weighs by the input's value frequencies (see it with --data FILE) "
                    "and publishes that matrix in OUT.meta.json"
                )
        elif name in claim:
            entry["k"] = policy.microaggregation.k
            entry["algorithm"] = policy.microaggregation.algorithm.value
            entry["kind"] = kinds[name]
            if attr.method is Method.GENERALIZE:
                entry["note"] = "generalized, then microaggregated at the generalized level"
        elif attr.method is Method.NOISE:
            assert attr.noise is not None
            entry["noise"] = attr.noise.model_dump(mode="json", exclude_none=True)
            if attr.coding is not None:
                entry["coding"] = attr.coding.model_dump(mode="json", exclude_none=True)
        if attr.round_to is not None:
            entry["round_to"] = attr.round_to
        if attr.unprotected:
            entry["k"] = None
            entry["note"] = "unprotected: published outside the k claim"
        attrs[name] = entry
    return {
        "policy": policy.name,
        "version": policy.version,
        "k": policy.microaggregation.k,
        "quasi_identifiers": [
            n for n, a in policy.attributes.items() if a.role.value == "quasi_identifier"
        ],
        # every published tuple of these, together, is shared by >= k respondents over the
        # whole publication history; the unprotected ones are outside that claim
        "k_claim": claim,
        "unprotected_quasi_identifiers": policy.unprotected_quasi_identifiers,
        # published beside the claim (role other): outside it, whatever their method
        "published_outside_k_claim": policy.published_outside_claim,
        # the sampling weight, when published: beside the claim too, and often unique
        "published_weight": published_weight(policy),
        "consistency": policy.consistency.mode.value,
        "stream_refusal": stream_refusal(policy),  # why `privgw run` refuses it; None: it runs
        "republication": republication_statement(policy),
        # the stream keeps a record read but uncommitted up to this long: the input topic must
        # keep records longer (a restart reads them again from it)
        "longest_wait": {
            "seconds": wait.seconds,
            "setting": wait.setting,
            "input_retention_ms": wait.retention_ms,
        },
        "attributes": attrs,
    }


def _mechanism_report(mech: RRMechanism) -> dict[str, Any]:
    return {
        "categories": list(mech.categories),
        "matrix": np.asarray(mech.matrix).round(6).tolist(),
        "retention": np.asarray(mech.retention).round(6).tolist(),
        "gamma": mech.gamma,
        "epsilon": mech.epsilon,
        "rho2_for_rho1": {str(r): mech.rho2_for(r) for r in RHO1_GRID},
    }


def published_weight(policy: Policy) -> str | None:
    """The sampling weight attribute when the policy publishes it (kept, rounded or not)."""
    name = policy.weight
    if name is None or policy.attributes[name].method is Method.DROP:
        return None
    return name
