"""SUDA: special uniques (minimal sample uniques) and their scores, as sdcMicro's ``suda2``.

A **minimal sample unique** (MSU) of a record is a set S of key variables on which the
record's values are unique in the sample while no proper subset of S is (Elliot, Manning,
Mayes, Gurd & Bane, "SUDA: a program for detecting special uniques", Joint UNECE/Eurostat
work session on SDC, 2005; Elliot, Skinner & Dale 1998, "Special uniques, random uniques and
sticky populations", IJSDS). SUDA2 (Manning, Haglin & Keane 2008, "A recursive search
algorithm for statistical disclosure assessment", DMKD 16:165-196) finds them by recursion
over items; here they are found level by level over the subsets of the key (uniqueness is
monotone: a superset of a unique set is unique, so S is minimal when none of its subsets
one smaller is unique). A missing value is no value: a record has no MSU containing a
variable it lacks, and it counts for no pattern of that variable (SUDA2 drops missing items).

**SUDA score** of a record: the sum over its MSUs of a weight that decreases with the MSU's
size k. With ATT key variables and the largest MSU size searched m (``max_msu``, at most ATT),
an MSU of size k ≤ m weighs ∏_{i=k}^{min(m, ATT-1)} (ATT − i) (Elliot et al.; the SDC practice
guide of the World Bank/IHSN, "SUDA"). With m = ATT — sdcMicro's only setting — the weight is
(ATT − k)!, as sdcMicro ≥ 5.0.3 computes it by default (``original_scores = TRUE``;
``src/Suda2.h``, ``g_ab``). A record that shares its whole key with another record has no MSU
and scores 0.

**DIS score** (Skinner & Elliot 2002, "A measure of disclosure risk for microdata", JRSS B
64(4):855-867; Elliot et al. 2005): the probability that a sample unique is a population
unique, Dis = U·f / (U·f + P·(1 − f)), U the records unique on the whole key, P the records in
pairs (whole-key class of exactly 2), f the sampling fraction (``dis_fraction``, sdcMicro's
``DisFraction``, default 0.01). A record's DIS-SUDA score spreads Dis over the scored records
by their SUDA scores: 1 / (1 + (U/Dis − U) / (score^Q · Σ_r score_r^−Q)) with Q = 1 + (8 −
ATT)/20, the sum over records with a score > 0; 0 for a record without MSU.

Agreement with sdcMicro 5.8.1: the scores are the same numbers (sums of integers). sdcMicro
computes the DIS terms in single precision and counts U as the records that are alone in
their bucket of a 16-bit hash of the key values (``Suda2.h``: a unique that shares a bucket
with another record is not counted). U/Dis − U equals P(1 − f)/f whatever U is, so U matters
only through that rounding; ``dis_compat=True`` (the default) reproduces sdcMicro's single
precision and its U so the DIS scores agree to 1e-9, ``False`` computes P(1 − f)/f exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gateway.errors import InputDataError
from gateway.measures.frequency_risk import MISSING, dense_ids

__all__ = ["Suda", "msu_weight", "suda2"]

Int = NDArray[np.int64]
Float = NDArray[np.float64]
SDCMICRO_MISSING = -999  # suda2()'s missing code, seen by its hash


def msu_weight(size: int, attributes: int, max_msu: int) -> int:
    """Score of one MSU of ``size`` variables among ``attributes``, MSUs searched up to
    ``max_msu`` variables: ∏_{i=size}^{min(max_msu, attributes-1)} (attributes − i)."""
    return math.prod(attributes - i for i in range(size, min(max_msu, attributes - 1) + 1))


@dataclass(frozen=True)
class Suda:
    """Per-record SUDA and DIS-SUDA scores and MSU counts by size."""

    score: Float
    dis: Float
    msu_counts: Int  # n × max_msu: MSUs of size 1..max_msu per record
    max_msu: int
    dis_fraction: float
    file_dis: float  # Dis, the probability that a sample unique is a population unique

    def to_dict(self) -> dict[str, Any]:
        scored = self.score > 0
        return {
            "max_msu": self.max_msu,
            "dis_fraction": self.dis_fraction,
            "file_dis": self.file_dis,
            "records_with_msu": int(scored.sum()),
            "msus_by_size": {str(s + 1): int(c) for s, c in enumerate(self.msu_counts.sum(0))},
            "max_score": float(self.score.max()) if self.score.size else 0.0,
            "max_dis_score": float(self.dis.max()) if self.dis.size else 0.0,
            "records_dis_above_0.1": int((self.dis > 0.1).sum()),
        }


def _unique_on(codes: Int, cols: tuple[int, ...]) -> NDArray[np.bool_]:
    """Rows with a value on every column of ``cols`` whose tuple no other such row shares."""
    complete = (codes[:, list(cols)] != MISSING).all(axis=1)
    rows = np.flatnonzero(complete)
    out = np.zeros(codes.shape[0], dtype=bool)
    if rows.size == 0:
        return out
    ids = dense_ids(codes[rows], cols)
    out[rows] = np.bincount(ids)[ids] == 1
    return out


def _hash_buckets_alone(values: Int) -> int:
    """sdcMicro's U: records alone in their bucket of Suda2.h's 16-bit rotate-and-add hash."""
    h = np.zeros(values.shape[0], dtype=np.int64)
    for j in range(values.shape[1]):
        carry = (h & 0x8000) != 0
        h = ((h << 1) & 0xFFFF) + values[:, j]
        h = (h + carry) & 0xFFFF
    _, counts = np.unique(h, return_counts=True)
    return int((counts == 1).sum())


def _dis_term_compat(u_compat: int, pairs: int, f: float) -> float:
    """U/Dis − U in sdcMicro's single precision (Suda2.h: ``float Dis``, int/float)."""
    f32 = np.float32
    fr = f32(f)
    dis = (f32(u_compat) * fr) / (f32(u_compat) * fr + f32(pairs) * (f32(1.0) - fr))
    return float(f32(f32(u_compat) / dis) - f32(u_compat))


def suda2(
    codes: Int,
    *,
    max_msu: int | None = None,
    dis_fraction: float = 0.01,
    raw_values: Int | None = None,
    dis_compat: bool = True,
) -> Suda:
    """SUDA scores of the rows of ``codes`` (n × ATT, ``MISSING`` = missing).

    ``raw_values``: the values sdcMicro would see (numeric codes as they are, other values by
    their rank as R factors, missing as −999); only used for the DIS scores' agreement with
    sdcMicro (``dis_compat``). Without them the codes stand in, which changes nothing but the
    last bits of the DIS scores."""
    n, att = codes.shape
    m = att if max_msu is None else max_msu
    if not 1 <= m <= att:
        raise InputDataError(f"--max-msu must be between 1 and {att} (the number of keys), got {m}")
    if not 0.0 < dis_fraction < 1.0:
        raise InputDataError(f"--dis-fraction must be in (0, 1), e.g. 0.01; got {dis_fraction}")
    msu_counts = np.zeros((n, m), dtype=np.int64)
    previous: dict[tuple[int, ...], NDArray[np.bool_]] = {}
    for size in range(1, m + 1):
        current: dict[tuple[int, ...], NDArray[np.bool_]] = {}
        for cols in combinations(range(att), size):
            unique = _unique_on(codes, cols)
            current[cols] = unique
            minimal = unique.copy()
            if size > 1:
                for drop in range(size):
                    minimal &= ~previous[cols[:drop] + cols[drop + 1 :]]
            msu_counts[:, size - 1] += minimal
        previous = current
    weights = np.array([msu_weight(s, att, m) for s in range(1, m + 1)], dtype=np.float64)
    score = msu_counts @ weights

    # DIS: U and P on the whole key, a missing value equal to another missing value
    whole = dense_ids(codes, tuple(range(att)))  # MISSING is a code of its own here
    size_of = np.bincount(whole)[whole]
    u_true, pairs = int((size_of == 1).sum()), int((size_of == 2).sum())
    f = dis_fraction
    file_dis = u_true * f / (u_true * f + pairs * (1 - f)) if u_true + pairs else 0.0
    if dis_compat:
        values = codes + 1 if raw_values is None else raw_values
        values = np.where(codes == MISSING, SDCMICRO_MISSING, values)
        u_compat = _hash_buckets_alone(values)
        term = _dis_term_compat(u_compat, pairs, f) if u_compat > 0 else pairs * (1 - f) / f
        q = float(np.float32(1.0) + (np.float32(8.0) - np.float32(att)) / np.float32(20.0))
    else:
        term = pairs * (1 - f) / f
        q = 1.0 + (8.0 - att) / 20.0
    dis = np.zeros(n)
    scored = score > 0
    if scored.any():
        powered = score[scored] ** q
        adj = float(np.sum(1.0 / powered))
        dis[scored] = 1.0 / (1.0 + term / (powered * adj))
    return Suda(
        score=score,
        dis=dis,
        msu_counts=msu_counts,
        max_msu=m,
        dis_fraction=f,
        file_dis=file_dis,
    )
