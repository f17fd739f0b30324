"""Quality measures: hand-computed examples, brute-force cross-checks, properties, a published
figure, and the handling of bad or awkward input.

Expected values are computed here independently, with plain Python loops over the definitions
(never by calling the function under test a second time).
"""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.stats import rankdata

from gateway.errors import InputDataError
from gateway.measures import quality as q
from gateway.measures.disclosure_risk import _ranks
from gateway.measures.window_risk import window_measures

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

# ---------------------------------------------------------------------------------------------
# Plain-Python reference helpers (loops over the textbook definitions)
# ---------------------------------------------------------------------------------------------


def _col(rows: list[list[float]], j: int) -> list[float]:
    return [r[j] for r in rows]


def _mean(v: list[float]) -> float:
    return sum(v) / len(v)


def _var(v: list[float]) -> float:
    m = _mean(v)
    return sum((a - m) ** 2 for a in v) / (len(v) - 1)


def _cov(u: list[float], v: list[float]) -> float:
    mu, mv = _mean(u), _mean(v)
    return sum((a - mu) * (b - mv) for a, b in zip(u, v, strict=True)) / (len(u) - 1)


def _corr(u: list[float], v: list[float]) -> float:
    su, sv = math.sqrt(_var(u)), math.sqrt(_var(v))
    return 0.0 if su == 0 or sv == 0 else _cov(u, v) / (su * sv)


def _standardise(x: list[list[float]], xm: list[list[float]]) -> tuple[list, list]:
    p = len(x[0])
    means = [_mean(_col(x, j)) for j in range(p)]
    sds = [math.sqrt(_var(_col(x, j))) for j in range(p)]
    z = [[(r[j] - means[j]) / sds[j] for j in range(p)] for r in x]
    zm = [[(r[j] - means[j]) / sds[j] for j in range(p)] for r in xm]
    return z, zm


def _dld_loops(x: list[list[float]], xm: list[list[float]], w2: float) -> float:
    """Brute force: all distances, count strictly-closer and tied originals per record."""
    z, zm = _standardise(x, xm)
    n = len(x)
    total = 0.0
    for i in range(n):
        d = [math.dist(zm[i], z[k]) for k in range(n)]
        own = d[i]
        tol = 1e-9 * own + 1e-12
        closer = sum(1 for k in range(n) if d[k] < own - tol)
        tied = sum(1 for k in range(n) if abs(d[k] - own) <= tol)
        first = 1.0 if closer == 0 else 0.0
        second = 1.0 if (closer == 0 and tied >= 2) or closer == 1 else 0.0
        total += (first + w2 * second) / tied
    return total / n


def _id_loops(x: list[list[float]], xm: list[list[float]], p_pct: float) -> tuple[float, float]:
    """Rank windows by loops; returns (share of values, share of records fully inside)."""
    n, p = len(x), len(x[0])
    w = p_pct * n / 200.0
    inside = [[False] * p for _ in range(n)]
    for j in range(p):
        s = sorted(_col(xm, j))
        for i in range(n):
            v = xm[i][j]
            positions = [k for k in range(n) if s[k] == v]
            mid = (positions[0] + positions[-1]) / 2.0
            # ranks within p·n/200 of the mid-rank, and always the masked value itself
            ranks = [k for k in range(n) if abs(k - mid) <= w + 1e-9] + positions
            lo, hi = s[min(ranks)], s[max(ranks)]
            inside[i][j] = lo <= x[i][j] <= hi
    values = sum(sum(r) for r in inside) / (n * p)
    records = sum(1 for r in inside if all(r)) / n
    return values, records


def _quantile(v: list[float], a: float) -> float:
    """numpy's default (linear) quantile, by hand."""
    s = sorted(v)
    h = (len(s) - 1) * a
    lo = math.floor(h)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (h - lo) * (s[hi] - s[lo])


def _pil(diff: float, var: float) -> float:
    if var <= 0:
        return 0.0 if diff == 0 else 1.0
    return 2.0 * (0.5 * (1.0 + math.erf(abs(diff) / math.sqrt(var) / math.sqrt(2.0)))) - 1.0


def _il3_loops(x: list[list[float]], xm: list[list[float]]) -> dict[str, float]:
    n, p = len(x), len(x[0])
    cols = [_col(x, j) for j in range(p)]
    mcols = [_col(xm, j) for j in range(p)]
    means = [_mean(c) for c in cols]

    def m22(j: int, k: int) -> float:
        return (
            sum((cols[j][i] - means[j]) ** 2 * (cols[k][i] - means[k]) ** 2 for i in range(n)) / n
        )

    res: dict[str, list[float]] = {
        "quantiles": [],
        "means": [],
        "variances": [],
        "covariances": [],
        "correlations": [],
    }
    h = 0.5 * n ** (-0.2)
    for j in range(p):
        s2 = _var(cols[j])
        res["means"].append(_pil(_mean(mcols[j]) - means[j], s2 / n))
        v4 = (m22(j, j) - s2 * s2 * (n - 3) / (n - 1)) / n
        res["variances"].append(_pil(_var(mcols[j]) - s2, v4))
        for d in range(1, 10):
            a = d / 10
            lo, hi = max(a - h, 0.0), min(a + h, 1.0)
            slope = (_quantile(cols[j], hi) - _quantile(cols[j], lo)) / (hi - lo)
            res["quantiles"].append(
                _pil(_quantile(mcols[j], a) - _quantile(cols[j], a), a * (1 - a) / n * slope**2)
            )
        for k in range(j, p):
            c = _cov(cols[j], cols[k])
            vc = m22(j, k) - c * c * (n - 2) / (n - 1) + _var(cols[j]) * _var(cols[k]) / (n - 1)
            res["covariances"].append(_pil(_cov(mcols[j], mcols[k]) - c, vc / n))
            if k > j:
                r = _corr(cols[j], cols[k])
                res["correlations"].append(
                    _pil(_corr(mcols[j], mcols[k]) - r, (1 - r * r) ** 2 / n)
                )
    out = {key: _mean(v) if v else float("nan") for key, v in res.items()}
    parts = [v for v in out.values() if not math.isnan(v)]
    out["overall"] = _mean(parts)
    return out


def _rows(a: np.ndarray) -> list[list[float]]:
    return [[float(v) for v in r] for r in a]


# ---------------------------------------------------------------------------------------------
# Hand-computed tiny examples
# ---------------------------------------------------------------------------------------------


def test_il1s_hand_example() -> None:
    # col 1: sd 1, |diffs| 0,1,0 ; col 2: sd 10, |diffs| 2,0,3
    # IL1s = (1/√2 + 5/10/√2) / (3·2) = 0.25/√2
    x = [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]]
    xm = [[1.0, 12.0], [3.0, 20.0], [3.0, 27.0]]
    assert q.il1s(x, xm) == pytest.approx(0.25 / math.sqrt(2.0), rel=1e-12)


def test_sse_sst_hand_example_groups_and_masked_agree() -> None:
    x = [[1.0, 4.0], [2.0, 1.0], [4.0, 0.0], [5.0, 3.0], [9.0, 7.0]]
    groups = [0, 0, 1, 1, 1]
    # loops: standardise by the original, replace by group means, SSE/SST
    z, _ = _standardise(x, x)
    cent = {
        g: [_mean([z[i][j] for i in range(5) if groups[i] == g]) for j in range(2)] for g in (0, 1)
    }
    sse = sum((z[i][j] - cent[groups[i]][j]) ** 2 for i in range(5) for j in range(2))
    sst = sum((z[i][j] - _mean(_col(z, j))) ** 2 for i in range(5) for j in range(2))
    expected = 100.0 * sse / sst
    assert q.sse_sst_pct(x, np.array(groups)) == pytest.approx(expected, rel=1e-12)
    xm = np.array(x)
    for g in (0, 1):
        sel = np.array(groups) == g
        xm[sel] = xm[sel].mean(axis=0)
    assert q.sse_sst_pct(x, xm) == pytest.approx(expected, rel=1e-12)


def test_sse_sst_groups_negative_label_is_left_out() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(12, 2))
    labels = np.repeat(np.arange(4), 3)
    labels[[0, 7]] = -1
    keep = labels >= 0
    assert q.sse_sst_pct(x, labels) == pytest.approx(q.sse_sst_pct(x[keep], labels[keep]))


def test_dld_hand_example() -> None:
    # 1-D, so scaling does not matter. Masked 1.9: nearest 2, then 1, own (0) third → 0.
    # 0.6: nearest own (1) → 1.  2.9: nearest 3, own (2) second → weight.  3, 10: own → 1.
    x = [0.0, 1.0, 2.0, 3.0, 10.0]
    xm = [1.9, 0.6, 2.9, 3.0, 10.0]
    assert q.dld(x, xm) == pytest.approx(4 / 5)
    assert q.dld(x, xm, weight_second=0.0) == pytest.approx(3 / 5)
    assert q.dld(x, xm, weight_second=0.5) == pytest.approx(3.5 / 5)


def test_dld_ties_count_as_random_choice() -> None:
    # three identical originals: own is first with chance 1/3, second with chance 1/3
    x = [0.0, 0.0, 0.0, 5.0]
    assert q.dld(x, x) == pytest.approx((3 * 2 / 3 + 1) / 4)
    assert q.dld(x, x, weight_second=0.0) == pytest.approx((3 * 1 / 3 + 1) / 4)


@pytest.mark.parametrize("seed", range(6))
def test_dld_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 40
    x = rng.integers(0, 4, size=(n, 2)).astype(float)  # many duplicates and exact ties
    x[:, 1] *= 10.0
    if seed % 2:
        xm = x + rng.integers(-1, 2, size=x.shape).astype(float)  # ties at nonzero distance
    else:
        labels = np.arange(n) // 3
        xm = np.array([x[labels == g].mean(axis=0) for g in labels])
    for w in (0.0, 0.5, 1.0):
        assert q.dld(x, xm, weight_second=w) == pytest.approx(
            _dld_loops(_rows(x), _rows(xm), w), abs=1e-12
        )


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(2, 60),
    distinct=st.integers(1, 5),
    masking=st.sampled_from(["identity", "groups", "shift"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_dld_counts_every_copy_of_a_repeated_point(
    n: int, distinct: int, masking: str, seed: int
) -> None:
    """DLD asks its tree for each distinct point once, with its copies counted: the same as
    the loops over every record, down to one distinct original and one distinct masked point."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, distinct, size=(n, 2)).astype(float)
    x[:, 1] += rng.integers(0, 2, size=n)  # a second column, so few rows are constant
    if masking == "identity":
        xm = x.copy()
    elif masking == "groups":
        labels = np.arange(n) // 3
        xm = np.array([x[labels == g].mean(axis=0) for g in labels])
    else:
        xm = x + rng.integers(-1, 2, size=x.shape).astype(float)
    varying = np.ptp(x, axis=0) > 0  # the measure leaves constant columns out
    for w in (0.0, 1.0):
        got = q.dld(x, xm, weight_second=w)
        if not varying.any():
            assert math.isnan(got)
            continue
        want = _dld_loops(_rows(x[:, varying]), _rows(xm[:, varying]), w)
        assert got == pytest.approx(want, abs=1e-12)


def test_interval_disclosure_hand_example() -> None:
    # n=5, p=40% → window of ±1 rank. Masked sorted 10..50.
    # r0 [10,20]∋12 ✓; r1 [10,30]∌35; r2 [20,40]∋29 ✓; r3 [30,50]∋41 ✓; r4 [40,50]∌90
    x = [12.0, 35.0, 29.0, 41.0, 90.0]
    xm = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert q.interval_disclosure(x, xm, 40.0) == pytest.approx(3 / 5)


def test_interval_disclosure_tied_masked_values_use_mid_rank() -> None:
    # masked 1,1,1,4,5 (n=5), p=40% → ±1 rank. The tied block sits at positions 0..2, mid 1,
    # so its window is positions 0..2 = [1, 1]; value 4 (rank 3): [1, 5]; value 5: [4, 5].
    # originals 1 ✓, 0 ✗, 2 ✗ (tied block); 1 ✓ in [1, 5]; 3 ✗ not in [4, 5] → 2/5
    x = [1.0, 0.0, 2.0, 1.0, 3.0]
    xm = [1.0, 1.0, 1.0, 4.0, 5.0]
    assert q.interval_disclosure(x, xm, 40.0) == pytest.approx(2 / 5)
    # p = 1% of 5 is a window of ±0.025 ranks: each interval is just the masked value
    assert q.interval_disclosure(x, xm, 1.0) == pytest.approx(1 / 5)


@pytest.mark.parametrize("p_pct", [1.0, 7.5, 10.0, 33.0, 100.0])
def test_interval_disclosure_matches_loops(p_pct: float) -> None:
    rng = np.random.default_rng(int(p_pct * 10))
    x = rng.integers(0, 6, size=(30, 3)).astype(float)
    xm = x + rng.integers(-2, 3, size=x.shape).astype(float)
    values, records = _id_loops(_rows(x), _rows(xm), p_pct)
    assert q.interval_disclosure(x, xm, p_pct) == pytest.approx(values)
    assert q.interval_disclosure(x, xm, p_pct, per_record=True) == pytest.approx(records)


@settings(max_examples=200, deadline=None)
@given(
    xm=hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=40),
        elements=st.sampled_from([-2.0, -0.0, 0.0, 0.5, 1.0, 3.0, np.nan]),
    )
)
def test_mid_ranks_are_scipys_average_ranks(xm: np.ndarray) -> None:
    """The masked columns' mid-ranks (computed with numpy, from the one sort) are scipy's
    "average" ranks less one, ties and NaN (the whole column NaN) alike."""
    got = _ranks(xm)
    want = rankdata(xm, method="average", axis=0) - 1.0
    assert np.array_equal(got.mid, want, equal_nan=True)
    assert np.array_equal(got.sorted_m, np.sort(xm, axis=0), equal_nan=True)


def test_interval_disclosure_averaged_is_mean_over_p() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(50, 2))
    xm = x + rng.normal(scale=0.3, size=x.shape)
    expected = _mean([_id_loops(_rows(x), _rows(xm), float(p))[0] for p in range(1, 11)])
    assert q.interval_disclosure_averaged(x, xm) == pytest.approx(expected)


def test_il2_matches_loops() -> None:
    rng = np.random.default_rng(11)
    x = rng.normal(loc=[5.0, -3.0, 10.0], scale=[1.0, 2.0, 0.5], size=(25, 3))
    xm = x + rng.normal(scale=0.4, size=x.shape)
    rx, rm = _rows(x), _rows(xm)
    cols = [_col(rx, j) for j in range(3)]
    mcols = [_col(rm, j) for j in range(3)]
    means = _mean([abs(_mean(mcols[j]) - _mean(cols[j])) / abs(_mean(cols[j])) for j in range(3)])
    variances = _mean([abs(_var(mcols[j]) - _var(cols[j])) / _var(cols[j]) for j in range(3)])
    pairs_le = [(j, k) for j in range(3) for k in range(j, 3)]
    pairs_lt = [(j, k) for j, k in pairs_le if j < k]
    covs = _mean(
        [
            abs(_cov(mcols[j], mcols[k]) - _cov(cols[j], cols[k])) / abs(_cov(cols[j], cols[k]))
            for j, k in pairs_le
        ]
    )
    corrs = _mean(
        [
            abs(_corr(mcols[j], mcols[k]) - _corr(cols[j], cols[k])) / abs(_corr(cols[j], cols[k]))
            for j, k in pairs_lt
        ]
    )
    got = q.il2(x, xm)
    assert got == pytest.approx(
        {"means": means, "variances": variances, "covariances": covs, "correlations": corrs}
    )


def test_il3_matches_loops() -> None:
    rng = np.random.default_rng(12)
    x = rng.gamma(2.0, size=(40, 3)) * [1.0, 10.0, 100.0]
    x[:, 2] += 0.5 * x[:, 0] * 100
    xm = x + rng.normal(scale=0.2, size=x.shape) * x.std(axis=0)
    assert q.il3(x, xm) == pytest.approx(_il3_loops(_rows(x), _rows(xm)), rel=1e-9, abs=1e-12)


def test_il3_mean_shift_of_one_standard_error() -> None:
    # Shift every value by s/√n: the mean moves one standard error → PIL = 2Φ(1) − 1 ≈ 0.6827
    rng = np.random.default_rng(2)
    x = rng.normal(size=(400, 1))
    shift = float(x.std(ddof=1)) / math.sqrt(400)
    assert q.il3(x, x + shift)["means"] == pytest.approx(math.erf(1 / math.sqrt(2)), rel=1e-9)


def test_scores_and_weights() -> None:
    assert q.disclosure_risk(0.2, 0.6) == pytest.approx(0.4)
    assert q.disclosure_risk(0.2, 0.6, tau1=0.25, tau2=0.75) == pytest.approx(0.5)
    assert q.score(0.3, 0.5) == pytest.approx(0.4)
    assert q.score(0.3, 0.5, g1=1.0, g2=0.0) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="tau1"):
        q.disclosure_risk(0.1, 0.1, tau1=-1.0)
    with pytest.raises(ValueError, match="g2"):
        q.score(0.1, 0.1, g2=float("nan"))


def test_rr_retention() -> None:
    true = [0, 1, 2, -1, 2, 1, 0, 3]
    pub = [0, 2, 2, -1, 2, -1, 1, 3]
    # positions with both ≥ 0: 0,1,2,4,6,7 → equal at 0,2,4,7 → 4/6
    assert q.rr_retention(true, pub) == pytest.approx(4 / 6)
    assert math.isnan(q.rr_retention([-1, -1], [0, 1]))
    with pytest.raises(InputDataError, match="aligned"):
        q.rr_retention([0, 1], [0])


def test_reconstruction_error() -> None:
    assert q.reconstruction_error([0.5, 0.3, 0.2], [0.4, 0.4, 0.2]) == pytest.approx(0.1)
    assert q.reconstruction_error([50, 30, 20], [0.4, 0.4, 0.2]) == pytest.approx(0.1)  # counts
    assert q.reconstruction_error([1, 0], [0, 1]) == pytest.approx(1.0)
    with pytest.raises(InputDataError):
        q.reconstruction_error([0.5, 0.5], [1.0])
    with pytest.raises(InputDataError):
        q.reconstruction_error([-0.5, 1.5], [0.5, 0.5])


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------


def _gauss(n: int = 2000, p: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cov = np.array([[1.0, 0.6, 0.2], [0.6, 1.0, 0.3], [0.2, 0.3, 1.0]])[:p, :p]
    return rng.multivariate_normal(np.arange(1, p + 1) * 10.0, cov, size=n)


def test_identity_masking() -> None:
    x = _gauss()
    r = q.evaluate_numeric(x, x.copy())
    assert r.sse_sst_pct == 0.0
    assert r.il1s == 0.0
    assert r.dld == 1.0
    assert r.interval_disclosure == 1.0
    assert q.interval_disclosure(x, x, 1.0, per_record=True) == 1.0
    assert all(v == 0.0 for v in r.il2.values())
    assert all(v == 0.0 for v in r.il3.values())
    assert r.dr == 1.0
    assert r.score == pytest.approx(0.5)


def test_shuffled_masking_links_almost_nothing() -> None:
    x = _gauss()
    xm = x[np.random.default_rng(1).permutation(len(x))]
    assert q.dld(x, xm) < 0.01  # chance level is 2/n = 0.001
    assert q.interval_disclosure(x, xm, 10.0) < 0.2  # chance level ≈ p = 0.1
    assert q.il2(x, xm)["means"] == pytest.approx(0.0, abs=1e-12)  # same values, same means


def test_more_noise_more_loss_less_risk() -> None:
    x = _gauss()
    e = np.random.default_rng(2).normal(size=x.shape)
    reports = [q.evaluate_numeric(x, x + s * e) for s in (0.01, 0.1, 0.3, 1.0, 3.0)]
    for a, b in pairwise(reports):
        assert b.il1s > a.il1s
        assert b.sse_sst_pct > a.sse_sst_pct
        assert b.il3["overall"] > a.il3["overall"]
        assert b.dld <= a.dld
        assert b.interval_disclosure <= a.interval_disclosure
    assert reports[0].dld > 0.99
    assert reports[-1].dld < 0.1


def test_microaggregation_more_k_more_loss() -> None:
    x = _gauss(n=600)
    order = np.argsort(x[:, 0])
    last = None
    for k in (2, 5, 20):
        labels = np.empty(len(x), dtype=np.int64)
        labels[order] = np.arange(len(x)) // k
        loss = q.sse_sst_pct(x, labels)
        assert 0.0 < loss < 100.0
        if last is not None:
            assert loss > last
        last = loss


finite = st.floats(-1e6, 1e6, allow_nan=False, width=64)


@st.composite
def _pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(2, 30))
    p = draw(st.integers(1, 3))
    x = draw(hnp.arrays(np.float64, (n, p), elements=finite))
    noise = draw(hnp.arrays(np.float64, (n, p), elements=st.floats(-10, 10, width=64)))
    return x, x + noise


@settings(max_examples=60, deadline=None)
@given(_pairs())
def test_risk_measures_are_shares(pair: tuple[np.ndarray, np.ndarray]) -> None:
    x, xm = pair
    r = q.evaluate_numeric(x, xm)
    if r.n_attributes == 0:  # every column constant
        assert math.isnan(r.dld)
        return
    assert 0.0 <= r.dld <= 1.0
    assert 0.0 <= r.interval_disclosure <= 1.0
    assert q.interval_disclosure(x, xm, per_record=True) <= r.interval_disclosure + 1e-12
    assert all(0.0 <= v <= 1.0 for v in r.il3.values() if not math.isnan(v))
    assert r.il1s >= 0.0
    assert r.sse_sst_pct >= 0.0


@settings(max_examples=60, deadline=None)
@given(_pairs(), st.sampled_from([1.0, 10.0, 100.0]))
def test_a_windows_measures_are_what_each_measure_gives(
    pair: tuple[np.ndarray, np.ndarray], p_pct: float
) -> None:
    """window_measures standardises the rows once for its four figures: the same numbers."""
    x, xm = pair
    got = window_measures(x, xm, p_pct)
    want = {
        "sse_sst_pct": q.sse_sst_pct(x, xm),
        "il1s": q.il1s(x, xm),
        "dld": q.dld(x, xm),
        "interval_disclosure": q.interval_disclosure(x, xm, p_pct),
    }
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name] == value or (math.isnan(got[name]) and math.isnan(value)), name


moderate = st.integers(-(10**6), 10**6).map(lambda v: v / 100.0)


@st.composite
def _moderate_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    # Values a shift by ±1000 cannot absorb (no column turns constant by rounding).
    n = draw(st.integers(2, 30))
    p = draw(st.integers(1, 3))
    x = draw(hnp.arrays(np.float64, (n, p), elements=moderate))
    xm = draw(hnp.arrays(np.float64, (n, p), elements=moderate))
    return x, xm


@settings(max_examples=40, deadline=None)
@given(
    _moderate_pairs(),
    st.floats(0.01, 100.0),
    st.floats(-1000.0, 1000.0),
    st.booleans(),
)
def test_invariance_to_rescaling(
    pair: tuple[np.ndarray, np.ndarray], a: float, b: float, flip: bool
) -> None:
    # Standardised measures do not depend on the unit or origin of an attribute.
    x, xm = pair
    scale = -a if flip else a
    tx, txm = x * scale + b, xm * scale + b
    assert q.il1s(tx, txm) == pytest.approx(q.il1s(x, xm), rel=1e-6, abs=1e-9, nan_ok=True)
    assert q.sse_sst_pct(tx, txm) == pytest.approx(
        q.sse_sst_pct(x, xm), rel=1e-6, abs=1e-9, nan_ok=True
    )


@settings(max_examples=40, deadline=None)
@given(_pairs())
def test_interval_disclosure_only_sees_ranks(pair: tuple[np.ndarray, np.ndarray]) -> None:
    # The same strictly increasing map applied to both files keeps every rank window.
    x, xm = pair
    f = np.arcsinh  # strictly increasing, exact enough not to merge distinct floats here
    tx, txm = f(x), f(xm)
    if len(np.unique(np.concatenate([tx, txm]))) != len(np.unique(np.concatenate([x, xm]))):
        return  # rounding merged two distinct values; not this property's concern
    assert q.interval_disclosure(tx, txm) == pytest.approx(
        q.interval_disclosure(x, xm), nan_ok=True
    )


# ---------------------------------------------------------------------------------------------
# Published figure: 100·SSE/SST of MDAV (k = 3) on the CASC sets
# ---------------------------------------------------------------------------------------------


def _naive_mdav_labels(x: np.ndarray, k: int) -> np.ndarray:
    """MDAV as in DESIGN §4 (Domingo-Ferrer & Torra 2005), naive O(n²/k), for this test only."""
    z = (x - x.mean(axis=0)) / x.std(axis=0, ddof=1)
    labels = np.full(len(z), -1, dtype=np.int64)
    rest = np.arange(len(z))
    group = 0

    def farthest(points: np.ndarray, c: np.ndarray) -> int:
        return int(points[np.argmax(((z[points] - c) ** 2).sum(axis=1))])

    def take(center: int) -> None:
        nonlocal rest, group
        d = ((z[rest] - z[center]) ** 2).sum(axis=1)
        members = rest[np.argsort(d, kind="stable")[:k]]
        labels[members] = group
        group += 1
        rest = np.setdiff1d(rest, members)

    while len(rest) >= 3 * k:
        r = farthest(rest, z[rest].mean(axis=0))
        s = farthest(rest, z[r])
        take(r)
        take(s)
    if len(rest) >= 2 * k:
        take(farthest(rest, z[rest].mean(axis=0)))
    labels[rest] = group
    return labels


@pytest.mark.parametrize(
    ("name", "published"),
    [
        # MDAV, k = 3, 100·SSE/SST as reported by Domingo-Ferrer & Torra (2005), "Ordinal,
        # continuous and heterogeneous k-anonymity through microaggregation", DMKD 11(2),
        # and Domingo-Ferrer et al. (2006), "Efficient multivariate data-oriented
        # microaggregation", VLDB J. 15(4): Census 5.69, Tarragona 16.93.
        ("census", 5.69),
        ("tarragona", 16.93),
    ],
)
def test_reproduces_published_mdav_sse_sst(name: str, published: float) -> None:
    path = DATA / f"{name}.csv"
    if not path.exists():
        pytest.skip(f"reference data {path} not present")
    x = pd.read_csv(path).to_numpy(dtype=np.float64)
    assert round(q.sse_sst_pct(x, _naive_mdav_labels(x, 3)), 2) == published


# ---------------------------------------------------------------------------------------------
# Awkward and bad input
# ---------------------------------------------------------------------------------------------


def test_constant_columns_are_left_out() -> None:
    x = _gauss(n=300, p=2)
    xm = x + np.random.default_rng(4).normal(scale=0.3, size=x.shape)
    const = np.full((300, 1), 7.0)
    wide, widem = np.hstack([x, const]), np.hstack([xm, const + 1.0])
    a, b = q.evaluate_numeric(x, xm), q.evaluate_numeric(wide, widem)
    assert b.n_constant == 1
    assert b.n_attributes == 2
    for key in ("sse_sst_pct", "il1s", "dld", "interval_disclosure", "dr", "score"):
        assert getattr(b, key) == pytest.approx(getattr(a, key))
    assert dict(b.il2) == pytest.approx(dict(a.il2))
    assert dict(b.il3) == pytest.approx(dict(a.il3))


def test_all_constant_or_too_few_rows_is_nan() -> None:
    for x, xm in [
        (np.ones((5, 2)), np.ones((5, 2))),
        (np.array([[1.0, 2.0]]), np.array([[1.0, 2.0]])),
        (np.empty((0, 2)), np.empty((0, 2))),
    ]:
        r = q.evaluate_numeric(x, xm)
        flat = [r.sse_sst_pct, r.il1s, r.dld, r.interval_disclosure, r.dr, r.score]
        flat += list(r.il2.values()) + list(r.il3.values())
        assert all(math.isnan(v) for v in flat)
        assert math.isnan(q.dld(x, xm))
        assert math.isnan(q.sse_sst_pct(x, xm))


def test_masked_nan_rows_are_excluded_and_counted() -> None:
    x = _gauss(n=500)
    xm = x + np.random.default_rng(6).normal(scale=0.2, size=x.shape)
    holed = xm.copy()
    holed[[3, 50, 51, 400], :] = np.nan  # suppressed records
    holed[10, 1] = np.nan  # one missing value also drops its row
    keep = ~np.isnan(holed).any(axis=1)
    r = q.evaluate_numeric(x, holed)
    ref = q.evaluate_numeric(x[keep], xm[keep])
    assert r.n_excluded == 5
    assert r.n_records == 495
    assert ref.n_excluded == 0
    d, e = r.to_dict(), ref.to_dict()
    for key in ("n_excluded", "n_records"):
        d.pop(key)
        e.pop(key)
    for key in ("sse_sst_pct", "il1s", "dld", "interval_disclosure", "dr", "score"):
        assert d[key] == pytest.approx(e[key])
    assert d["il2"] == pytest.approx(e["il2"])
    assert d["il3"] == pytest.approx(e["il3"])


def test_report_to_dict_is_plain() -> None:
    x = _gauss(n=100)
    r = q.evaluate_numeric(x, x + 0.1, p_pct=5.0)
    d = r.to_dict()
    assert d["p_pct"] == 5.0
    assert isinstance(d["il2"], dict)
    assert isinstance(d["il3"], dict)
    assert set(d) >= {"sse_sst_pct", "il1s", "il2", "il3", "dld", "interval_disclosure", "dr"}
    with pytest.raises(AttributeError):
        r.dld = 0.0  # type: ignore[misc]


def test_one_dimensional_input() -> None:
    x = np.arange(10.0)
    assert q.il1s(x, x) == 0.0
    assert q.dld(x, x) == 1.0
    assert math.isnan(q.il2(x, x + 1)["correlations"])  # no pair of attributes


def test_shape_mismatch_message_has_no_data_values() -> None:
    x = np.full((4, 2), 123456.789)
    with pytest.raises(InputDataError) as err:
        q.il1s(x, x[:3])
    msg = str(err.value)
    assert "4×2" in msg
    assert "3×2" in msg
    assert "123456" not in msg
    with pytest.raises(InputDataError):
        q.evaluate_numeric(x, x[:, :1])
    with pytest.raises(InputDataError):
        q.sse_sst_pct(x, np.array([0, 1, 2]))  # labels, wrong length


def test_non_numeric_and_infinite_input_rejected_without_values() -> None:
    x = np.array([["alice-secret", "1"], ["bob", "2"]], dtype=object)
    with pytest.raises(InputDataError) as err:
        q.evaluate_numeric(x, x)
    assert "alice" not in str(err.value)
    assert err.value.__suppress_context__
    y = np.array([[1.0, np.inf], [2.0, 3.0]])
    with pytest.raises(InputDataError, match="inf"):
        q.dld(y, y)
    with pytest.raises(InputDataError, match="3-D"):
        q.il1s(np.zeros((2, 2, 2)), np.zeros((2, 2, 2)))


def test_bad_parameters() -> None:
    x = _gauss(n=20)
    for p in (0.0, -5.0, 100.5, float("nan")):
        with pytest.raises(ValueError, match="p_pct"):
            q.interval_disclosure(x, x, p)
    with pytest.raises(ValueError, match="p_pct"):
        q.evaluate_numeric(x, x, p_pct=0.0)
    with pytest.raises(ValueError, match="weight_second"):
        q.dld(x, x, weight_second=2.0)
    with pytest.raises(ValueError, match="p_pcts"):
        q.interval_disclosure_averaged(x, x, ())


def test_pandas_input_accepted() -> None:
    df = pd.DataFrame(_gauss(n=50), columns=["a", "b", "c"])
    assert q.il1s(df, df) == 0.0
