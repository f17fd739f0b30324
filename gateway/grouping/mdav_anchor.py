"""MDAV's first search of a step — the record farthest from the centroid — without a pass
over every remaining record.

The centroid moves little from one step to the next (a step removes 2k of m records). An
:class:`Anchor` keeps, from one full pass, the records farthest from the centroid of then
(``za``) with their z-distances, and an upper bound ``cut`` on every other record's. For the
centroid of now, ``zc`` at z-distance δ from ``za``, the triangle inequality bounds each
record's z-distance t to ``zc`` by d ± δ (d: its distance to ``za``, within ``slack`` of the
computed one). So:

* B = max over the kept records still alive of d - δ - slack is a lower bound on the farthest
  record's distance;
* a record that could be it, or that the exact search's own bounds could not rule out (their
  width is at most ``margin``), has t ≥ B - margin: among the kept records, those with
  d + δ + slack ≥ B - margin; and none of the others when cut + δ + slack < B - margin.

Then the search's candidate set, its maximum and its second value are those of the full pass,
evaluated on these few records only (:meth:`gateway.grouping.mdav_pruned.Pruned.step`), and
the labels are the same bit for bit. When the bound no longer separates (the centroid moved
far, or the kept records were grouped), the step makes a full pass and anchors anew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

#: records kept by their distance to the anchor's centroid
KEEP = 1024


@dataclass(slots=True)
class Anchor:
    """The records farthest from an earlier centroid, for bounding the farthest from the
    current one (module docstring)."""

    za: NDArray[np.float64]
    records: NDArray[np.intp]
    dist: NDArray[np.float64]
    cut: float
    slack: float

    @staticmethod
    def of(
        za: NDArray[np.float64],
        v: NDArray[np.float64],
        q2: float,
        ids: NDArray[np.intp],
        eps: float,
    ) -> Anchor:
        """From a full pass: v + q2 the squared z-distances to ``za`` of the records at
        positions 0..len(v)-1 (``ids``: position -> record), each within ``eps`` of the true
        value, so each distance within sqrt(eps)."""
        m = v.size
        d = v + q2
        np.maximum(d, 0.0, out=d)
        np.sqrt(d, out=d)
        slack = 2.0 * math.sqrt(eps) + 1e-300
        if m <= KEEP:
            return Anchor(za.copy(), ids[:m].copy(), d, 0.0, slack)
        part = np.argpartition(d, m - KEEP)
        top = part[m - KEEP :]
        cut = float(d[part[: m - KEEP]].max())
        return Anchor(za.copy(), ids[top], d[top], cut, slack)

    def candidates(
        self, zc: NDArray[np.float64], alive: NDArray[np.bool_], rel: float, extra: float
    ) -> NDArray[np.intp] | None:
        """The records any of which may be the farthest from ``zc`` or fall inside the exact
        search's bounds, whose width is at most ``rel`` (1 + B) + ``extra`` (B: the farthest
        distance's lower bound); None when the anchor cannot tell."""
        live = alive[self.records]
        if not live.all():
            self.records, self.dist = self.records[live], self.dist[live]
        if not self.records.size:
            return None
        diff = zc - self.za
        # δ with its rounding covered: a norm of a vector of float64 differences
        delta = math.sqrt(float(diff @ diff)) * (1.0 + 1e-9) + 1e-300
        reach = delta + self.slack
        best = float(self.dist.max()) - reach
        floor = best - rel * (1.0 + best) - extra - reach
        if floor <= 0.0 or self.cut >= floor:
            return None  # (floor <= 0: records all but as near as the farthest; full pass)
        out: NDArray[np.intp] = self.records[self.dist >= floor]
        return out


class Anchors:
    """The anchor in use, and when to build the next. An anchor that cannot tell at its first
    use (ties: many records as far as the farthest, as on a grid or a sphere) makes the next
    builds wait 1, 2, 4 ... up to 256 full passes, so such data pays a build now and then
    rather than at every step; one that served resets the wait."""

    __slots__ = ("anchor", "backoff", "used", "wait")

    def __init__(self) -> None:
        self.anchor: Anchor | None = None
        self.used = False
        self.wait = 0
        self.backoff = 0

    def candidates(
        self, zc: NDArray[np.float64], alive: NDArray[np.bool_], rel: float, extra: float
    ) -> NDArray[np.intp] | None:
        """:meth:`Anchor.candidates` of the anchor in use (None: none, or it cannot tell)."""
        if self.anchor is None:
            return None
        near = self.anchor.candidates(zc, alive, rel, extra)
        if near is not None:
            self.used = True
            return near
        self.backoff = 0 if self.used else min(max(1, 2 * self.backoff), 256)
        self.wait = self.backoff
        self.anchor = None
        return None

    def full_pass(
        self,
        za: NDArray[np.float64],
        v: NDArray[np.float64],
        q2: float,
        ids: NDArray[np.intp],
        eps: float,
    ) -> None:
        """After a full pass (``Anchor.of``'s arguments): a new anchor, unless it must wait."""
        if self.wait:
            self.wait -= 1
            return
        self.anchor = Anchor.of(za, v, q2, ids, eps)
        self.used = False
