"""Raking (gateway/panel/weights.py): weights are functions of the class, bounded, and meet
feasible margins; Kish's design effect is >= 1 and 1 only for equal weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.panel.weights import RakingSpec, kish_deff, rake, rounded_targets, sampling_weights


@st.composite
def classes(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]:
    n = draw(st.integers(2, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    sizes = rng.integers(5, 10, n).astype(np.float64)
    base = rng.uniform(0.5, 2.0, n) if draw(st.booleans()) else np.ones(n)
    margins, targets = [], []
    for _ in range(draw(st.integers(1, 3))):
        m = int(draw(st.integers(2, 4)))
        codes = rng.integers(0, m, n)
        margins.append(codes)
        # targets near what the classes publish: the shares move a little, as a wave moves them
        have = np.bincount(codes, weights=sizes * base, minlength=m)
        targets.append(have * rng.uniform(0.8, 1.25, m))
    return sizes, base, margins, targets


@settings(max_examples=150, deadline=None)
@given(classes())
def test_weights_are_bounded_and_per_class(
    case: tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]],
) -> None:
    sizes, base, margins, targets = case
    spec = RakingSpec()
    raked = rake(sizes, base, margins, targets, spec)
    assert raked.weights.shape == sizes.shape  # one weight per class: shared by its records
    assert np.all(raked.factors >= spec.lower - 1e-12)
    assert np.all(raked.factors <= spec.upper + 1e-12)
    np.testing.assert_allclose(raked.weights, base * raked.factors)
    assert kish_deff(np.repeat(raked.weights, sizes.astype(int))) >= 1.0 - 1e-12


def test_feasible_margins_are_met() -> None:
    """Two margins that a set of weights can meet exactly (no rounding): raking meets both."""
    sizes = np.full(4, 10.0)
    base = np.ones(4)
    # classes: (a, x), (a, y), (b, x), (b, y)
    margins = [np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])]
    truth = np.array([[12.0, 8.0], [11.0, 9.0]])  # a joint table: its margins are consistent
    targets = [truth.sum(axis=1), truth.sum(axis=0)]
    raked = rake(sizes, base, margins, targets, RakingSpec(round_to=0))
    assert raked.converged
    mass = sizes * raked.weights
    for codes, target in zip(margins, targets, strict=True):
        have = np.bincount(codes, weights=mass)
        np.testing.assert_allclose(have / have.sum(), target / target.sum(), atol=1e-6)
    assert raked.max_gap < 1e-6


def test_a_category_no_class_publishes_leaves_the_total_and_the_other_shares() -> None:
    """The last margin's third category is published by no class: its share goes to the
    published ones in proportion. Before, its target was kept: the margins disagreed on the
    total, and the last one raked left the weights without the unmet category's mass."""
    sizes, base = np.full(4, 10.0), np.ones(4)
    margins = [np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1])]
    targets = [np.array([13.0, 11.0]), np.array([12.0, 8.0, 4.0])]
    raked = rake(sizes, base, margins, targets, RakingSpec(round_to=0))
    assert raked.converged
    mass = sizes * raked.weights
    assert mass.sum() == pytest.approx(40.0)  # the base total, kept
    np.testing.assert_allclose(np.bincount(margins[0], weights=mass) / 40.0, [13 / 24, 11 / 24])
    np.testing.assert_allclose(np.bincount(margins[1], weights=mass) / 40.0, [0.6, 0.4])
    assert raked.max_gap == pytest.approx(4 / 24)  # the gap to the truth, unmet share included


def test_targets_move_in_steps_of_round_to() -> None:
    counts = np.array([3.0, 7.0, 12.0, 978.0])
    rounded = rounded_targets(counts, 5.0)
    assert rounded.sum() == pytest.approx(counts.sum())
    steps = rounded / (counts.sum() / np.round(counts / 5.0 * 5.0).sum()) / 5.0
    np.testing.assert_allclose(steps, np.round(steps))


def test_kish() -> None:
    assert kish_deff(np.ones(10)) == pytest.approx(1.0)
    w = np.array([1.0, 3.0])
    assert kish_deff(w) == pytest.approx(2 * 10 / 16)


def test_bad_bounds_name_the_setting() -> None:
    with pytest.raises(ValueError, match="lower <= 1 <= upper"):
        RakingSpec(lower=1.5)


def test_weighted_reconstruction_counts_the_weights() -> None:
    """Equal weights give the unweighted estimate (with the same standard errors); unequal
    weights estimate the weighted shares, with the effective sample size's larger errors."""
    from gateway.measures.published import reconstruct_column  # noqa: PLC0415
    from gateway.mechanisms.rr_constructions import uniform  # noqa: PLC0415

    mech = uniform(["a", "b", "c"], retention=0.7)
    rng = np.random.default_rng(5)
    values = rng.choice(["a", "b", "c"], 3000, p=[0.5, 0.3, 0.2]).tolist()
    plain = reconstruct_column("x", values, mech)
    equal = reconstruct_column("x", values, mech, [2.0] * len(values))
    assert plain is not None and equal is not None
    np.testing.assert_allclose(equal.em, plain.em, atol=1e-9)
    np.testing.assert_allclose(equal.em_se, plain.em_se, rtol=1e-6)
    # weight the a's up: the weighted observed share of a rises, and so does its estimate
    weights = [3.0 if v == "a" else 1.0 for v in values]
    heavy = reconstruct_column("x", values, mech, weights)
    assert heavy is not None
    assert heavy.observed[0] > plain.observed[0]
    assert heavy.em[0] > plain.em[0]
    assert heavy.n < plain.n  # Kish's effective size


def test_the_topic_reader_weights_a_panel_release() -> None:
    """A panel release read from its topic (``privgw reconstruct --bootstrap``): the counts are
    weighted by the metadata's weight field, the unweighted release is not."""
    from gateway.measures.versioned_counts import VersionedCounts  # noqa: PLC0415
    from gateway.mechanisms.rr_constructions import uniform  # noqa: PLC0415

    mech = uniform(["a", "b"], retention=0.8)
    meta = {"randomized_response": {"x": mech.to_dict()}, "policy_version": "v1"}
    panel_meta = {**meta, "republication": {"weight_field": "weight"}}
    rows = [{"x": "a", "weight": 3.0}] * 50 + [{"x": "b", "weight": 1.0}] * 50
    plain, weighted = VersionedCounts({"v1": meta}), VersionedCounts({"v1": panel_meta})
    for row in rows:
        plain.add("v1", row)
        weighted.add("v1", row)
    p, w = plain.reconstruct()["x"], weighted.reconstruct()["x"]
    assert p["observed"][0] == pytest.approx(0.5)
    assert w["observed"][0] == pytest.approx(0.75)
    assert w["n"] == p["n"] == 100  # the rows read
    assert w["groups"][0]["n_effective"] < 100  # Kish's effective size, which the SEs use


_GIVEN_WEIGHT = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(st.floats()), st.lists(st.integers(-100, 100)), st.lists(_GIVEN_WEIGHT)))
def test_a_sampling_weight_is_the_positive_number_given_else_one(values: list[object]) -> None:
    """Whatever the column holds (numbers converted at once, or anything else value by value)."""
    want = [
        float(v) if isinstance(v, int | float) and v > 0 else 1.0  # type: ignore[operator]
        for v in values
    ]
    got = sampling_weights(values)
    assert got == want  # never NaN: NaN is not positive
    assert all(type(g) is float for g in got)
