"""Randomized response on a categorical attribute: validated mechanisms that carry their cost.

A mechanism is a perturbation matrix P over a public domain x_1..x_m with
``P[j, i] = Pr(publish x_j | true x_i)``; every column sums to 1. Its privacy cost is the
amplification γ = max over rows j of max_i P[j, i] / min_i P[j, i] (Evfimievski, Gehrke,
Srikant 2003): γ-amplification gives ε-local differential privacy with ε = ln γ and rules out
ρ1-to-ρ2 breaches whenever γ ≤ ρ2(1 - ρ1) / (ρ1(1 - ρ2)).

Three constructions (DESIGN.md §4; in :mod:`gateway.mechanisms.rr_constructions`):

- :func:`uniform`: retain with probability p, otherwise draw uniformly from the whole domain:
  ``P[i, i] = p + (1 - p)/m``, ``P[j, i] = (1 - p)/m``. Its *retention* ``P[i, i]`` is
  OpenDP's ``prob`` of k-ary randomized response: ε = ln(r(m - 1)/(1 - r)).
- :func:`fine_grain`: one p_i per value, same replacement rule, chosen by a linear program
  that maximises the expected retention Σ f_i P[i, i] under the amplification bound.
- :func:`from_matrix`: any column-stochastic matrix the publisher gives.

Mechanisms never draw randomness: :meth:`RRMechanism.apply` takes uniforms in [0, 1) from a
:class:`gateway.keyed.randomness.UniformSource`. Error messages name settings, never data values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

from gateway.errors import MechanismError
from gateway.policy import RRMode

__all__ = [
    "COLUMN_SUM_TOL",
    "RRMechanism",
    "check_rho_pair",
    "from_dict",
    "from_matrix",
    "gamma_from_rho",
    "weight_vector",
]

COLUMN_SUM_TOL = 1e-9
"""Columns of P must sum to 1 within this absolute tolerance."""

_GAMMA_RTOL = 1e-9
"""Relative slack when comparing γ with a bound (floating-point rounding of the matrix)."""

_SINGULAR_COND = 1e12
"""Above this 2-norm condition number P is treated as singular (inversion is meaningless)."""


@dataclass(frozen=True)
class RRMechanism:
    """A validated randomized-response mechanism with its privacy cost.

    ``matrix[j, i] = Pr(publish categories[j] | true categories[i])``. The matrix is copied
    and made read-only. P need not be invertible (e.g. uniform retention 1/m publishes pure
    noise); :attr:`is_invertible` says whether inversion-based reconstruction is possible.
    """

    categories: tuple[str, ...]
    matrix: NDArray[np.float64]
    mode: RRMode

    def __post_init__(self) -> None:
        cats = tuple(self.categories)
        if len(cats) < 2:
            raise MechanismError(
                f"randomized response needs at least 2 categories, got {len(cats)}; "
                "list the full public domain"
            )
        if not all(isinstance(c, str) for c in cats):
            raise MechanismError("categories must be strings (the public category labels)")
        if len(set(cats)) != len(cats):
            raise MechanismError("categories lists a value twice; list each value once")
        try:
            mode = RRMode(self.mode)
        except ValueError:
            raise MechanismError(
                f"mode must be one of {[m.value for m in RRMode]}, got {self.mode!r}"
            ) from None
        matrix = _validated_matrix(self.matrix, cats)
        object.__setattr__(self, "categories", cats)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "matrix", matrix)

    # Arrays do not compare with ``==`` as a bool, so equality and hashing are explicit.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RRMechanism):
            return NotImplemented
        return (
            self.categories == other.categories
            and self.mode == other.mode
            and bool(np.array_equal(self.matrix, other.matrix))
        )

    def __hash__(self) -> int:
        return hash((self.categories, self.mode, self.matrix.tobytes()))

    # -- privacy cost ---------------------------------------------------------------------------
    @property
    def m(self) -> int:
        """Number of categories."""
        return len(self.categories)

    @cached_property
    def gamma(self) -> float:
        """Amplification: max over rows j of max_i P[j, i] / min_i P[j, i].

        A row with a zero and a positive entry gives ``inf`` (publishing that value rules a
        true value out). A row of zeros is never published and carries no information, so it
        is skipped.
        """
        hi = self.matrix.max(axis=1)
        lo = self.matrix.min(axis=1)
        used = hi > 0.0
        if np.any(used & (lo <= 0.0)):
            return math.inf
        return max(1.0, float(np.max(hi[used] / lo[used])))

    @property
    def epsilon(self) -> float:
        """Local differential privacy ε = ln γ (``inf`` when γ is unbounded)."""
        return math.log(self.gamma)

    @property
    def retention(self) -> NDArray[np.float64]:
        """Per-value retention P[i, i] = Pr(publish the true value) (read-only)."""
        return np.diagonal(self.matrix)  # a read-only view

    def expected_retention(
        self, weights: Sequence[float] | NDArray[np.float64] | Mapping[str, float]
    ) -> float:
        """Σ f_i P[i, i] with f the weights normalised to sum 1 (a mapping may omit values: 0)."""
        f = weight_vector(weights, self.categories, "weights")
        return float(f @ self.retention)

    def rho2_for(self, rho1: float) -> float:
        """Largest posterior ρ2 this mechanism guarantees for prior ρ1: γρ1 / (γρ1 + 1 - ρ1)."""
        _check_open_unit("rho1", rho1)
        g = self.gamma
        if math.isinf(g):
            return 1.0
        return g * rho1 / (g * rho1 + 1.0 - rho1)

    def satisfies(self, rho1: float, rho2: float) -> bool:
        """Whether no ρ1-to-ρ2 breach is possible: γ ≤ ρ2(1 - ρ1) / (ρ1(1 - ρ2)).

        A relative slack of 1e-9 absorbs the rounding of a matrix built for exactly that bound.
        """
        check_rho_pair(rho1, rho2)
        return self.gamma <= gamma_from_rho(rho1, rho2) * (1.0 + _GAMMA_RTOL)

    # -- reconstruction helpers -----------------------------------------------------------------
    @cached_property
    def condition_number(self) -> float:
        """2-norm condition number of P (``inf`` when singular)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            cond = float(np.linalg.cond(self.matrix))
        return cond if math.isfinite(cond) else math.inf

    @property
    def is_invertible(self) -> bool:
        """Whether P is numerically invertible (condition number below 1e12)."""
        return self.condition_number < _SINGULAR_COND

    # -- perturbation ---------------------------------------------------------------------------
    @cached_property
    def _cumulative(self) -> NDArray[np.float64]:
        cum = np.cumsum(self.matrix, axis=0)
        cum.setflags(write=False)
        return cum

    @cached_property
    def _last_possible(self) -> NDArray[np.int64]:
        """Per true value i, the last j with P[j, i] > 0 (guards the column-sum rounding)."""
        m = self.m
        rev = np.argmax(self.matrix[::-1, :] > 0.0, axis=0)
        out: NDArray[np.int64] = (m - 1 - rev).astype(np.int64)
        out.setflags(write=False)
        return out

    def apply(self, codes: ArrayLike, u: ArrayLike) -> NDArray[np.int64]:
        """Perturb category codes by inverse CDF: publish the first j with cumsum(P[:, i])[j] > u.

        ``codes`` are indices into :attr:`categories`; negative codes (missing kept as missing)
        pass through unchanged and their uniforms are ignored. ``u`` has the same shape, with
        values in [0, 1). Returns a new int64 array of the same shape.
        """
        c = np.asarray(codes)
        uu = np.asarray(u, dtype=np.float64)
        if c.shape != uu.shape:
            raise MechanismError(
                f"apply needs one uniform per code: codes have shape {c.shape}, uniforms {uu.shape}"
            )
        if c.size and c.dtype.kind not in "iu":
            raise MechanismError(
                f"apply takes integer category codes (dtype int64), got dtype {c.dtype}; "
                "map labels to their index in categories first"
            )
        out = c.astype(np.int64, copy=True).reshape(-1)
        flat_u = uu.reshape(-1)
        present = np.flatnonzero(out >= 0)
        if present.size == 0:
            return out.reshape(c.shape)
        pc = out[present]
        pu = flat_u[present]
        if int(pc.max()) >= self.m:
            bad = int(np.count_nonzero(pc >= self.m))
            raise MechanismError(
                f"{bad} code(s) are ≥ the number of categories ({self.m}); codes must index "
                "categories (negative for missing)"
            )
        if not bool(np.all((pu >= 0.0) & (pu < 1.0))):
            raise MechanismError(
                "uniforms must lie in [0, 1) and be finite; take them from a UniformSource"
            )
        order = np.argsort(pc, kind="stable")
        sc = pc[order]
        su = pu[order]
        starts = np.searchsorted(sc, np.arange(self.m + 1))
        published = np.empty_like(sc)
        cum = self._cumulative
        for i in np.flatnonzero(np.diff(starts)):
            lo, hi = int(starts[i]), int(starts[i + 1])
            published[lo:hi] = np.searchsorted(cum[:, i], su[lo:hi], side="right")
        np.minimum(published, self._last_possible[sc], out=published)
        out[present[order]] = published
        return out.reshape(c.shape)

    # -- metadata -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        """JSON-able description for the metadata topic.

        ``gamma`` and ``epsilon`` are ``None`` (JSON null) when unbounded: strict JSON has no
        infinity.
        """
        return {
            "categories": list(self.categories),
            "mode": self.mode.value,
            "matrix": self.matrix.tolist(),
            "gamma": _finite_or_none(self.gamma),
            "epsilon": _finite_or_none(self.epsilon),
            "retention": self.retention.tolist(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Rebuild from :meth:`to_dict`; derived figures given must agree with the matrix.

        Keys other than those :meth:`to_dict` writes (e.g. a ``matrix_version`` the engine
        adds) are ignored.
        """
        if not isinstance(data, Mapping):
            raise MechanismError("mechanism metadata must be a mapping (see RRMechanism.to_dict)")
        missing = [k for k in ("categories", "mode", "matrix") if k not in data]
        if missing:
            raise MechanismError(f"mechanism metadata lacks {missing}; see RRMechanism.to_dict")
        cats = data["categories"]
        if not isinstance(cats, Sequence) or isinstance(cats, str):
            raise MechanismError("mechanism metadata 'categories' must be a list of labels")
        mech = cls(categories=tuple(cats), matrix=data["matrix"], mode=data["mode"])
        for key, derived in (("gamma", mech.gamma), ("epsilon", mech.epsilon)):
            given = data.get(key)
            if given is None:
                if key in data and math.isfinite(derived):
                    raise MechanismError(
                        f"mechanism metadata '{key}' is null but the matrix gives a finite "
                        "value; the metadata is inconsistent"
                    )
                continue
            if isinstance(given, bool) or not isinstance(given, int | float):
                raise MechanismError(f"mechanism metadata '{key}' must be a number or null")
            if not math.isclose(float(given), derived, rel_tol=1e-9, abs_tol=1e-12):
                raise MechanismError(
                    f"mechanism metadata '{key}' does not match its matrix; the metadata is "
                    "inconsistent or corrupted"
                )
        if data.get("retention") is not None:
            try:
                ret = np.asarray(data["retention"], dtype=np.float64)
            except (TypeError, ValueError):
                raise MechanismError(
                    "mechanism metadata 'retention' must be a list of numbers"
                ) from None
            if ret.shape != (mech.m,) or not np.allclose(ret, mech.retention, rtol=0, atol=1e-12):
                raise MechanismError(
                    "mechanism metadata 'retention' does not match the matrix diagonal"
                )
        return mech


def from_dict(data: Mapping[str, Any]) -> RRMechanism:
    """Module-level alias of :meth:`RRMechanism.from_dict`."""
    return RRMechanism.from_dict(data)


def from_matrix(categories: Sequence[str], matrix: ArrayLike) -> RRMechanism:
    """A publisher-given matrix P[j][i] = Pr(publish j | true i), validated, with its γ."""
    cats = tuple(categories)
    return RRMechanism(categories=cats, matrix=_validated_matrix(matrix, cats), mode=RRMode.MATRIX)


def _validated_matrix(matrix: object, cats: tuple[str, ...]) -> NDArray[np.float64]:
    m = len(cats)
    try:
        arr = np.array(matrix, dtype=np.float64, copy=True)
    except (TypeError, ValueError):
        raise MechanismError(
            f"rr.matrix must be an {m}×{m} table of numbers (rows P[j][i] = Pr(publish j | true i))"
        ) from None
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise MechanismError(
            f"rr.matrix must be square (one row and one column per category), got shape {arr.shape}"
        )
    if arr.shape[0] != m:
        raise MechanismError(
            f"rr.matrix is {arr.shape[0]}×{arr.shape[1]} but there are {m} categories; give "
            "one row and one column per category, in category order"
        )
    if not bool(np.all(np.isfinite(arr))):
        raise MechanismError("rr.matrix entries must be finite probabilities (no NaN or inf)")
    if bool(np.any(arr < 0.0)):
        raise MechanismError("rr.matrix entries must be ≥ 0: they are probabilities")
    sums = arr.sum(axis=0)
    bad = np.flatnonzero(np.abs(sums - 1.0) > COLUMN_SUM_TOL)
    if bad.size:
        i = int(bad[0])
        raise MechanismError(
            f"rr.matrix column {i} (true value {cats[i]!r}) sums to {sums[i]:.12g}, not 1; "
            f"each column P[:, i] is the distribution of what is published for true value i "
            f"and must sum to 1 within {COLUMN_SUM_TOL:g} ({bad.size} column(s) off)"
        )
    arr += 0.0  # turn any -0.0 into 0.0
    arr.setflags(write=False)
    return arr


def weight_vector(
    weights: Sequence[float] | NDArray[np.float64] | Mapping[str, float],
    cats: tuple[str, ...],
    name: str,
) -> NDArray[np.float64]:
    m = len(cats)
    if isinstance(weights, Mapping):
        unknown = [k for k in weights if k not in cats]
        if unknown:
            raise MechanismError(
                f"{name} names {len(unknown)} value(s) that are not categories; weights may "
                "only name categories"
            )
        w = np.array([float(weights.get(c, 0.0)) for c in cats], dtype=np.float64)
    else:
        try:
            w = np.array(weights, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise MechanismError(f"{name} must be numbers, one per category") from None
        if w.shape != (m,):
            raise MechanismError(f"{name} must give one weight per category ({m}), got {w.size}")
    if not bool(np.all(np.isfinite(w) & (w >= 0.0))):
        raise MechanismError(f"{name} must be ≥ 0 and finite")
    total = float(w.sum())
    if not total > 0.0:
        raise MechanismError(f"{name} must have a positive sum; give at least one weight > 0")
    return w / total


def gamma_from_rho(rho1: float, rho2: float) -> float:
    return rho2 * (1.0 - rho1) / (rho1 * (1.0 - rho2))


def _check_open_unit(name: str, value: float) -> None:
    if not (math.isfinite(value) and 0.0 < value < 1.0):
        raise MechanismError(f"{name} must be a probability strictly between 0 and 1, got {value}")


def check_rho_pair(rho1: float, rho2: float) -> None:
    if not (math.isfinite(rho1) and math.isfinite(rho2) and 0.0 < rho1 < rho2 < 1.0):
        raise MechanismError(
            f"rr needs 0 < rho1 < rho2 < 1, got rho1={rho1}, rho2={rho2}; rho1 is the prior "
            "bound, rho2 the larger posterior bound"
        )


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None
