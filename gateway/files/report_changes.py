"""What protection did to each published attribute, counted on the two files: the utility
report's "what changed in the data" box (top/bottom coding, noise, rounding, generalization,
the categories microaggregation and randomized response changed)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gateway.mechanisms import masking
from gateway.policy import MISSING_LABEL, AttrType, Method, Policy
from gateway.policy.attribute import Attribute


@dataclass(frozen=True)
class Change:
    """One thing done to one attribute, and how many records it touched (of ``of``)."""

    attribute: str
    what: str
    records: int
    of: int

    @property
    def share(self) -> float:
        return self.records / self.of if self.of else math.nan


def text_column(values: pd.Series, tokens: set[str]) -> pd.Series:
    """A column as text, None for a missing value (empty, NaN or a missing token)."""
    s = values.astype(object).where(values.notna(), None)
    return s.map(lambda v: None if v is None or str(v) in tokens else str(v))


def data_changes(
    policy: Policy,
    orig: pd.DataFrame,
    prot: pd.DataFrame,
    raw_t: pd.DataFrame,
    pub_t: pd.DataFrame,
    *,
    weights: np.ndarray | None,
) -> list[Change]:
    """The changes, attribute by attribute in policy order. ``raw_t``/``pub_t`` hold the
    categorical columns as text (None for a missing value), the original generalized where
    the policy generalizes; ``weights`` (or None) weigh the top/bottom coding's effect."""
    tokens = set(policy.input.missing_tokens)
    out: list[Change] = []
    for name, attr in policy.attributes.items():
        if name not in orig.columns:
            continue
        if attr.method is Method.DROP:
            out.append(Change(name, "not published", len(orig), len(orig)))
        elif name not in prot.columns:
            continue
        elif attr.type is AttrType.NUMERIC:
            out.extend(_numeric(name, attr, orig[name], prot[name], weights))
        elif attr.type is AttrType.CATEGORICAL and name in raw_t.columns:
            texts = text_column(orig[name], tokens)
            out.extend(_categorical(name, attr, texts, raw_t[name], pub_t[name]))
    return out


def _numbers(s: pd.Series) -> np.ndarray:
    return pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64)


def _numeric(
    name: str, attr: Attribute, orig: pd.Series, prot: pd.Series, w: np.ndarray | None
) -> list[Change]:
    x, y = _numbers(orig), _numbers(prot)
    present = np.isfinite(x)
    n = int(present.sum())
    out: list[Change] = []
    coded = x.copy()
    if attr.coding is not None:
        for bound, side, sign in ((attr.coding.top, "top", 1), (attr.coding.bottom, "bottom", -1)):
            if bound is None:
                continue
            beyond = present & (sign * (x - bound) > 0)
            coded[beyond] = bound
            out.append(Change(name, f"{side}-coded at {bound:g}", int(beyond.sum()), n))
        if w is not None and n:
            ok = present & np.isfinite(w)
            before = float(np.average(x[ok], weights=w[ok]))
            after = float(np.average(coded[ok], weights=w[ok]))
            out.append(
                Change(
                    name,
                    f"weighted mean after the coding alone: {after:,.1f} (original {before:,.1f},"
                    f" {100 * (after - before) / before:+.1f} %)"
                    if before
                    else "weighted mean after the coding alone",
                    int((coded != x)[present].sum()),
                    n,
                )
            )
    both = present & np.isfinite(y)
    moved = int((both & (np.abs(y - x) > 1e-9 * np.maximum(1.0, np.abs(x)))).sum())
    if attr.method is Method.NOISE and attr.noise is not None:
        sd = attr.noise.sd or 0.0
        ratio = attr.noise.ratio or 0.0
        out.append(
            Change(
                name, f"Gaussian noise, sd = max({sd:g}, √{ratio:g}·S) (value changed)", moved, n
            )
        )
    elif attr.method is Method.MICROAGGREGATION:
        out.append(Change(name, "replaced by its group's mean (value changed)", moved, n))
    if attr.round_to is not None:
        out.append(Change(name, f"rounded to a multiple of {attr.round_to:g}", n, n))
    return out


def _categorical(
    name: str, attr: Attribute, orig: pd.Series, raw: pd.Series, pub: pd.Series
) -> list[Change]:
    """``raw`` is the original at the published level (generalized), ``orig`` as collected
    (text, None for a missing value)."""
    out: list[Change] = []
    if attr.missing_is_category:  # a change to or from the missing category is a change
        raw, pub = raw.fillna(MISSING_LABEL), pub.fillna(MISSING_LABEL)
    a, b = raw.to_numpy(dtype=object), pub.to_numpy(dtype=object)
    if attr.method is Method.GENERALIZE and attr.hierarchy is not None:
        texts: list[str | None] = [v if isinstance(v, str) else None for v in orig]
        level = masking.generalize(texts, attr.hierarchy)
        present = raw.notna().to_numpy()
        recoded = sum(1 for t, g in zip(texts, level, strict=True) if t is not None and t != g)
        cats = len({g for g in level if g is not None})
        out.append(
            Change(
                name,
                f"generalized {attr.hierarchy.level} level(s) up "
                f"({len(attr.categories or [])} → {cats} categories)",
                recoded,
                int(present.sum()),
            )
        )
    both = (raw.notna() & pub.notna()).to_numpy()  # text_column's None may read back as NaN
    changed = int((a[both] != b[both]).sum()) if both.any() else 0
    if attr.method is Method.RANDOMIZED_RESPONSE:
        what = "randomized response: published with another category"
    elif attr.method in (Method.MICROAGGREGATION, Method.GENERALIZE):
        what = "category changed by the microaggregation"
    else:
        return out
    out.append(Change(name, what, changed, int(both.sum())))
    return out
