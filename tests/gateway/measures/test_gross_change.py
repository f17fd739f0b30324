"""Gross change from linked pairs under sticky draws (gateway/measures/gross_change.py): the
model's columns are distributions, and over simulated panels the estimate is unbiased with the
standard error it reports, where inverting as if the waves' draws were independent is not."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.measures.gross_change import estimate_change, sticky_pairs_matrix
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.policy import RRMode


def _uniform(m: int, retention: float) -> RRMechanism:
    p = np.full((m, m), (1 - retention) / m) + np.eye(m) * retention
    return RRMechanism(tuple("abcdef"[:m]), p, RRMode.UNIFORM)


@given(st.integers(2, 5), st.floats(0.05, 0.95), st.integers(0, 2**31))
@settings(max_examples=50, deadline=None)
def test_each_true_change_gives_a_distribution_of_published_pairs(
    m: int, retention: float, seed: int
) -> None:
    # any column-stochastic P, not only uniform ones
    p = np.random.default_rng(seed).dirichlet(np.ones(m), size=m).T * (1 - retention)
    p += np.eye(m) * retention
    model = sticky_pairs_matrix(p)
    assert np.allclose(model.sum(axis=0), 1.0) and (model >= 0).all()


def _pairs(rng: np.random.Generator, mech: RRMechanism, joint: np.ndarray, n: int) -> tuple:
    m = mech.m
    cells = rng.choice(m * m, size=n, p=joint.reshape(-1))
    a, b = cells // m, cells % m
    cum = np.cumsum(mech.matrix, axis=0)

    def draw(true: np.ndarray) -> np.ndarray:  # one published code per true code
        return np.minimum((rng.random(true.size) > cum[:, true]).sum(axis=0), m - 1)

    first = draw(a)
    second = np.where(a == b, first, draw(b))  # unchanged: the same draw; changed: a new one
    return first, second


def test_the_estimate_is_unbiased_with_the_error_it_reports() -> None:
    rng = np.random.default_rng(12)
    for m, retention in ((2, 0.5), (3, 0.6)):
        mech = _uniform(m, retention)
        joint = rng.dirichlet(np.ones(m * m)).reshape(m, m) * 0.3 + np.eye(m) * (0.7 / m)
        truth = 1.0 - np.trace(joint)
        z, naive = [], []
        for _ in range(40):
            first, second = _pairs(rng, mech, joint, 3000)
            est = estimate_change(mech, first, second)
            z.append((est.gross - truth) / est.gross_se)
            # independent draws assumed: Q = P T Pᵀ, inverted
            q = np.bincount(first * m + second, minlength=m * m).reshape(m, m) / first.size
            inv = np.linalg.inv(mech.matrix)
            naive.append(1.0 - np.trace(inv @ q @ inv.T))
        z_arr = np.array(z)
        # mean of 40 z-scores has sd 1/√40; their sd is 1 within sampling error (χ², 39 df)
        assert abs(z_arr.mean()) < 4 / np.sqrt(40), (m, z_arr.mean())
        assert 0.55 < z_arr.std(ddof=1) < 1.5, (m, z_arr.std(ddof=1))
        assert abs(np.mean(naive) - truth) > 10 * np.std(naive) / np.sqrt(40)  # biased
