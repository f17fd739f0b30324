"""Injectable sources of uniform randomness.

Mechanisms never draw randomness themselves: they take uniforms in [0, 1) from a source.
A seeded source serves tests and reproducible file runs; the keyed source (HMAC over the
respondent and value digests) serves republication, where the same input must give the same
draw after a restart, even without state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
from numpy.typing import NDArray


class UniformSource(Protocol):
    """Gives ``n`` uniforms in [0, 1) for a named purpose (domain separation).

    ``keys`` (one per draw) identify what a draw belongs to; keyed sources must use them,
    seeded sources may ignore them.
    """

    def uniform(
        self, purpose: str, n: int, keys: Sequence[bytes] | None = None
    ) -> NDArray[np.float64]: ...


class SeededSource:
    """Reproducible source for tests and ``--seed`` runs. Never the global numpy RNG."""

    def __init__(self, seed: int | np.random.Generator | None = None) -> None:
        self._rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    def uniform(
        self, purpose: str, n: int, keys: Sequence[bytes] | None = None
    ) -> NDArray[np.float64]:
        return self._rng.random(n)


def normals_from_uniforms(u1: NDArray[np.float64], u2: NDArray[np.float64]) -> NDArray[np.float64]:
    """Standard normals by Box–Muller; u1 is mapped into (0, 1] so the log is finite."""
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
