"""Information loss and disclosure risk of masked numeric microdata (and two RR figures).

Every numeric measure takes the original ``x`` and the masked ``xm`` as float arrays n×p whose
rows are aligned (row i of ``xm`` is the masked version of row i of ``x``); a 1-D array is one
column. Conventions shared by all of them:

* **Missing values.** A row with a NaN in ``x`` or ``xm`` (e.g. a suppressed record) is left
  out; every statistic, including the means and standard deviations used to standardise, is
  computed on the complete rows only. :func:`evaluate_numeric` reports how many rows were left
  out. ±inf and magnitudes beyond 1e100 are errors (:class:`~gateway.errors.InputDataError`).
* **Constant columns.** An attribute whose original values are all equal (S_j = 0) carries no
  information and identifies nobody; standardised measures are undefined for it. Such columns
  are dropped from every numeric measure (reported as ``n_constant`` by
  :func:`evaluate_numeric`); "p" below is the number of remaining attributes.
* **Too little data.** With fewer than 2 complete rows, or no non-constant column, every
  numeric measure is NaN (undefined), never an exception.
* **Standardisation.** z_ij = (x_ij − x̄_j)/S_j and z'_ij = (x'_ij − x̄_j)/S_j, both with the
  mean and the sample standard deviation (ddof=1) of the *original* column. A masked value
  more than 1e100 standard deviations away is capped there (so that squares and fourth
  powers stay finite; every measure is saturated long before).
* Error messages name shapes and settings only, never a data value.

Sources (definitions are restated in each function's docstring):

* [DMT01] Domingo-Ferrer, Mateo-Sanz & Torra (2001), "Comparing SDC methods for microdata on
  the basis of information loss and disclosure risk", ETK-NTTS 2001 — the table of
  mean-square / mean-absolute / mean-variation discrepancies between X, V, R, ... and their
  masked counterparts, reproduced as "Information loss measures for continuous microdata"
  in Hundepool et al., *Handbook on Statistical Disclosure Control*, §3.5 (GitHub
  sdcTools/HandbookSDC, chapters/03/_03-microdata-05-Information-loss-in-microdata-protection.qmd).
* [DT01] Domingo-Ferrer & Torra (2001), "A quantitative comparison of disclosure control
  methods for microdata", in Doyle, Lane, Theeuwes & Zayatz (eds.), *Confidentiality,
  Disclosure and Data Access*, North-Holland, pp. 111-134 — distance-based record linkage
  (DLD), rank-based interval disclosure (ID), DR and the score.
* [YWC02] Yancey, Winkler & Creecy (2002), "Disclosure risk assessment in perturbative
  microdata protection", LNCS 2316 — IL1s; implemented in sdcMicro ``dUtility(method="IL1")``
  (GitHub sdcTools/sdcMicro, R/dUtility.R).
* [MDS05] Mateo-Sanz, Domingo-Ferrer & Sebé (2005), "Probabilistic information loss measures
  in confidentiality protection of continuous microdata", *Data Mining and Knowledge
  Discovery* 11(2):181-193 — bounded (probabilistic) information loss PIL.
* [DM02] Domingo-Ferrer & Mateo-Sanz (2002), "Practical data-oriented microaggregation for
  statistical disclosure control", IEEE TKDE 14(1):189-201 — SSE/SST.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from gateway.errors import InputDataError
from gateway.measures.disclosure_risk import (
    check_p_pct,
    disclosure_risk,
    dld,
    dld_of,
    interval_disclosure,
    interval_disclosure_averaged,
    interval_share,
    score,
)
from gateway.measures.information_loss import (
    il1s,
    il1s_of,
    il2,
    il2_of,
    il3,
    il3_of,
    sse_sst_of,
    sse_sst_pct,
)
from gateway.measures.numeric_input import NAN, prepare

# the numeric measures live in gateway.measures.information_loss and .disclosure_risk; this
# module is where callers find them all, with the RR figures and the one-pass report
__all__ = [
    "QualityReport",
    "disclosure_risk",
    "dld",
    "evaluate_numeric",
    "il1s",
    "il2",
    "il3",
    "interval_disclosure",
    "interval_disclosure_averaged",
    "reconstruction_error",
    "rr_retention",
    "score",
    "sse_sst_pct",
]

# ---------------------------------------------------------------------------------------------
# Randomized response
# ---------------------------------------------------------------------------------------------


def rr_retention(true_codes: ArrayLike, published_codes: ArrayLike) -> float:
    """Observed retention of randomized response: the share of published codes equal to the
    true code, over the positions where both codes are ≥ 0 (a negative code marks a missing
    value, which RR passes through, or a suppressed one; neither says anything about the
    mechanism). NaN if no position qualifies."""
    t = np.asarray(true_codes).ravel()
    p = np.asarray(published_codes).ravel()
    if t.shape != p.shape:
        raise InputDataError(
            f"{t.shape[0]} true codes but {p.shape[0]} published codes; they must be aligned"
        )
    if not (np.issubdtype(t.dtype, np.number) and np.issubdtype(p.dtype, np.number)):
        raise InputDataError("codes must be integer category codes (negative = missing)")
    keep = (t >= 0) & (p >= 0)
    if not keep.any():
        return NAN
    return float(np.mean(t[keep] == p[keep]))


def reconstruction_error(true_distribution: ArrayLike, estimated: ArrayLike) -> float:
    """Total variation distance TV(π, π̂) = ½·Σ_i |π_i − π̂_i| between the true distribution
    of a categorical attribute and its reconstruction from randomized responses.

    Both vectors are divided by their sums first (so counts are accepted). TV is in [0, 1] for
    two probability vectors; an unprojected inversion estimate may hold negative entries, in
    which case the value can exceed 1. The true distribution must be non-negative; both
    must have a positive sum and the same length.
    """
    try:
        t = np.asarray(true_distribution, dtype=np.float64).ravel()
        e = np.asarray(estimated, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise InputDataError("distributions must be numeric vectors") from None
    if t.shape != e.shape or t.size == 0:
        raise InputDataError(
            f"true distribution has {t.size} categories and the estimate {e.size}; "
            "they must be equal and non-zero"
        )
    if not (np.isfinite(t).all() and np.isfinite(e).all()):
        raise InputDataError("distributions must be finite")
    if (t < 0).any():
        raise InputDataError("the true distribution has a negative entry")
    st, se = float(t.sum()), float(e.sum())
    if st <= 0 or se <= 0:
        raise InputDataError("each distribution must have a positive total")
    return 0.5 * float(np.abs(t / st - e / se).sum())


# ---------------------------------------------------------------------------------------------
# All at once
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QualityReport:
    """Every numeric measure of one masked window (see the module docstring for conventions).

    ``score`` combines the bounded ``il3["overall"]`` (PIL, 0..1) with ``dr`` (0..1).
    """

    n_records: int  # complete rows evaluated
    n_excluded: int  # rows left out because a value was NaN in the original or the masked file
    n_attributes: int  # attributes evaluated (non-constant)
    n_constant: int  # constant attributes left out
    p_pct: float
    sse_sst_pct: float
    il1s: float
    il2: Mapping[str, float]
    il3: Mapping[str, float]
    dld: float
    interval_disclosure: float
    dr: float
    score: float

    def to_dict(self) -> dict[str, Any]:
        """Plain (JSON-serialisable) dict; ``il2`` and ``il3`` as nested dicts."""
        return {
            "n_records": self.n_records,
            "n_excluded": self.n_excluded,
            "n_attributes": self.n_attributes,
            "n_constant": self.n_constant,
            "p_pct": self.p_pct,
            "sse_sst_pct": self.sse_sst_pct,
            "il1s": self.il1s,
            "il2": dict(self.il2),
            "il3": dict(self.il3),
            "dld": self.dld,
            "interval_disclosure": self.interval_disclosure,
            "dr": self.dr,
            "score": self.score,
        }


def evaluate_numeric(x: ArrayLike, xm: ArrayLike, *, p_pct: float = 10.0) -> QualityReport:
    """All numeric measures in one pass over the data (validation and standardisation once).

    DR = ½·DLD + ½·ID (both defaults) and score = ½·PIL + ½·DR, PIL = ``il3["overall"]``.
    """
    check_p_pct(p_pct)
    prep = prepare(x, xm)
    il3_ = il3_of(prep)
    if prep.ok:
        dld_ = dld_of(prep, 1.0)
        id_ = interval_share(prep, p_pct)
    else:
        dld_ = id_ = NAN
    dr = disclosure_risk(dld_, id_)
    return QualityReport(
        n_records=prep.n,
        n_excluded=prep.n_excluded,
        n_attributes=prep.p,
        n_constant=prep.n_constant,
        p_pct=float(p_pct),
        sse_sst_pct=sse_sst_of(prep),
        il1s=il1s_of(prep),
        il2=MappingProxyType(il2_of(prep)),
        il3=MappingProxyType(il3_),
        dld=dld_,
        interval_disclosure=id_,
        dr=dr,
        score=score(il3_["overall"], dr),
    )
