"""Analyst-side reconstruction of the true distribution behind randomized responses.

Statistical checks compare estimates with the truth in units of their own standard error,
and check those standard errors against the spread over Monte Carlo replications; bounds
come from the sampling distribution of the check statistic, not from a hand-picked delta.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gateway.errors import InputDataError, MechanismError
from gateway.measures.reconstruction import (
    DistributionEstimate,
    count_codes,
    project_to_simplex,
    reconstruct,
    renormalise,
)
from gateway.mechanisms.randomized_response import RRMechanism, from_matrix
from gateway.mechanisms.rr_constructions import fine_grain, uniform
from gateway.policy import MISSING_LABEL

CATS4 = ("a", "b", "c", "d")
PI4 = np.array([0.4, 0.3, 0.2, 0.1])


def loglik(mech: RRMechanism, counts: np.ndarray, pi: np.ndarray) -> float:
    q = mech.matrix @ pi
    used = counts > 0
    return float(counts[used] @ np.log(q[used]))


def publish(mech: RRMechanism, pi: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    true_codes = rng.choice(mech.m, size=n, p=pi).astype(np.int64)
    return mech.apply(true_codes, rng.random(n))


MECHS = {
    "uniform": (uniform(CATS4, retention=0.6), PI4),
    "fine_grain": (
        fine_grain(("p", "q", "r", "s", "t"), gamma=6.0, weights=[1, 2, 3, 4, 5]),
        np.array([0.1, 0.15, 0.2, 0.25, 0.3]),
    ),
    "matrix": (
        from_matrix(("x", "y", "z"), [[0.7, 0.1, 0.1], [0.2, 0.6, 0.3], [0.1, 0.3, 0.6]]),
        np.array([0.5, 0.3, 0.2]),
    ),
}


@pytest.mark.parametrize("name", sorted(MECHS))
def test_recovers_known_distribution_within_its_standard_error(name: str) -> None:
    """|π̂ - π| ≤ 4·SE per category and estimator; P(any of the ≤ 24 checks fails) ≈ 2e-3."""
    mech, pi = MECHS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    est = reconstruct(mech, publish(mech, pi, 40_000, rng))
    assert est.n == 40_000
    assert est.inversion_ok and est.em_converged
    assert np.all(np.abs(est.inversion - pi) <= 4 * est.inversion_se)
    assert np.all(np.abs(est.em - pi) <= 4 * est.em_se)
    # the published frequencies themselves are biased towards the noise: reconstruction helps
    assert np.abs(est.em - pi).sum() < np.abs(est.observed - pi).sum()
    for x in (est.inversion, est.em):
        assert np.all(x >= 0) and x.sum() == pytest.approx(1.0, abs=1e-12)


def test_standard_errors_are_calibrated() -> None:
    """Over R replications, the spread of the estimates matches the reported SE.

    With R = 400 the sample SD has relative standard error ≈ 1/√(2(R-1)) ≈ 3.5%, so the
    ratio SD/SE must lie in 1 ± 4.5·3.5%; 95% intervals cover with probability within
    4.5 binomial standard errors of 0.95; the mean of the unprojected inversion (unbiased)
    lies within 4.5·SD/√R of π.
    """
    mech = uniform(CATS4, retention=0.6)
    n, reps = 5_000, 400
    rng = np.random.default_rng(11)
    q = mech.matrix @ PI4
    inv_raw, inv_se, em, em_se = [], [], [], []
    for _ in range(reps):
        est = reconstruct(mech, rng.multinomial(n, q), counts=True, tol=1e-12)
        inv_raw.append(est.inversion_raw)
        inv_se.append(est.inversion_se)
        em.append(est.em)
        em_se.append(est.em_se)
    rel = 4.5 / math.sqrt(2 * (reps - 1))
    for values, ses in ((np.array(inv_raw), np.array(inv_se)), (np.array(em), np.array(em_se))):
        sd = values.std(axis=0, ddof=1)
        se = ses.mean(axis=0)
        np.testing.assert_array_less(np.abs(sd / se - 1.0), rel)
        cover = (np.abs(values - PI4) <= 1.959964 * ses).mean(axis=0)
        np.testing.assert_array_less(np.abs(cover - 0.95), 4.5 * math.sqrt(0.95 * 0.05 / reps))
    mean_raw = np.array(inv_raw).mean(axis=0)
    sd_raw = np.array(inv_raw).std(axis=0, ddof=1)
    np.testing.assert_array_less(np.abs(mean_raw - PI4), 4.5 * sd_raw / math.sqrt(reps))


def test_renormalised_shares_have_calibrated_standard_errors() -> None:
    """The shares among the answered categories, π_i / (1 − π_missing), spread over R
    replications as their delta-method SE says (the same bounds as above)."""
    mech = uniform(("a", "b", "c", MISSING_LABEL), retention=0.6)
    n, reps = 5_000, 400
    rng = np.random.default_rng(12)
    pi = np.array([0.3, 0.1, 0.1, 0.5])  # half missing: the rescaling's own variance shows
    q = mech.matrix @ pi
    truth = pi[:3] / (1 - pi[3])
    shares, ses = [], []
    for _ in range(reps):
        r = renormalise(
            reconstruct(mech, rng.multinomial(n, q), counts=True, tol=1e-12), MISSING_LABEL
        )
        assert r.categories == ("a", "b", "c")
        shares.append(r.shares)
        ses.append(r.se)
    values, se = np.array(shares), np.array(ses)
    ratio = values.std(axis=0, ddof=1) / se.mean(axis=0)
    np.testing.assert_array_less(np.abs(ratio - 1.0), 4.5 / math.sqrt(2 * (reps - 1)))
    cover = (np.abs(values - truth) <= 1.959964 * se).mean(axis=0)
    np.testing.assert_array_less(np.abs(cover - 0.95), 4.5 * math.sqrt(0.95 * 0.05 / reps))


def test_renormalised_standard_errors_are_the_reparametrised_information() -> None:
    """The MLE is invariant to reparametrisation: in (r_a, r_b, π_missing), with
    π = ((1 − π_m)·r, π_m), the inverse of minus the numerical Hessian of the log-likelihood
    gives the renormalised shares' covariance directly, with no delta method."""
    mech = uniform(("a", "b", "c", MISSING_LABEL), retention=0.6)
    counts = np.round(mech.matrix @ np.array([0.6, 0.05, 0.05, 0.3]) * 5000)
    est = reconstruct(mech, counts, counts=True, tol=1e-13)
    r = renormalise(est, MISSING_LABEL)

    def ll(t: np.ndarray) -> float:
        shares = np.array([t[0], t[1], 1 - t[0] - t[1]])
        return loglik(mech, counts, np.append(shares * (1 - t[2]), t[2]))

    t0, h = np.array([r.shares[0], r.shares[1], est.em[3]]), 1e-5
    hess = np.empty((3, 3))
    for a, b in itertools.product(range(3), repeat=2):
        ea, eb = np.eye(3)[a] * h, np.eye(3)[b] * h
        hess[a, b] = (ll(t0 + ea + eb) - ll(t0 + ea - eb) - ll(t0 - ea + eb) + ll(t0 - ea - eb)) / (
            4 * h * h
        )
    cov = np.linalg.inv(-hess)[:2, :2]
    jac = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    np.testing.assert_allclose(r.se, np.sqrt(np.diag(jac @ cov @ jac.T)), rtol=1e-3)


@given(st.lists(st.integers(1, 500), min_size=4, max_size=4))
@settings(max_examples=40, deadline=None)
def test_renormalised_shares_sum_to_one_and_rescale_em(counts: list[int]) -> None:
    mech = fine_grain(("a", "b", "c", MISSING_LABEL), gamma=4.0, weights=[1, 2, 3, 4])
    est = reconstruct(mech, np.array(counts, dtype=float), counts=True)
    r = renormalise(est, MISSING_LABEL)
    assert math.isclose(float(r.shares.sum()), 1.0, abs_tol=1e-9)
    np.testing.assert_allclose(r.shares, est.em[:3] / est.em[:3].sum(), rtol=1e-12)
    if est.em[3] < 0.99:  # π_i / (1 − π_missing), where the subtraction loses no digits
        np.testing.assert_allclose(r.shares, est.em[:3] / (1 - est.em[3]), rtol=1e-9)
    assert bool(np.all(r.se >= 0))
    plain = renormalise(est, "no such category")  # nothing to leave out: the EM as it is
    np.testing.assert_array_equal(plain.shares, est.em)


def test_exact_counts_are_recovered_exactly() -> None:
    mech = fine_grain(("p", "q", "r", "s", "t"), gamma=6.0, weights=[1, 2, 3, 4, 5])
    pi = np.array([0.1, 0.15, 0.2, 0.25, 0.3])
    counts = 1e6 * (mech.matrix @ pi)
    est = reconstruct(mech, counts, counts=True, tol=1e-13)
    np.testing.assert_allclose(est.inversion_raw, pi, atol=1e-12)
    np.testing.assert_allclose(est.inversion, pi, atol=1e-12)
    np.testing.assert_allclose(est.em, pi, atol=1e-8)
    # at an interior MLE the observed information equals the delta method
    np.testing.assert_allclose(est.em_se, est.inversion_se, rtol=1e-5)
    assert est.notes == ()


def test_singular_matrix_inversion_is_nan_em_still_works() -> None:
    mech = uniform(CATS4, retention=0.25)  # pure noise: P = J/4
    rng = np.random.default_rng(5)
    est = reconstruct(mech, publish(mech, PI4, 1000, rng))
    assert not est.inversion_ok
    assert np.all(np.isnan(est.inversion)) and np.all(np.isnan(est.inversion_se))
    assert np.all(np.isnan(est.inversion_raw))
    assert any("singular" in note for note in est.notes)
    assert np.all(np.isfinite(est.em)) and est.em.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(est.em, 0.25)  # no information: EM stays at its start
    assert np.all(np.isinf(est.em_se))


def test_rank_deficient_matrix_em_fits_what_is_identifiable() -> None:
    # "x" and "y" are published alike: only π_x + π_y and π_z are identifiable
    mech = from_matrix(("x", "y", "z"), [[0.5, 0.5, 0.2], [0.3, 0.3, 0.2], [0.2, 0.2, 0.6]])
    pi = np.array([0.2, 0.3, 0.5])
    counts = 1e5 * (mech.matrix @ pi)
    est = reconstruct(mech, counts, counts=True)
    assert not est.inversion_ok
    assert est.em[0] + est.em[1] == pytest.approx(0.5, abs=1e-8)
    assert est.em[2] == pytest.approx(0.5, abs=1e-8)
    np.testing.assert_allclose(mech.matrix @ est.em, est.observed, atol=1e-9)


def test_boundary_truth_projection_and_em_stay_in_simplex() -> None:
    mech = uniform(CATS4, retention=0.5)
    pi = np.array([0.5, 0.5, 0.0, 0.0])
    rng = np.random.default_rng(2)
    est = reconstruct(mech, publish(mech, pi, 3000, rng))
    for x in (est.inversion, est.em):
        assert np.all(x >= 0.0) and x.sum() == pytest.approx(1.0, abs=1e-12)
    if np.any(est.inversion_raw < 0):
        assert any("projected" in note for note in est.notes)
        np.testing.assert_allclose(est.inversion, project_to_simplex(est.inversion_raw))
    np.testing.assert_array_less(np.abs(est.em - pi), 4 * est.em_se + 1e-6)


def test_em_increases_the_likelihood_monotonically() -> None:
    mech = MECHS["matrix"][0]
    rng = np.random.default_rng(9)
    counts = count_codes(mech, publish(mech, MECHS["matrix"][1], 2000, rng)).astype(float)
    values = [
        loglik(mech, counts, reconstruct(mech, counts, counts=True, method="em", max_iter=k).em)
        for k in range(1, 40)
    ]
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(values))


def test_input_forms_agree_and_missing_is_left_out() -> None:
    mech = uniform(CATS4, retention=0.7)
    rng = np.random.default_rng(4)
    codes = publish(mech, PI4, 500, rng)
    codes[::10] = -1  # missing kept as missing
    from_codes = reconstruct(mech, codes)
    counts = np.bincount(codes[codes >= 0], minlength=4)
    from_array = reconstruct(mech, counts, counts=True)
    from_map = reconstruct(mech, {c: int(k) for c, k in zip(CATS4, counts, strict=True) if k})
    assert from_codes.n == int(np.count_nonzero(codes >= 0)) == 450
    for other in (from_array, from_map):
        np.testing.assert_array_equal(other.observed, from_codes.observed)
        np.testing.assert_array_equal(other.inversion, from_codes.inversion)
        np.testing.assert_array_equal(other.em, from_codes.em)


def test_method_selection() -> None:
    mech, pi = MECHS["uniform"]
    counts = 1000 * (mech.matrix @ pi)
    inv_only = reconstruct(mech, counts, counts=True, method="inversion")
    assert inv_only.inversion_ok and inv_only.em_iterations == 0 and not inv_only.em_converged
    assert np.all(np.isnan(inv_only.em)) and np.all(np.isnan(inv_only.em_se))
    em_only = reconstruct(mech, counts, counts=True, method="em")
    assert not em_only.inversion_ok and np.all(np.isnan(em_only.inversion))
    assert em_only.em_converged and em_only.em_iterations > 0


def test_em_not_converged_is_flagged() -> None:
    mech, pi = MECHS["uniform"]
    est = reconstruct(mech, 1000 * (mech.matrix @ pi), counts=True, max_iter=2)
    assert not est.em_converged and est.em_iterations == 2
    assert any("max_iter" in note for note in est.notes)


def test_estimate_is_read_only_and_frames() -> None:
    mech, pi = MECHS["uniform"]
    est = reconstruct(mech, 1000 * (mech.matrix @ pi), counts=True)
    assert isinstance(est, DistributionEstimate)
    with pytest.raises(ValueError, match="read-only"):
        est.em[0] = 1.0
    frame = est.to_frame()
    assert list(frame.index) == list(CATS4)
    assert list(frame.columns) == ["observed", "inversion", "inversion_se", "em", "em_se"]
    d = json.loads(json.dumps(est.to_dict(), allow_nan=False))
    assert d["n"] == 1000 and d["categories"] == list(CATS4)
    np.testing.assert_allclose(d["em"], est.em)


def test_estimate_to_dict_keeps_non_finite_as_floats() -> None:
    mech = uniform(CATS4, retention=0.25)
    d = reconstruct(mech, np.array([0, 1, 2, 3])).to_dict()
    inversion, em_se = d["inversion"], d["em_se"]
    assert isinstance(inversion, list) and all(math.isnan(v) for v in inversion)
    assert isinstance(em_se, list) and all(math.isinf(v) for v in em_se)
    assert f"{inversion[0]:.4f}" == "nan"  # reports can format it
    assert d["inversion_ok"] is False and d["notes"]


@pytest.mark.parametrize(
    ("published", "kwargs", "error", "match"),
    [
        (np.array([0, 1, 4]), {}, InputDataError, r"≥ the number of categories \(4\)"),
        (np.array([0.0, 1.0]), {}, InputDataError, "must be integers"),
        (np.array([-1, -1]), {}, InputDataError, "no published values"),
        (np.array([1.0, -1.0, 1.0, 1.0]), {"counts": True}, InputDataError, "≥ 0 and finite"),
        (np.array([1.0, 1.0]), {"counts": True}, InputDataError, "one count per category"),
        ({"top-secret": 3}, {}, InputDataError, "not the mechanism's categories"),
        (np.array([0, 1]), {"method": "mle"}, MechanismError, "method must be"),
        (np.array([0, 1]), {"tol": 0.0}, MechanismError, "tol must be > 0"),
        (np.array([0, 1]), {"max_iter": 0}, MechanismError, "max_iter must be ≥ 1"),
    ],
)
def test_rejects_bad_input(
    published: object, kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        reconstruct(uniform(CATS4, retention=0.6), published, **kwargs)  # type: ignore[arg-type]
    assert "top-secret" not in str(info.value)


def test_rejects_counts_the_mechanism_cannot_produce() -> None:
    mech = from_matrix(("x", "y", "z"), [[0.6, 0.4, 0.5], [0.4, 0.6, 0.5], [0.0, 0.0, 0.0]])
    with pytest.raises(InputDataError, match="never publishes"):
        reconstruct(mech, np.array([0, 1, 2]))


# -- simplex projection -------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    v=arrays(np.float64, st.integers(1, 30), elements=st.floats(-10, 10)), seed=st.integers(0, 1000)
)
def test_projection_onto_simplex(v: np.ndarray, seed: int) -> None:
    x = project_to_simplex(v)
    assert np.all(x >= 0) and x.sum() == pytest.approx(1.0, abs=1e-12)
    # KKT: x = max(v - θ, 0) for one θ
    pos = x > 1e-12
    theta = v[pos] - x[pos]
    np.testing.assert_allclose(theta, theta[0], atol=1e-9)
    assert np.all(v[~pos] <= theta[0] + 1e-9)
    # idempotent, and no simplex point is closer to v
    np.testing.assert_allclose(project_to_simplex(x), x, atol=1e-12)
    others = np.random.default_rng(seed).dirichlet(np.ones(v.size), size=50)
    assert np.all(np.linalg.norm(others - v, axis=1) >= np.linalg.norm(x - v) - 1e-12)


def test_projection_of_non_finite_is_nan() -> None:
    assert np.all(np.isnan(project_to_simplex([np.nan, 1.0])))
