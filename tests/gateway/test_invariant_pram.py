"""Invariant PRAM: R·π = π, γ/ε from R, and the published marginal equals π in expectation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import PolicyError
from gateway.mechanisms.rr_constructions import from_spec, invariant, uniform
from gateway.policy import RRMode, parse_policy


def _gamma(matrix: np.ndarray) -> float:
    rows = [r for r in matrix if r.max() > 0]
    return max(r.max() / r.min() for r in rows)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(0.01, 1.0), min_size=2, max_size=8),
    st.floats(0.0, 0.95),
)
def test_invariant_matrix_keeps_the_reference_distribution(weights, share) -> None:
    cats = tuple(f"c{i}" for i in range(len(weights)))
    low = 1 / len(cats)  # retention in [1/m, 1)
    base = uniform(cats, retention=low + share * (1 - low))
    pi = np.array(weights) / sum(weights)
    mech = invariant(base, dict(zip(cats, weights, strict=True)))
    r = mech.matrix
    np.testing.assert_allclose(r @ pi, pi, rtol=0, atol=1e-12)  # R·π = π
    np.testing.assert_allclose(r.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    assert mech.mode is RRMode.INVARIANT
    assert mech.gamma == pytest.approx(_gamma(r), rel=1e-12)  # γ reported from R itself
    assert mech.gamma <= base.gamma * (1 + 1e-12)  # post-processing never costs privacy
    assert mech.epsilon == pytest.approx(np.log(mech.gamma), rel=1e-12)


def test_published_marginal_within_binomial_error() -> None:
    cats = ("a", "b", "c", "d")
    pi = np.array([0.55, 0.25, 0.15, 0.05])
    mech = invariant(uniform(cats, retention=0.5), dict(zip(cats, pi, strict=True)))
    n = 40_000
    counts = np.round(pi * n).astype(int)
    true = np.repeat(np.arange(4), counts)
    rng = np.random.default_rng(20261125)
    published = mech.apply(true, rng.random(true.size))
    share = np.bincount(published, minlength=4) / true.size
    r = mech.matrix
    # published count of j: a sum of independent Bernoulli(R[j][true]) draws
    se = np.sqrt((counts[None, :] * r * (1 - r)).sum(axis=1)) / true.size
    expected = r @ (counts / true.size)
    np.testing.assert_allclose(expected, counts / true.size, atol=1e-12)
    assert (np.abs(share - expected) <= 4 * se).all(), (share, expected, se)


def test_policy_mode_invariant_uses_weights_as_reference() -> None:
    attr = {
        "role": "sensitive",
        "type": "categorical",
        "method": "randomized_response",
        "categories": ["x", "y", "z"],
        "rr": {"mode": "invariant", "epsilon": 1.0, "weights": {"x": 6, "y": 3, "z": 1}},
    }
    policy = parse_policy({"attributes": {"s": attr}})
    mech = from_spec(policy.attributes["s"])
    np.testing.assert_allclose(mech.matrix @ [0.6, 0.3, 0.1], [0.6, 0.3, 0.1], atol=1e-12)
    assert mech.epsilon <= 1.0 + 1e-12
    # the file's frequencies stand in when the policy gives no weights
    del attr["rr"]["weights"]
    mech = from_spec(parse_policy({"attributes": {"s": attr}}).attributes["s"], {"x": 0.2,
                     "y": 0.2, "z": 0.6})  # fmt: skip
    np.testing.assert_allclose(mech.matrix @ [0.2, 0.2, 0.6], [0.2, 0.2, 0.6], atol=1e-12)
    attr["rr"] = {"mode": "invariant"}
    with pytest.raises(PolicyError, match="exactly one of"):
        parse_policy({"attributes": {"s": attr}})
