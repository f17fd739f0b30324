"""Frequency-based disclosure risk of a categorical key, as sdcMicro's ``measure_risk`` computes it.

The key is the cross-classification of the categorical quasi-identifiers (Hundepool et al.,
*Handbook on Statistical Disclosure Control*, §3.3.3). For each record:

* ``fk``, the sample frequency of its key: the records whose key **matches** it. A missing
  value matches every category (sdcMicro ``freqCalc``, ``alpha = 1``: "a missing value stands
  for any of the possible categories"), so two keys match when they are equal wherever both
  have a value. A record with only missing values matches all n records.
* ``Fk`` (``pop_fk`` in the code), the estimated population frequency: the sum of the
  sampling weights of the same records (Σ 1 = fk without weights).
* ``risk``, the individual risk of re-identification: the probability that a record is
  re-identified by an intruder who matches it on the key, under the negative-binomial
  super-population model of Benedetti & Franconi (1998), in the approximation of Franconi &
  Polettini (2004, "Individual risk estimation in μ-Argus: a review", PSD 2004, LNCS 3050,
  pp. 262-272) that sdcMicro's ``indivRisk(method = "approx")`` uses. With p = fk / Fk:

      fk = 1:  p/(1-p) · ln(1/p)
      fk = 2:  p/(1-p) - (p/(1-p))² · ln(1/p)
      fk ≥ 3:  p / (fk - (1 - p))
      fk = Fk: 1/fk              (the sample is the population: no uncertainty left)

  Without weights (a census, or no design information) the risk is 1/fk, as
  ``indivRisk(survey = FALSE)`` and ``measure_risk(w = NULL)`` do.

Global figures (``measure_risk``): the expected number of re-identifications is the sum of the
individual risks (Σ risk), the global risk its mean (Σ risk / n), in percent × 100; and the
records violating k-anonymity, those with fk < k (``print(sdcObj, "kAnon")`` for k = 2, 3 and
the object's k).

Sources read for the formulas (GPL-2 code, read, not copied): sdcMicro 5.8.1 ``R/freqCalc.r``,
``R/indivRisk.R``, ``R/measure_risk.R`` (GitHub sdcTools/sdcMicro); its tests
``tests/testthat/test_indivRisk.R`` publish individual risks for a weighted example with and
without missing values, which ``tests/gateway/test_frequency_risk.py`` reproduces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from gateway.errors import InputDataError

__all__ = [
    "FrequencyRisk",
    "dense_ids",
    "individual_risk",
    "key_codes",
    "measure_risk",
    "sample_frequencies",
]

Int = NDArray[np.int64]
Float = NDArray[np.float64]
MISSING = -1  # code of a missing key value


def key_codes(frame: pd.DataFrame, keys: Sequence[str]) -> Int:
    """Codes (n × p) of the key columns: 0.. per distinct value, ``MISSING`` for a missing one
    (None, NaN, an empty cell)."""
    cols = []
    for name in keys:
        if name not in frame.columns:
            raise InputDataError(f"--keys: no column {name!r} in the file; fix the name")
        column = frame[name]
        if column.dtype == object:
            nested = np.flatnonzero(column.map(type).isin((dict, list)).to_numpy())
            if nested.size:  # a JSON object or array: no category to count
                raise InputDataError(
                    f"--keys: column {name!r} holds a JSON object or array at data row "
                    f"{int(nested[0]) + 1}; a key's cells must be single values"
                )
            column = column.where(column.astype(str).str.strip() != "", None)
        codes, _ = pd.factorize(column, use_na_sentinel=True)
        cols.append(np.asarray(codes, dtype=np.int64))
    if not cols:
        raise InputDataError("--keys: no key given; name at least one categorical column")
    return np.stack(cols, axis=1)


def dense_ids(codes: Int, cols: Sequence[int]) -> Int:
    """Dense id of each row's tuple over ``cols`` (all rows; the caller masks missing ones)."""
    n = codes.shape[0]
    key = np.zeros(n, dtype=np.int64)
    for j in cols:
        c = codes[:, j] + 1  # MISSING -> 0
        _, key = np.unique(key * (int(c.max()) + 1) + c, return_inverse=True)
        key = key.reshape(-1).astype(np.int64)
    return key


def sample_frequencies(codes: Int, weights: Float | None = None) -> tuple[Float, Float]:
    """fk and Fk of each row of ``codes`` (n × p, ``MISSING`` = missing), missing values
    matching anything (see the module docstring).

    Rows are grouped by their pattern of present columns; a row of pattern P and a row of
    pattern Q match when they agree on P ∩ Q. So for each pair of patterns, the rows of Q are
    counted by their values on P ∩ Q and the count looked up for the rows of P: O(patterns² · n).
    """
    n, _ = codes.shape
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    present = codes != MISSING
    patterns, pattern_of = np.unique(present, axis=0, return_inverse=True)
    pattern_of = pattern_of.reshape(-1)
    fk = np.zeros(n)
    pop_fk = np.zeros(n)
    for a in range(len(patterns)):
        rows_a = np.flatnonzero(pattern_of == a)
        for b in range(len(patterns)):
            rows_b = np.flatnonzero(pattern_of == b)
            common = np.flatnonzero(patterns[a] & patterns[b]).tolist()
            if not common:  # nothing to compare: every row of b matches every row of a
                fk[rows_a] += rows_b.size
                pop_fk[rows_a] += w[rows_b].sum()
                continue
            both = np.concatenate([rows_a, rows_b])
            ids = dense_ids(codes[both], common)
            ids_a, ids_b = ids[: rows_a.size], ids[rows_a.size :]
            size = int(ids.max()) + 1
            fk[rows_a] += np.bincount(ids_b, minlength=size)[ids_a]
            pop_fk[rows_a] += np.bincount(ids_b, weights=w[rows_b], minlength=size)[ids_a]
    return fk, pop_fk


def individual_risk(fk: Float, pop_fk: Float, *, weighted: bool = True) -> Float:
    """Benedetti-Franconi individual risk, sdcMicro's approximation (module docstring)."""
    fk = np.asarray(fk, dtype=np.float64)
    pop_fk = np.asarray(pop_fk, dtype=np.float64)
    if not weighted:
        return 1.0 / fk
    risk = np.empty_like(fk)
    census = fk == pop_fk
    # 0.5 stands in where fk = Fk (p = 1 divides by zero); those risks are set below
    p = np.where(census, 0.5, fk / np.where(pop_fk == 0, 1.0, pop_fk))
    odds = p / (1.0 - p)
    log_inv = np.log(1.0 / p)
    one, two, more = fk == 1, fk == 2, fk > 2
    risk[one] = (odds * log_inv)[one]
    risk[two] = (odds - odds**2 * log_inv)[two]
    risk[more] = (p / (fk - (1.0 - p)))[more]
    risk[census] = 1.0 / fk[census]
    return risk


@dataclass(frozen=True)
class FrequencyRisk:
    """Per-record fk, Fk and individual risk of one key, and the global figures."""

    keys: tuple[str, ...]
    weight: str | None
    fk: Float
    pop_fk: Float
    risk: Float

    @property
    def records(self) -> int:
        return int(self.fk.size)

    @property
    def expected_reidentifications(self) -> float:
        """sdcMicro's ``risk$global$risk_ER``: the sum of the individual risks."""
        return float(self.risk.sum())

    @property
    def global_risk(self) -> float:
        """sdcMicro's ``risk$global$risk``: the mean individual risk."""
        return self.expected_reidentifications / self.records if self.records else 0.0

    def violations(self, k: int) -> int:
        """Records whose key has fewer than k matching records (fk < k)."""
        return int((self.fk < k).sum())

    def to_dict(self, k: int | None = None) -> dict[str, Any]:
        ks = sorted({2, 3} | ({k} if k is not None else set()))
        n = self.records
        return {
            "keys": list(self.keys),
            "weight": self.weight,
            "records": n,
            "expected_reidentifications": self.expected_reidentifications,
            "global_risk": self.global_risk,
            "global_risk_pct": 100.0 * self.global_risk,
            "max_individual_risk": float(self.risk.max()) if n else 0.0,
            "sample_uniques": int((self.fk == 1).sum()),
            "k_anonymity_violations": {str(kk): self.violations(kk) for kk in ks},
        }


def weights_of(frame: pd.DataFrame, weight: str | None) -> Float | None:
    """The sampling weights of ``frame[weight]``: numbers > 0, none missing."""
    if weight is None:
        return None
    if weight not in frame.columns:
        raise InputDataError(f"--weight: no column {weight!r} in the file; fix the name")
    w = pd.to_numeric(frame[weight], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(w) | (w <= 0)
    if bad.any():
        row = int(np.flatnonzero(bad)[0]) + 2  # header is line 1
        raise InputDataError(
            f"weight column {weight!r}: line {row} is not a number > 0; sampling weights "
            "must be positive numbers (fix or drop that row)"
        )
    return w


def measure_risk(
    frame: pd.DataFrame, keys: Sequence[str], weight: str | None = None
) -> FrequencyRisk:
    """fk, Fk and individual risk of ``frame`` on ``keys`` (``measure_risk(data, keyVars,
    w)``): weighted when ``weight`` names the sampling weight column."""
    if weight is not None and weight in keys:
        raise InputDataError(f"--weight {weight!r} is also a key; a weight is never a key")
    codes = key_codes(frame, keys)
    w = weights_of(frame, weight)
    fk, pop_fk = sample_frequencies(codes, w)
    return FrequencyRisk(
        keys=tuple(keys),
        weight=weight,
        fk=fk,
        pop_fk=pop_fk,
        risk=individual_risk(fk, pop_fk, weighted=w is not None),
    )
