"""Randomized-response mechanisms: construction, privacy cost, perturbation, metadata.

Statistical checks derive their tolerance from the binomial distribution with a Bonferroni
correction over all cells compared, never from a hand-picked delta. Seeds are fixed, so a
run is reproducible; the family-wise false-alarm rate is still stated for each check.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from scipy import stats
from scipy.optimize import linprog

from gateway.errors import MechanismError
from gateway.measures.reconstruction import DistributionEstimate, reconstruct
from gateway.mechanisms.randomized_response import RRMechanism, from_dict, from_matrix
from gateway.mechanisms.rr_constructions import (
    FINE_GRAIN_MAX_GAMMA,
    MIN_RETENTION_SHARE,
    fine_grain,
    from_spec,
    gamma_for,
    uniform,
)
from gateway.policy import MISSING_LABEL, Attribute, RRMode

CATS4 = ("a", "b", "c", "d")
GAMMA_SLACK = 1e-9  # relative rounding slack on the amplification bound


def cats(m: int) -> list[str]:
    return [f"v{i}" for i in range(m)]


def row_amplification(p: np.ndarray) -> float:
    """max over rows of max/min, computed independently of RRMechanism.gamma."""
    worst = 1.0
    for row in p:
        if row.max() == 0.0:
            continue
        if row.min() == 0.0:
            return math.inf
        worst = max(worst, row.max() / row.min())
    return worst


def fine_grain_oracle(f: np.ndarray, gamma: float) -> float:
    """Closed-form optimum of the fine-grain LP (expected retention Σ f_i P[i, i]).

    With the replacement rule, the bound reads A·top1(p) + B·top2(p) ≤ γ - 1 with
    A = max(m-1, γ), B = min(m-1, γ). Any optimum can be moved to p = (a at the heaviest
    value, s elsewhere), so the optimum of Σ f_i p_i is the best vertex of a 2-variable LP:
    uniform (a = s = (γ-1)/(A+B)) or a single spike over the floor that keeps P invertible
    (s = φ = MIN_RETENTION_SHARE·(γ-1)/(A+B), a = (γ-1 - B·φ)/A).
    """
    m = f.size
    f = f / f.sum()
    c = gamma - 1.0
    big, small = max(m - 1.0, gamma), min(m - 1.0, gamma)
    floor = MIN_RETENTION_SHARE * c / (big + small)
    top = float(f.max())
    best_fp = max(c / (big + small), top * (c - small * floor) / big + (1.0 - top) * floor)
    return (1.0 + (m - 1.0) * best_fp) / m


def dense_lp_optimum(f: np.ndarray, gamma: float) -> float:
    """The naive fine-grain LP with all m(m-1) row constraints (m p_j + ... written out)."""
    m = f.size
    f = f / f.sum()
    rows = []
    for j, i in itertools.permutations(range(m), 2):
        # row j: P[j, j] ≤ γ P[j, i]  ⇔  1 + (m-1) p_j ≤ γ (1 - p_i)
        r = np.zeros(m)
        r[j] += m - 1.0
        r[i] += gamma
        rows.append(r)
    floor = MIN_RETENTION_SHARE * (gamma - 1.0) / (max(m - 1.0, gamma) + min(m - 1.0, gamma))
    # HiGHS stops within 1e-7 of feasibility by default, as far off as this test's tolerance
    # (w=[1.5, 1.75, 6.75, 1e-6, 1e-6], γ=27 came out 1.006e-7 below the exact 27/31)
    res = linprog(
        -f,
        A_ub=np.array(rows),
        b_ub=np.full(len(rows), gamma - 1.0),
        bounds=[(floor, 1)] * m,
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    assert res.status == 0
    p = res.x
    return float(f @ (p + (1.0 - p) / m))


# -- uniform ------------------------------------------------------------------------------------


def test_golden_uniform_retention_075_over_4_categories_is_ln9() -> None:
    mech = uniform(CATS4, retention=0.75)
    assert mech.gamma == pytest.approx(9.0, rel=1e-15)
    assert mech.epsilon == pytest.approx(math.log(9.0), rel=1e-15)
    # OpenDP k-ary randomized response: ε = ln(p(t-1)/(1-p))
    assert mech.epsilon == pytest.approx(math.log(0.75 * 3 / 0.25), rel=1e-15)
    assert mech.mode is RRMode.UNIFORM
    np.testing.assert_allclose(mech.retention, 0.75)
    np.testing.assert_allclose(mech.matrix[1, 0], 0.25 / 3)


def test_uniform_strengths_agree() -> None:
    by_retention = uniform(CATS4, retention=0.75)
    for mech in (
        uniform(CATS4, gamma=9.0),
        uniform(CATS4, epsilon=math.log(9.0)),
        uniform(CATS4, rho=(0.1, 0.5)),  # 0.5·0.9 / (0.1·0.5) = 9
    ):
        np.testing.assert_allclose(mech.matrix, by_retention.matrix, rtol=1e-12)
        assert mech.gamma == pytest.approx(9.0, rel=1e-12)


def test_uniform_matches_replacement_rule() -> None:
    m, p = 5, 0.4  # retain with probability p, else uniform over all m values
    mech = uniform(cats(m), retention=p + (1 - p) / m)
    expected = np.full((m, m), (1 - p) / m)
    np.fill_diagonal(expected, p + (1 - p) / m)
    np.testing.assert_allclose(mech.matrix, expected, rtol=1e-12)
    assert mech.gamma == pytest.approx(1 + m * p / (1 - p), rel=1e-12)


def test_uniform_retention_one_over_m_is_pure_noise() -> None:
    mech = uniform(CATS4, retention=0.25)
    np.testing.assert_allclose(mech.matrix, 0.25)
    assert mech.gamma == 1.0
    assert mech.epsilon == 0.0
    assert not mech.is_invertible
    assert uniform(CATS4, gamma=1.0) == mech


@settings(max_examples=80, deadline=None)
@given(m=st.integers(2, 60), gamma=st.floats(1.0, 1e4))
def test_uniform_properties(m: int, gamma: float) -> None:
    mech = uniform(cats(m), gamma=gamma)
    np.testing.assert_allclose(mech.matrix.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    assert mech.gamma == pytest.approx(gamma, rel=GAMMA_SLACK)
    assert row_amplification(mech.matrix) <= gamma * (1 + GAMMA_SLACK)
    p = (gamma - 1) / (gamma - 1 + m)
    np.testing.assert_allclose(mech.retention, p + (1 - p) / m, rtol=1e-12)


# -- privacy bounds -----------------------------------------------------------------------------


def test_rho_bounds_golden() -> None:
    mech = uniform(CATS4, retention=0.75)  # γ = 9
    assert mech.rho2_for(0.1) == pytest.approx(0.9 / (0.9 + 0.9))  # = 0.5
    assert mech.satisfies(0.1, 0.5)
    assert not mech.satisfies(0.1, 0.49)
    assert mech.satisfies(0.1, 0.6)
    built = uniform(CATS4, rho=(0.2, 0.5))
    assert built.satisfies(0.2, 0.5)
    assert built.rho2_for(0.2) == pytest.approx(0.5, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(gamma=st.floats(1.0, 1e4), rho1=st.floats(1e-4, 0.5))
def test_rho2_for_is_tight(gamma: float, rho1: float) -> None:
    mech = uniform(CATS4, gamma=gamma)
    rho2 = mech.rho2_for(rho1)
    assume(rho1 < rho2 < 1.0)
    assert mech.satisfies(rho1, rho2)
    # and the bound is the definition: γ = ρ2(1-ρ1) / (ρ1(1-ρ2))
    assert rho2 * (1 - rho1) / (rho1 * (1 - rho2)) == pytest.approx(mech.gamma, rel=1e-6)


def test_unbounded_amplification() -> None:
    mech = from_matrix(("x", "y"), [[1.0, 0.2], [0.0, 0.8]])
    assert mech.gamma == math.inf
    assert mech.epsilon == math.inf
    assert mech.rho2_for(0.1) == 1.0
    assert not mech.satisfies(0.1, 0.9)
    d = mech.to_dict()
    assert d["gamma"] is None and d["epsilon"] is None
    assert from_dict(json.loads(json.dumps(d))) == mech


def test_never_published_row_is_ignored_by_gamma() -> None:
    mech = from_matrix(("x", "y", "z"), [[0.6, 0.4, 0.5], [0.4, 0.6, 0.5], [0.0, 0.0, 0.0]])
    assert mech.gamma == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rho1": 0.0}, "rho1"),
        ({"rho1": 1.0}, "rho1"),
        ({"rho1": math.nan}, "rho1"),
    ],
)
def test_rho2_for_rejects_bad_rho1(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(MechanismError, match=match):
        uniform(CATS4, retention=0.5).rho2_for(kwargs["rho1"])


def test_satisfies_rejects_bad_pair() -> None:
    with pytest.raises(MechanismError, match="rho1 < rho2"):
        uniform(CATS4, retention=0.5).satisfies(0.5, 0.2)


# -- fine grain ---------------------------------------------------------------------------------


def test_fine_grain_two_values_known_solution() -> None:
    # m = 2, γ = 3, all weight on the first value: the second keeps the floor, a quarter of
    # the uniform p = 1/2, so p = (5/8, 1/8) (the bound 3·p_0 + p_1 ≤ 2 holds with equality).
    mech = fine_grain(("x", "y"), gamma=3.0, weights=[1.0, 0.0])
    np.testing.assert_allclose(mech.retention, [13 / 16, 9 / 16], rtol=1e-9)
    assert mech.mode is RRMode.FINE_GRAIN
    assert mech.gamma <= 3.0 * (1 + GAMMA_SLACK)


def test_fine_grain_equal_weights_is_uniform() -> None:
    for m, gamma in ((2, 2.0), (4, 9.0), (10, 3.0), (30, 50.0)):
        fg = fine_grain(cats(m), gamma=gamma)
        np.testing.assert_allclose(fg.matrix, uniform(cats(m), gamma=gamma).matrix, atol=1e-8)


def test_fine_grain_skewed_weights_beat_uniform() -> None:
    f = np.array([0.9, 0.05, 0.03, 0.02])
    fg = fine_grain(CATS4, gamma=9.0, weights=f)
    un = uniform(CATS4, gamma=9.0)
    assert fg.expected_retention(f) > un.expected_retention(f) + 0.01
    assert fg.expected_retention(f) == pytest.approx(fine_grain_oracle(f, 9.0), abs=1e-8)


weights_strategy = st.integers(2, 25).flatmap(
    lambda m: st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 100.0)), min_size=m, max_size=m)
)


@settings(max_examples=100, deadline=None)
@given(w=weights_strategy, gamma=st.floats(1.0, 1000.0))
def test_fine_grain_properties(w: list[float], gamma: float) -> None:
    f = np.array(w)
    assume(f.sum() > 0)
    m = f.size
    mech = fine_grain(cats(m), gamma=gamma, weights=w)
    p = mech.matrix
    np.testing.assert_allclose(p.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    assert np.all(p >= 0)
    # amplification bound in every row, checked directly on the matrix
    assert row_amplification(p) <= gamma * (1 + GAMMA_SLACK)
    assert mech.gamma <= gamma * (1 + GAMMA_SLACK)
    # replacement rule: each column's off-diagonal entries are equal
    off = p + np.diag(np.full(m, np.nan))
    np.testing.assert_allclose(np.nanmax(off, axis=0), np.nanmin(off, axis=0), rtol=1e-12)
    # never below uniform at the same γ, and equal to the LP optimum
    got = mech.expected_retention(f)
    assert got >= uniform(cats(m), gamma=gamma).expected_retention(f) - 1e-9
    assert got == pytest.approx(fine_grain_oracle(f, gamma), abs=1e-7)


@settings(max_examples=30, deadline=None)
@given(
    w=st.integers(2, 9).flatmap(lambda m: st.lists(st.floats(0.0, 10.0), min_size=m, max_size=m)),
    gamma=st.floats(1.05, 200.0),
)
@example(w=[1.5, 1.75, 6.75, 1e-6, 1e-6], gamma=27.0)  # within the reference LP's old tolerance
def test_compact_lp_matches_naive_dense_lp(w: list[float], gamma: float) -> None:
    f = np.array(w)
    assume(f.sum() > 1e-3)
    mech = fine_grain(cats(f.size), gamma=gamma, weights=f)
    assert mech.expected_retention(f) == pytest.approx(dense_lp_optimum(f, gamma), abs=1e-7)


def test_fine_grain_large_domain() -> None:
    m = 1000
    rng = np.random.default_rng(7)
    f = rng.dirichlet(np.full(m, 0.3))
    mech = fine_grain(cats(m), gamma=20.0, weights=f)
    assert row_amplification(mech.matrix) <= 20.0 * (1 + GAMMA_SLACK)
    assert mech.expected_retention(f) == pytest.approx(fine_grain_oracle(f, 20.0), abs=1e-7)


def test_fine_grain_mapping_weights_omitted_values_get_zero() -> None:
    by_map = fine_grain(CATS4, gamma=5.0, weights={"b": 3.0, "c": 1.0})
    by_list = fine_grain(CATS4, gamma=5.0, weights=[0.0, 3.0, 1.0, 0.0])
    np.testing.assert_allclose(by_map.matrix, by_list.matrix)


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"retention": 1.0}, r"rr\.retention must be in \[1/m, 1\).*publishes the true value"),
        ({"retention": 0.1}, r"rr\.retention must be in \[1/m, 1\).*less often than chance"),
        ({"retention": math.nan}, r"rr\.retention"),
        ({}, "exactly one of retention, epsilon, gamma"),
        ({"retention": 0.5, "epsilon": 1.0}, "exactly one"),
        ({"epsilon": -1.0}, r"rr\.epsilon must be ≥ 0"),
        ({"epsilon": 1000.0}, r"rr\.epsilon must be ≤ 700"),
        ({"gamma": 0.5}, r"rr\.gamma must be ≥ 1"),
        ({"gamma": math.inf}, r"rr\.gamma must be ≥ 1 and finite"),
        ({"rho": (0.5, 0.2)}, "0 < rho1 < rho2 < 1"),
        ({"rho": (0.0, 0.2)}, "0 < rho1 < rho2 < 1"),
    ],
)
def test_uniform_rejects_bad_settings(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(MechanismError, match=match):
        uniform(CATS4, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("categories", "matrix", "match"),
    [
        (("x", "y"), [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], "must be square"),
        (("x", "y", "z"), [[0.5, 0.5], [0.5, 0.5]], "2×2 but there are 3 categories"),
        (("x", "y"), [[1.2, 0.5], [-0.2, 0.5]], "must be ≥ 0"),
        (("x", "y"), [[math.nan, 0.5], [0.5, 0.5]], "finite"),
        (("x", "y"), [[math.inf, 0.5], [0.5, 0.5]], "finite"),
        (("x", "y"), [[0.5, 0.5], [0.5, 0.4]], r"column 1 \(true value 'y'\) sums to 0\.9"),
        (("x", "y"), [[0.5, "a"], [0.5, 0.5]], "table of numbers"),
        (("x", "y"), [[0.5, 0.5], [0.5]], "table of numbers"),
        (("x",), [[1.0]], "at least 2 categories"),
        (("x", "x"), [[1.0, 0.0], [0.0, 1.0]], "lists a value twice"),
        ((1, 2), [[1.0, 0.0], [0.0, 1.0]], "must be strings"),
    ],
)
def test_from_matrix_rejects_invalid(
    categories: tuple[object, ...], matrix: object, match: str
) -> None:
    with pytest.raises(MechanismError, match=match):
        from_matrix(categories, matrix)  # type: ignore[arg-type]


def test_column_sum_tolerance() -> None:
    from_matrix(("x", "y"), [[0.5 + 5e-10, 0.5], [0.5, 0.5]])  # within 1e-9: accepted
    with pytest.raises(MechanismError, match="within 1e-09"):
        from_matrix(("x", "y"), [[0.5 + 5e-9, 0.5], [0.5, 0.5]])


def test_bad_mode_rejected() -> None:
    with pytest.raises(MechanismError, match="mode must be one of"):
        RRMechanism(categories=("x", "y"), matrix=np.eye(2), mode="bogus")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ([1.0, 2.0], "one weight per category"),
        ([1.0, -1.0, 1.0, 1.0], "≥ 0 and finite"),
        ([1.0, math.nan, 1.0, 1.0], "≥ 0 and finite"),
        ([0.0, 0.0, 0.0, 0.0], "positive sum"),
        ({"secret-value-42": 1.0}, "not categories"),
    ],
)
def test_fine_grain_rejects_bad_weights(weights: object, match: str) -> None:
    with pytest.raises(MechanismError, match=match) as info:
        fine_grain(CATS4, gamma=3.0, weights=weights)  # type: ignore[arg-type]
    assert "secret-value-42" not in str(info.value)  # never a data value


def test_matrix_is_read_only_and_copied() -> None:
    src = np.array([[0.7, 0.2], [0.3, 0.8]])
    mech = from_matrix(("x", "y"), src)
    src[0, 0] = 0.0
    assert mech.matrix[0, 0] == 0.7
    with pytest.raises(ValueError, match="read-only"):
        mech.matrix[0, 0] = 0.5
    with pytest.raises(ValueError, match="read-only"):
        mech.retention[0] = 0.5


def test_gamma_for() -> None:
    assert gamma_for(epsilon=math.log(4.0)) == pytest.approx(4.0)
    assert gamma_for(rho=(0.2, 0.5)) == pytest.approx(4.0)
    assert gamma_for(gamma=2.5) == 2.5
    with pytest.raises(MechanismError, match="exactly one"):
        gamma_for(gamma=2.0, epsilon=1.0)


# -- metadata round trip ------------------------------------------------------------------------


@st.composite
def mechanisms(draw: st.DrawFn) -> RRMechanism:
    kind = draw(st.sampled_from(["uniform", "fine_grain", "matrix"]))
    m = draw(st.integers(2, 12))
    if kind == "uniform":
        return uniform(cats(m), gamma=draw(st.floats(1.0, 1e3)))
    if kind == "fine_grain":
        w = draw(st.lists(st.floats(0.01, 10.0), min_size=m, max_size=m))
        return fine_grain(cats(m), gamma=draw(st.floats(1.0, 1e3)), weights=w)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(m, draw(st.floats(0.05, 5.0))), size=m).T
    p[p < 1e-3] = 0.0  # some structural zeros, hence γ = inf sometimes
    p /= p.sum(axis=0, keepdims=True)
    return from_matrix(cats(m), p)


@settings(max_examples=80, deadline=None)
@given(mech=mechanisms())
def test_round_trip_through_json(mech: RRMechanism) -> None:
    d = mech.to_dict()
    back = from_dict(json.loads(json.dumps(d, allow_nan=False)))
    assert back == mech
    assert hash(back) == hash(mech)
    assert RRMechanism.from_dict(d) == mech
    np.testing.assert_array_equal(back.matrix, mech.matrix)
    assert set(d) == {"categories", "mode", "matrix", "gamma", "epsilon", "retention"}
    # derived figures in the metadata are the mechanism's own
    assert back.gamma == mech.gamma
    np.testing.assert_allclose(mech.matrix.sum(axis=0), 1.0, atol=1e-9)
    assert mech.gamma == row_amplification(mech.matrix) or math.isclose(
        mech.gamma, row_amplification(mech.matrix), rel_tol=1e-12
    )


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"gamma": 5.0}, "'gamma' does not match"),
        ({"epsilon": 0.1}, "'epsilon' does not match"),
        ({"retention": [0.5, 0.5, 0.5, 0.5]}, "'retention' does not match"),
        ({"gamma": None}, "'gamma' is null"),
        ({"gamma": "9"}, "'gamma' must be a number or null"),
        ({"retention": ["x", "y"]}, "'retention' must be a list of numbers"),
        ({"mode": "bogus"}, "mode must be one of"),
        ({"categories": "abcd"}, "must be a list"),
    ],
)
def test_from_dict_rejects_inconsistent_metadata(patch: dict[str, object], match: str) -> None:
    d = uniform(CATS4, retention=0.75).to_dict() | patch
    with pytest.raises(MechanismError, match=match):
        from_dict(d)


def test_from_dict_ignores_extra_keys() -> None:
    mech = uniform(CATS4, retention=0.75)
    assert from_dict(mech.to_dict() | {"matrix_version": "abc123"}) == mech


def test_from_dict_requires_core_keys() -> None:
    with pytest.raises(MechanismError, match=r"lacks \['matrix'\]"):
        from_dict({"categories": ["x", "y"], "mode": "matrix"})
    with pytest.raises(MechanismError, match="must be a mapping"):
        from_dict([1, 2])  # type: ignore[arg-type]


# -- from_spec ----------------------------------------------------------------------------------


def attribute(
    rr: dict[str, object], categories: tuple[str, ...] = CATS4, **extra: object
) -> Attribute:
    return Attribute.model_validate(
        {
            "role": "sensitive",
            "type": "categorical",
            "method": "randomized_response",
            "categories": list(categories),
            "rr": rr,
            **extra,
        }
    )


def test_from_spec_uniform() -> None:
    mech = from_spec(attribute({"mode": "uniform", "retention": 0.75}))
    assert mech.categories == CATS4
    assert mech.epsilon == pytest.approx(math.log(9.0))
    mech = from_spec(attribute({"mode": "uniform", "rho1": 0.1, "rho2": 0.5}))
    assert mech.gamma == pytest.approx(9.0)
    mech = from_spec(attribute({"mode": "uniform", "epsilon": 1.0}))
    assert mech.epsilon == pytest.approx(1.0)


def test_from_spec_fine_grain_weight_sources() -> None:
    eps = math.log(6.0)
    spec_w = {"a": 5.0, "d": 1.0}
    freqs = {"a": 0.1, "b": 0.1, "c": 0.7, "d": 0.1}
    with_weights = from_spec(
        attribute({"mode": "fine_grain", "epsilon": eps, "weights": spec_w}), frequencies=freqs
    )
    assert with_weights == fine_grain(CATS4, gamma=math.exp(eps), weights=spec_w)
    with_freqs = from_spec(attribute({"mode": "fine_grain", "epsilon": eps}), frequencies=freqs)
    assert with_freqs == fine_grain(CATS4, gamma=math.exp(eps), weights=freqs)
    assert with_freqs != with_weights
    equal = from_spec(attribute({"mode": "fine_grain", "rho1": 0.2, "rho2": 0.6}))
    np.testing.assert_allclose(
        equal.matrix, uniform(CATS4, rho=(0.2, 0.6)).matrix, rtol=1e-8, atol=1e-10
    )
    assert equal.mode is RRMode.FINE_GRAIN


def test_from_spec_matrix_and_missing_category() -> None:
    rows = [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]]
    mech = from_spec(
        attribute({"mode": "matrix", "matrix": rows}, categories=("x", "y"), missing="category")
    )
    assert mech.categories == ("x", "y", MISSING_LABEL)
    assert mech.mode is RRMode.MATRIX
    assert mech.gamma == pytest.approx(8.0)


def test_from_spec_rejects_unknown_frequencies_without_naming_them() -> None:
    with pytest.raises(MechanismError, match="not categories") as info:
        from_spec(attribute({"mode": "fine_grain", "gamma": 3.0}), frequencies={"jane.doe": 1.0})
    assert "jane.doe" not in str(info.value)


def test_from_spec_needs_rr() -> None:
    attr = Attribute.model_validate(
        {"role": "sensitive", "type": "categorical", "method": "keep", "categories": ["x", "y"]}
    )
    with pytest.raises(MechanismError, match="no 'rr' settings"):
        from_spec(attr)


# -- apply --------------------------------------------------------------------------------------


def test_apply_inverse_cdf_boundaries() -> None:
    mech = from_matrix(("x", "y", "z"), [[0.5, 0.5, 0.0], [0.3, 0.0, 0.0], [0.2, 0.5, 1.0]])
    u = np.array([0.0, 0.4999, 0.5, 0.7999, 0.8, 0.9999999])
    np.testing.assert_array_equal(mech.apply(np.zeros(6, dtype=np.int64), u), [0, 0, 1, 1, 2, 2])
    # a zero-probability value is never published, even exactly at its cumulative boundary
    np.testing.assert_array_equal(mech.apply(np.ones(6, dtype=np.int64), u), [0, 0, 2, 2, 2, 2])
    np.testing.assert_array_equal(mech.apply(np.full(6, 2, dtype=np.int64), u), [2] * 6)


def test_apply_column_sum_rounding_never_picks_impossible_value() -> None:
    # column 0 sums to 1 - 5e-10 and its last entry is 0: u above the sum must stay on "y"
    mech = from_matrix(("x", "y", "z"), [[0.6, 0.2, 0.2], [0.4 - 5e-10, 0.6, 0.2], [0.0, 0.2, 0.6]])
    out = mech.apply(np.array([0, 0], dtype=np.int64), np.array([1 - 1e-10, 0.99999999999]))
    np.testing.assert_array_equal(out, [1, 1])


def test_apply_missing_pass_through_shape_and_determinism() -> None:
    mech = uniform(CATS4, retention=0.5)
    rng = np.random.default_rng(3)
    codes = rng.integers(-1, 4, size=(50, 7))
    u = rng.random(codes.shape)
    out = mech.apply(codes, u)
    assert out.shape == codes.shape and out.dtype == np.int64
    np.testing.assert_array_equal(out[codes < 0], codes[codes < 0])
    assert np.all((out[codes >= 0] >= 0) & (out[codes >= 0] < 4))
    np.testing.assert_array_equal(mech.apply(codes, u), out)
    assert codes.dtype == np.int64 and np.any(codes == -1)  # input untouched
    # uniforms of missing entries are ignored, even when out of range
    u2 = u.copy()
    u2[codes < 0] = 7.0
    np.testing.assert_array_equal(mech.apply(codes, u2), out)


def test_apply_empty_and_all_missing() -> None:
    mech = uniform(CATS4, retention=0.5)
    assert mech.apply(np.array([], dtype=np.int64), np.array([])).shape == (0,)
    np.testing.assert_array_equal(mech.apply(np.array([-1, -2]), np.array([0.1, 0.2])), [-1, -2])


@pytest.mark.parametrize(
    ("codes", "u", "match"),
    [
        ([0, 4], [0.1, 0.2], r"≥ the number of categories \(4\)"),
        ([0, 1], [0.1, 1.0], r"\[0, 1\)"),
        ([0, 1], [0.1, -0.1], r"\[0, 1\)"),
        ([0, 1], [0.1, math.nan], r"\[0, 1\)"),
        ([0, 1], [0.1], "one uniform per code"),
        ([0.0, 1.0], [0.1, 0.2], "integer category codes"),
    ],
)
def test_apply_rejects_bad_input(codes: list[float], u: list[float], match: str) -> None:
    with pytest.raises(MechanismError, match=match):
        uniform(CATS4, retention=0.5).apply(np.array(codes), np.array(u))


def _mechanisms_for_transition_test() -> list[RRMechanism]:
    skew = [0.85, 0.05, 0.04, 0.03, 0.03]
    return [
        uniform(CATS4, retention=0.75),
        uniform(cats(3), epsilon=1.0),
        fine_grain(cats(5), gamma=4.0, weights=skew),  # spike on the first value
        fine_grain(cats(5), gamma=4.0, weights=[1, 2, 3, 4, 5]),
        from_matrix(("x", "y", "z"), [[0.7, 0.1, 0.0], [0.2, 0.6, 0.3], [0.1, 0.3, 0.7]]),
        from_spec(
            attribute({"mode": "uniform", "gamma": 3.0}, categories=("x", "y"), missing="category")
        ),
    ]


def test_empirical_transitions_match_matrix() -> None:
    """For each true value i, the published frequencies follow column P[:, i].

    Each cell count is Binomial(n, P[j, i]); the acceptance region is the exact central
    binomial interval at level 1 - α/K, K = number of cells over all mechanisms, so the
    family-wise false-alarm probability is at most α = 1e-4 (Bonferroni). Cells with
    P = 0 must be empty.
    """
    mechs = _mechanisms_for_transition_test()
    n = 20_000
    alpha = 1e-4
    k_cells = sum(mech.m**2 for mech in mechs)
    rng = np.random.default_rng(20240611)
    for mech in mechs:
        m = mech.m
        codes = rng.permutation(np.repeat(np.arange(m, dtype=np.int64), n))
        out = mech.apply(codes, rng.random(codes.size))
        table = np.bincount(codes * m + out, minlength=m * m).reshape(m, m).T  # [j, i]
        lo, hi = stats.binom.interval(1 - alpha / k_cells, n, mech.matrix)
        inside = (table >= lo) & (table <= hi)
        assert inside.all(), (mech.mode, np.argwhere(~inside), table / n, mech.matrix)
        assert np.all(table[mech.matrix == 0.0] == 0)


def test_mechanisms_never_touch_the_global_numpy_rng() -> None:
    before = np.random.get_state(legacy=False)  # noqa: NPY002 - inspecting, not drawing
    mech = fine_grain(cats(6), gamma=3.0, weights=[1, 2, 3, 4, 5, 6])
    mech.apply(np.arange(6), np.linspace(0, 0.99, 6))
    est = reconstruct_for_rng_check(mech)
    assert est.em_converged
    uniform(CATS4, retention=0.6).apply(np.arange(4), np.full(4, 0.5))
    after = np.random.get_state(legacy=False)  # noqa: NPY002
    np.testing.assert_array_equal(before["state"]["key"], after["state"]["key"])
    assert before["state"]["pos"] == after["state"]["pos"]


def reconstruct_for_rng_check(mech: RRMechanism) -> DistributionEstimate:
    return reconstruct(mech, np.arange(mech.m))


@pytest.mark.parametrize("gamma", [1.5, 4.0, 20.0])
def test_fine_grain_stays_invertible_on_skewed_weights(gamma: float) -> None:
    """Without a floor the LP puts all retention on the heaviest value and leaves the others
    at 0: equal columns, P of rank 2, a reconstruction of nan/inf."""
    f = [0.9, 0.05, 0.02, 0.01, 0.01, 0.01]
    mech = fine_grain(cats(6), gamma=gamma, weights=f)
    assert np.linalg.matrix_rank(mech.matrix) == 6
    assert mech.is_invertible and mech.condition_number < 100
    assert mech.gamma <= gamma * (1 + GAMMA_SLACK)
    rng = np.random.default_rng(3)
    truth = rng.choice(6, size=20_000, p=f)
    published = mech.apply(truth, rng.random(truth.size))
    est = reconstruct(mech, published)
    assert np.all(np.isfinite(est.inversion)) and np.all(np.isfinite(est.em))


@settings(max_examples=25, deadline=None)
@given(
    w=st.integers(2, 25).flatmap(lambda m: st.lists(st.floats(0.01, 10.0), min_size=m, max_size=m)),
    epsilon=st.floats(6.0, math.log(FINE_GRAIN_MAX_GAMMA)),
)
@example(w=[1.0] * 8, epsilon=math.log(FINE_GRAIN_MAX_GAMMA))
def test_fine_grain_keeps_its_bound_up_to_the_largest_gamma_it_takes(
    w: list[float], epsilon: float
) -> None:
    """The off-diagonal entries (1 - p)/m near 1/γ lose relative precision as γ grows: up to
    the largest γ fine_grain takes, the matrix keeps the bound and beats uniform."""
    gamma = math.exp(epsilon)
    f = np.array(w)
    mech = fine_grain(cats(f.size), gamma=gamma, weights=f)
    p = mech.matrix
    np.testing.assert_allclose(p.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    assert np.all(p >= 0)
    assert row_amplification(p) <= gamma * (1 + GAMMA_SLACK)
    got = mech.expected_retention(f)
    assert got >= uniform(cats(f.size), gamma=gamma).expected_retention(f) - 1e-9


@pytest.mark.parametrize("epsilon", [17.0, 40.0, 700.0])
def test_fine_grain_beyond_its_largest_gamma_is_refused_naming_the_fix(epsilon: float) -> None:
    """ε ≤ 700 is a valid policy; fine_grain past γ = 1e7 would publish a matrix whose
    amplification exceeds γ (and HiGHS fails outright from ε ≈ 35)."""
    with pytest.raises(MechanismError, match=r"fine_grain takes γ up to 1e\+07 .*use mode uniform"):
        fine_grain(cats(8), gamma=math.exp(epsilon))
    assert uniform(cats(8), epsilon=epsilon).gamma <= math.exp(epsilon) * (1 + GAMMA_SLACK)
