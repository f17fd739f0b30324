"""Disclosure risk over the whole published quasi-identifier key.

Two measures of a published file, taken on every quasi-identifier together:

* **Frequency counts of the key** (Hundepool et al., *Handbook on Statistical Disclosure
  Control*, §3.3 "Risk assessment", GitHub sdcTools/HandbookSDC,
  chapters/03/_03-microdata-03-Risk-assessment.qmd: §3.3.3 "Concepts and notation" — the
  key is the cross-classification of the identifying variables, f_k the sample count of key
  cell k, Σ f_k = n, sample uniques f_k = 1; §3.3.4 the threshold rule: a key is unsafe when
  its count is below a threshold, here k). A record's class is the set of records that
  publish exactly its tuple of quasi-identifier values. A missing value (None, NaN, pd.NA)
  is the published value "suppressed", equal to every other missing value of its column and
  to nothing else: the invariant of issue 18 counts a suppressed value as a value of its
  own. (sdcMicro's ``freqCalc`` instead lets a missing value match any category, which
  raises the counts; the two agree on files without missing values.) The file is
  k-anonymous when the smallest class has k records or more.
* **Distinct l-diversity** of each sensitive attribute within the classes (Machanavajjhala,
  Kifer, Gehrke & Venkitasubramaniam, "l-Diversity: Privacy Beyond k-Anonymity", ACM TKDD
  1(1), 2007; ICDE 2006): l of a class is its number of distinct published values of the
  attribute (missing counts as one value), the paper's simplest instantiation, "distinct
  l-diversity". A class with l = 1 is homogeneous: k-anonymity alone then discloses the
  attribute of each of its members (the paper's homogeneity attack).

Distance-based record linkage over all quasi-identifiers: :mod:`gateway.measures.linkage`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from gateway.errors import InputDataError, MechanismError

__all__ = [
    "KeyRisk",
    "LDiversity",
    "class_sizes",
    "key_risk",
]

Int = NDArray[np.int64]


# ---------------------------------------------------------------------------------------------
# Validation and coding
# ---------------------------------------------------------------------------------------------


def check_frame(frame: object, what: str) -> pd.DataFrame:
    if not isinstance(frame, pd.DataFrame):
        raise InputDataError(f"{what}: expected a pandas DataFrame; pass the file as a DataFrame")
    if frame.columns.has_duplicates:
        raise InputDataError(f"{what}: a column name appears twice; give each column once")
    return frame


def check_names(names: Sequence[str], setting: str, *, allow_empty: bool) -> tuple[str, ...]:
    if isinstance(names, str):
        raise InputDataError(f"{setting}: expected a list of column names, not one string")
    out = tuple(names)
    if not out and not allow_empty:
        raise InputDataError(f"{setting}: no column given; name at least one column")
    seen: set[str] = set()
    for name in out:
        if name in seen:
            raise InputDataError(f"{setting}: column {name!r} is listed twice; list it once")
        seen.add(name)
    return out


def require_columns(frame: pd.DataFrame, names: Sequence[str], what: str) -> None:
    for name in names:
        if name not in frame.columns:
            raise InputDataError(f"{what}: column {name!r} is missing; add it or fix the name")


def check_positive_int(value: object, setting: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise MechanismError(f"{setting} must be an integer >= {minimum}")
    return int(value)


def value_codes(column: pd.Series[Any]) -> Int:
    """Dense codes of the published values; every missing value gets one code of its own."""
    codes, uniques = pd.factorize(column, use_na_sentinel=True)
    out = np.asarray(codes, dtype=np.int64)
    out[out < 0] = len(uniques)  # "suppressed": equal to other missing values, to nothing else
    return out


def combine_codes(code_columns: Sequence[Int], n: int) -> tuple[Int, int]:
    """Dense id (0..g-1) of each row's tuple of codes, and g."""
    key = np.zeros(n, dtype=np.int64)
    if not n:
        return key, 0
    bound = 1  # every key is below it
    for codes in code_columns:
        m = int(codes.max()) + 1
        if bound * m > _RADIX_LIMIT:  # re-densified first, so the mixed radix cannot overflow
            uniq, inverse = np.unique(key, return_inverse=True)
            key, bound = inverse.reshape(-1).astype(np.int64), uniq.size
        # mixed radix: the keys order as the tuples of codes do, as do the dense ids below
        key = key * m + codes
        bound *= m
    uniq, inverse = np.unique(key, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), int(uniq.size)


_RADIX_LIMIT = 1 << 62  # the mixed-radix keys stay below it (int64)


# ---------------------------------------------------------------------------------------------
# Frequency counts and l-diversity
# ---------------------------------------------------------------------------------------------


def _class_ids(published: pd.DataFrame, qi: Sequence[str]) -> tuple[Int, int]:
    n = len(published)
    return combine_codes([value_codes(published[name]) for name in qi], n)


def class_sizes(published: pd.DataFrame, qi: Sequence[str]) -> Int:
    """For each record, the number of records publishing the same tuple of ``qi`` values
    (missing values count as the value "suppressed")."""
    frame = check_frame(published, "published file")
    names = check_names(qi, "quasi-identifiers", allow_empty=False)
    require_columns(frame, names, "published file")
    ids, groups = _class_ids(frame, names)
    return np.bincount(ids, minlength=groups).astype(np.int64)[ids]


@dataclass(frozen=True)
class LDiversity:
    """Distinct l-diversity of one sensitive attribute over the key's classes."""

    min_l: int  # fewest distinct published values in a class (0 if no records)
    share_classes_below_2: float  # share of classes with l < 2 (homogeneous)
    records_in_homogeneous_classes: float  # share of records in classes with l = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "min_l": self.min_l,
            "share_classes_below_2": self.share_classes_below_2,
            "records_in_homogeneous_classes": self.records_in_homogeneous_classes,
        }


@dataclass(frozen=True)
class KeyRisk:
    """Frequency counts of the published quasi-identifier tuple and l-diversity within its
    classes (see the module docstring). Shares are 0.0 when there is no record."""

    records: int
    classes: int
    smallest_class: int  # 0 if no records
    share_below_k: float  # share of records in classes with fewer than k records
    records_below_k: int
    sample_uniques: int  # records alone in their class
    k: int
    l_diversity: Mapping[str, LDiversity]

    def to_dict(self) -> dict[str, Any]:
        """Plain (JSON-serialisable) dict, ``l_diversity`` as nested dicts."""
        return {
            "records": self.records,
            "classes": self.classes,
            "smallest_class": self.smallest_class,
            "share_below_k": self.share_below_k,
            "records_below_k": self.records_below_k,
            "sample_uniques": self.sample_uniques,
            "k": self.k,
            "l_diversity": {name: ld.to_dict() for name, ld in self.l_diversity.items()},
        }


_DENSE_PAIRS = 1 << 20  # (class, value) flags counted densely up to 8n + this many


def l_diversity(ids: Int, groups: int, sizes: Int, values: Int) -> LDiversity:
    """Distinct l-diversity of the coded ``values`` within the classes ``ids`` (0..groups-1,
    of ``sizes`` records each)."""
    n = ids.size
    if n == 0:
        return LDiversity(min_l=0, share_classes_below_2=0.0, records_in_homogeneous_classes=0.0)
    m = int(values.max()) + 1
    if groups * m <= 8 * n + _DENSE_PAIRS:  # a flag per (class, value): no sort
        met = np.zeros(groups * m, dtype=np.bool_)
        met[ids * m + values] = True
        ell = np.count_nonzero(met.reshape(groups, m), axis=1)
    else:
        pairs = np.unique(ids * m + values)  # distinct (class, value) pairs
        ell = np.bincount(pairs // m, minlength=groups)
    homogeneous = ell == 1
    return LDiversity(
        min_l=int(ell.min()),
        share_classes_below_2=float(np.mean(ell < 2)),
        records_in_homogeneous_classes=float(sizes[homogeneous].sum()) / n,
    )


def key_risk(
    published: pd.DataFrame, qi: Sequence[str], k: int, sensitive: Sequence[str] = ()
) -> KeyRisk:
    """Frequency counts of the published tuple of all ``qi`` columns against ``k``, and the
    distinct l-diversity of each ``sensitive`` column within its classes."""
    frame = check_frame(published, "published file")
    names = check_names(qi, "quasi-identifiers", allow_empty=False)
    sens = check_names(sensitive, "sensitive attributes", allow_empty=True)
    kk = check_positive_int(k, "k", 1)
    for name in sens:
        if name in names:
            raise InputDataError(
                f"sensitive attributes: column {name!r} is also a quasi-identifier; "
                "list it in one role only"
            )
    require_columns(frame, names, "published file")
    require_columns(frame, sens, "published file")

    n = len(frame)
    ids, groups = _class_ids(frame, names)
    sizes = np.bincount(ids, minlength=groups).astype(np.int64)
    below = sizes < kk
    records_below = int(sizes[below].sum())
    ldiv = {name: l_diversity(ids, groups, sizes, value_codes(frame[name])) for name in sens}
    return KeyRisk(
        records=n,
        classes=groups,
        smallest_class=int(sizes.min()) if n else 0,
        share_below_k=records_below / n if n else 0.0,
        records_below_k=records_below,
        sample_uniques=int((sizes == 1).sum()),
        k=kk,
        l_diversity=MappingProxyType(ldiv),
    )
