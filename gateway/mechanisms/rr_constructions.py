"""The constructions of a randomized-response mechanism from a privacy strength (DESIGN.md
§4): :func:`uniform` (retain with probability p, else draw uniformly), :func:`fine_grain` (one
retention per value, chosen by a linear program under the amplification bound),
:func:`invariant` (the invariant PRAM of a base mechanism) and :func:`from_spec`, the mechanism
a policy attribute names. The mechanism itself and its cost are in
:mod:`gateway.mechanisms.randomized_response`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from gateway.errors import MechanismError
from gateway.mechanisms.randomized_response import (
    RRMechanism,
    check_rho_pair,
    from_matrix,
    gamma_from_rho,
    weight_vector,
)
from gateway.policy import Attribute, RRMode

__all__ = [
    "MIN_RETENTION_SHARE",
    "fine_grain",
    "from_spec",
    "gamma_for",
    "invariant",
    "uniform",
]

# The off-diagonal entries are (1 - p)/m ≈ 1/γ, with an absolute rounding error of about
# 1e-16: relative to 1/γ it grows with γ, and past 1e7 the matrix's amplification can exceed γ
# by more than 1e-9 of it (measured: 4e-10 at ε = 17, 1e-8 at ε = 20; HiGHS fails from ε ≈ 35)
FINE_GRAIN_MAX_GAMMA = 1e7
MIN_RETENTION_SHARE = 0.25
"""Fine-grain: each value's retention probability p_i is at least this share of the one a
uniform mechanism with the same γ gives, so that P stays invertible whatever the weights."""


def gamma_for(
    *,
    epsilon: float | None = None,
    gamma: float | None = None,
    rho: tuple[float, float] | None = None,
) -> float:
    """The amplification γ for exactly one of ε (γ = e^ε), γ, or (ρ1, ρ2)."""
    given = [n for n, v in (("epsilon", epsilon), ("gamma", gamma), ("rho", rho)) if v is not None]
    if len(given) != 1:
        raise MechanismError(
            f"give exactly one privacy strength of epsilon, gamma or rho=(rho1, rho2); "
            f"got {given or 'none'}"
        )
    if epsilon is not None:
        if not (math.isfinite(epsilon) and epsilon >= 0.0):
            raise MechanismError(f"rr.epsilon must be ≥ 0 and finite, got {epsilon}")
        if epsilon > 700.0:
            raise MechanismError(
                f"rr.epsilon must be ≤ 700 (e^ε overflows beyond), got {epsilon}; "
                "an ε that large gives no privacy"
            )
        return math.exp(epsilon)
    if gamma is not None:
        _check_gamma(gamma)
        return float(gamma)
    assert rho is not None
    if not (isinstance(rho, Sequence) and len(rho) == 2):
        raise MechanismError("rho must be a pair (rho1, rho2)")
    rho1, rho2 = float(rho[0]), float(rho[1])
    check_rho_pair(rho1, rho2)
    return gamma_from_rho(rho1, rho2)


def uniform(
    categories: Sequence[str],
    *,
    retention: float | None = None,
    epsilon: float | None = None,
    gamma: float | None = None,
    rho: tuple[float, float] | None = None,
) -> RRMechanism:
    """Uniform perturbation: retain with probability p, else draw uniformly from the domain.

    Give exactly one of ``retention`` (r = P[i, i], OpenDP's ``prob``; r in [1/m, 1)),
    ``epsilon``, ``gamma`` (γ = r(m-1)/(1-r) = 1 + m p/(1-p)) or ``rho=(rho1, rho2)``.
    Retention 1/m (γ = 1) publishes pure noise: P is singular.
    """
    cats = tuple(categories)
    m = len(cats)
    if m < 2:
        raise MechanismError(f"randomized response needs at least 2 categories, got {m}")
    strengths = [
        n
        for n, v in (("retention", retention), ("epsilon", epsilon), ("gamma", gamma), ("rho", rho))
        if v is not None
    ]
    if len(strengths) != 1:
        raise MechanismError(
            "uniform randomized response needs exactly one of retention, epsilon, gamma or "
            f"rho=(rho1, rho2); got {strengths or 'none'}"
        )
    if retention is not None:
        r = float(retention)
        lo = 1.0 / m
        if not (math.isfinite(r) and lo - 1e-15 <= r < 1.0):
            why = (
                "retention 1 publishes the true value"
                if r >= 1.0
                else f"below 1/m the true value is published less often than chance "
                f"(1/{m} = pure noise)"
            )
            raise MechanismError(
                f"rr.retention must be in [1/m, 1) = [{lo:.6g}, 1) for {m} categories, "
                f"got {retention}: {why}"
            )
        r = max(r, lo)
        diag, off = r, (1.0 - r) / (m - 1)
    else:
        g = gamma_for(epsilon=epsilon, gamma=gamma, rho=rho)
        # P[i, i] / P[j, i] = γ and P[i, i] + (m - 1) P[j, i] = 1.
        diag, off = g / (g + m - 1.0), 1.0 / (g + m - 1.0)
    matrix = np.full((m, m), off, dtype=np.float64)
    np.fill_diagonal(matrix, diag)
    return RRMechanism(categories=cats, matrix=matrix, mode=RRMode.UNIFORM)


def fine_grain(
    categories: Sequence[str],
    *,
    gamma: float,
    weights: Sequence[float] | NDArray[np.float64] | Mapping[str, float] | None = None,
) -> RRMechanism:
    """Fine-grain perturbation: per-value retention p_i chosen by a linear program.

    Column i retains with probability p_i, else draws uniformly from the domain:
    ``P[i, i] = p_i + (1 - p_i)/m``, ``P[j, i] = (1 - p_i)/m``. The p_i maximise
    Σ f_i P[i, i] (f = ``weights`` normalised; ``None`` = equal; a mapping may omit values,
    which get weight 0) subject to max ≤ γ·min in every row of P.

    LP (scaled by m; row j has diagonal 1 + (m-1)p_j ≥ 1 and off-diagonals 1 - p_i ≤ 1, so
    its max is the diagonal and its min is 1 - max_{i≠j} p_i). The m(m-1) row constraints
    (m-1)p_j + γ p_i ≤ γ - 1, i ≠ j, are together equivalent to
    A·top1(p) + B·top2(p) ≤ γ - 1 with A = max(m-1, γ), B = min(m-1, γ) (rearrangement:
    the larger coefficient goes with the larger p). With top1 ≤ a (a ≥ p_i) and the sum of
    the two largest ≤ 2t + Σ u_i (u_i ≥ p_i - t, u_i ≥ 0; Ogryczak–Tamir) this is
    (A-B)·a + B·(2t + Σ u_i) ≤ γ - 1: 2m + 2 variables and 2m + 1 sparse constraints.

    After the solve, p is scaled down (if at all, by ~1e-9) so the bound holds despite solver
    tolerance, and every value other than the top one is lifted to the second-largest p_i,
    which keeps the bound and never lowers any retention (zero-weight values are otherwise
    left at whatever vertex the solver picked).
    """
    cats = tuple(categories)
    m = len(cats)
    if m < 2:
        raise MechanismError(f"randomized response needs at least 2 categories, got {m}")
    g = gamma_for(gamma=gamma)
    if g > FINE_GRAIN_MAX_GAMMA * (1.0 + 1e-12):  # exp(log(1e7)) is a hair above
        raise MechanismError(
            f"rr mode fine_grain takes γ up to {FINE_GRAIN_MAX_GAMMA:g} (ε up to "
            f"{math.log(FINE_GRAIN_MAX_GAMMA):.2f}), got γ = {g:.4g} (ε = {math.log(g):.2f}): "
            "beyond it every retention is within 1e-6 of 1 and float64 cannot keep the bound; "
            "lower epsilon (or gamma), or use mode uniform"
        )
    f = np.full(m, 1.0 / m) if weights is None else weight_vector(weights, cats, "rr.weights")
    c = g - 1.0
    big, small = max(m - 1.0, g), min(m - 1.0, g)
    p = _solve_fine_grain_lp(f, big, small, c)
    p = _enforce_bound(p, big, small, c)
    off = (1.0 - p) / m
    matrix = np.broadcast_to(off, (m, m)).copy()
    np.fill_diagonal(matrix, p + off)
    return RRMechanism(categories=cats, matrix=matrix, mode=RRMode.FINE_GRAIN)


def invariant(base: RRMechanism, reference: Mapping[str, float] | None = None) -> RRMechanism:
    """Invariant PRAM (Kooiman, Willenborg & Gouweleeuw 1997; Gouweleeuw et al., "Post
    randomisation for statistical disclosure control", JOS 14(4), 1998; sdcMicro ``pram``).

    With π the reference distribution (``reference``: category weights, normalised; equal if
    None), λ = P·π the distribution P publishes and Q[i][l] = P[l][i]·π_i / λ_l the Bayes
    reverse (the probability of true i given published l), R = Q·P, i.e. R[i'][i] = Σ_l
    Q[i'][l]·P[l][i]. R is column-stochastic and R·π = Q·λ = π: the published marginal equals
    π in expectation, so an analyst reads marginals without inverting anything. R is P followed
    by a post-processing of P's output, so γ(R) ≤ γ(P): its γ and ε are reported like every
    matrix's, from R itself. Categories with π = 0 are published from the others only."""
    m = base.m
    pi = weight_vector(reference, base.categories, "reference") if reference else np.ones(m)
    pi = pi / pi.sum()
    p = base.matrix
    lam = p @ pi
    q = np.where(lam[None, :] > 0, p.T * pi[:, None] / np.where(lam > 0, lam, 1.0)[None, :], 0.0)
    r = q @ p
    r = r / r.sum(axis=0, keepdims=True)  # exact column sums despite rounding
    return RRMechanism(categories=base.categories, matrix=r, mode=RRMode.INVARIANT)


def from_spec(
    attr: Attribute, frequencies: Mapping[str, float] | None = None, *, name: str | None = None
) -> RRMechanism:
    """Build the mechanism an attribute's ``rr`` settings describe, over ``attr.domain``.

    For fine_grain the weights are ``rr.weights`` if given, else ``frequencies`` if given
    (values absent from either get weight 0), else equal weights. ``name``: the attribute's,
    which an error then names (a policy's several randomized attributes each have an ``rr``).
    """
    try:
        return _from_spec(attr, frequencies)
    except MechanismError as err:
        if name is None:
            raise
        text = str(err)
        where = f"attributes.{name}"
        raise MechanismError(
            f"{where}.{text}" if text.startswith("rr.") else f"{where}: {text}"
        ) from None


def _from_spec(attr: Attribute, frequencies: Mapping[str, float] | None) -> RRMechanism:
    rr = attr.rr
    if rr is None:
        raise MechanismError(
            "the attribute has no 'rr' settings; method randomized_response needs them"
        )
    domain = attr.domain
    rho = (rr.rho1, rr.rho2) if rr.rho1 is not None and rr.rho2 is not None else None
    if rr.mode is RRMode.MATRIX:
        if rr.matrix is None:
            raise MechanismError("rr.mode matrix needs rr.matrix (a list of rows P[j][i])")
        return from_matrix(domain, rr.matrix)
    if rr.mode is RRMode.UNIFORM:
        return uniform(domain, retention=rr.retention, epsilon=rr.epsilon, gamma=rr.gamma, rho=rho)
    if rr.mode is RRMode.INVARIANT:
        base = uniform(domain, retention=rr.retention, epsilon=rr.epsilon, gamma=rr.gamma, rho=rho)
        return invariant(base, rr.weights if rr.weights is not None else frequencies)
    if rr.retention is not None:
        raise MechanismError(
            "rr.mode fine_grain solves for per-value retention: give epsilon, gamma or "
            "rho1+rho2 instead of retention"
        )
    g = gamma_for(epsilon=rr.epsilon, gamma=rr.gamma, rho=rho)
    weights: Mapping[str, float] | None = rr.weights
    if weights is None and frequencies is not None:
        weights = frequencies
    return fine_grain(domain, gamma=g, weights=weights)


def _solve_fine_grain_lp(
    f: NDArray[np.float64], big: float, small: float, c: float
) -> NDArray[np.float64]:
    """max f·p s.t. big·top1(p) + small·top2(p) ≤ c, 0 ≤ p ≤ 1 (see :func:`fine_grain`)."""
    # imported here: scipy.optimize costs every command ~0.4 s at start, and only a policy
    # with fine-grain retention solves this program
    import scipy.sparse as sp  # noqa: PLC0415
    from scipy.optimize import linprog  # noqa: PLC0415

    m = f.size
    if c <= 0.0:
        return np.zeros(m)
    # x = [p (m), u (m), a, t]
    ia, it = 2 * m, 2 * m + 1
    rng_m = np.arange(m)
    rows = np.concatenate([rng_m, rng_m, m + rng_m, m + rng_m, m + rng_m])
    cols = np.concatenate([rng_m, np.full(m, ia), rng_m, m + rng_m, np.full(m, it)])
    vals = np.concatenate([np.ones(m), -np.ones(m), np.ones(m), -np.ones(m), -np.ones(m)])
    # coupling row: (big - small)·a + 2·small·t + small·Σu ≤ c
    last = 2 * m
    rows = np.concatenate([rows, np.full(m + 2, last)])
    cols = np.concatenate([cols, m + rng_m, [ia, it]])
    vals = np.concatenate([vals, np.full(m, small), [big - small, 2.0 * small]])
    a_ub = sp.csr_array((vals, (rows, cols)), shape=(2 * m + 1, 2 * m + 2))
    b_ub = np.zeros(2 * m + 1)
    b_ub[last] = c
    cost = np.zeros(2 * m + 2)
    cost[:m] = -f
    # Every p_i at least a share of the uniform solution's (big + small)·p = c: with two p_i at
    # 0 their columns are equal and P is singular (the true distribution is unidentifiable).
    floor = MIN_RETENTION_SHARE * c / (big + small)
    bounds = [(floor, 1.0)] * m + [(0.0, None)] * m + [(0.0, 1.0), (0.0, 1.0)]
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if res.status != 0 or res.x is None:
        raise MechanismError(
            f"the fine-grain linear program did not solve ({res.message}); try another gamma "
            "or mode uniform"
        )
    p: NDArray[np.float64] = np.clip(np.asarray(res.x[:m], dtype=np.float64), 0.0, 1.0) + 0.0
    return p


def _top_two(p: NDArray[np.float64]) -> tuple[int, float, float]:
    k = int(np.argmax(p))
    rest = np.delete(p, k)
    return k, float(p[k]), float(rest.max())


def _enforce_bound(
    p: NDArray[np.float64], big: float, small: float, c: float
) -> NDArray[np.float64]:
    """Scale p so big·top1 + small·top2 ≤ c exactly, then lift non-top values to top2."""
    k, top1, top2 = _top_two(p)
    lhs = big * top1 + small * top2
    if lhs > c:
        p = p * (c / lhs)
        k, top1, top2 = _top_two(p)
    lifted = np.maximum(p, top2)
    lifted[k] = top1
    return lifted


def _check_gamma(gamma: float) -> None:
    if not (math.isfinite(gamma) and gamma >= 1.0):
        raise MechanismError(
            f"rr.gamma must be ≥ 1 and finite, got {gamma}; γ = 1 publishes pure noise, "
            "larger γ retains more"
        )
