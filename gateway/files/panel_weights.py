"""A panel release's analysis weights in the file workflow: the weight column a panel release
publishes (``republication.weight_field``), and the weighted shares of the published
categories against the original's (what the raking promises to keep)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from gateway.files.report_changes import text_column
from gateway.measures.frequency_risk import weights_of
from gateway.mechanisms import masking
from gateway.policy import MISSING_LABEL, AttrType, Method, Policy, RepublicationMode, Role


def published_weights(prot: pd.DataFrame, policy: Policy) -> NDArray[np.float64] | None:
    """The analysis weights of a panel release (None: not a panel policy, or a file without
    the weight column, e.g. one ``privgw protect`` wrote)."""
    rep = policy.republication
    if rep.mode is not RepublicationMode.PANEL or rep.weight_name not in prot.columns:
        return None
    return weights_of(prot, rep.weight_name)


def categorical_frames(
    policy: Policy, orig: pd.DataFrame, prot: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The published categorical attributes as text (None for missing), the original at the
    published level (generalized where the policy generalizes)."""
    tokens = set(policy.input.missing_tokens)
    categorical = [
        n
        for n, a in policy.attributes.items()
        if a.type is AttrType.CATEGORICAL
        and a.method is not Method.DROP
        and a.role in (Role.QUASI_IDENTIFIER, Role.SENSITIVE)
        and n in orig.columns
        and n in prot.columns
    ]
    raw_t = pd.DataFrame({n: text_column(orig[n], tokens) for n in categorical})
    for n in categorical:
        hierarchy = policy.attributes[n].hierarchy
        if policy.attributes[n].method is Method.GENERALIZE and hierarchy is not None:
            raw_t[n] = masking.generalize(raw_t[n].tolist(), hierarchy)
    pub_t = pd.DataFrame({n: text_column(prot[n], tokens) for n in categorical})
    return raw_t, pub_t


def share_gaps(
    raw_t: pd.DataFrame,
    pub_t: pd.DataFrame,
    original_weights: NDArray[np.float64] | None,
    published_weights: NDArray[np.float64],
) -> dict[str, dict[str, object]]:
    """Per categorical attribute, the largest gap, in percentage points, between a category's
    weighted share in the release and its share in the original (weighted by the sampling
    weights, if any), and which category it is. A missing value is a category of its own, as
    in the raking."""
    out: dict[str, dict[str, object]] = {}
    w_orig = np.ones(len(raw_t)) if original_weights is None else original_weights
    for name in raw_t.columns:
        raw, pub = (
            _weighted_shares(raw_t[name], w_orig),
            _weighted_shares(pub_t[name], published_weights),
        )
        cats = sorted(set(raw) | set(pub))
        if not cats:
            continue
        gaps = {c: 100.0 * abs(pub.get(c, 0.0) - raw.get(c, 0.0)) for c in cats}
        worst = max(cats, key=lambda c: (gaps[c], c))
        out[name] = {"largest_gap_points": gaps[worst], "category": worst}
    return out


def category_shares(
    values: pd.Series, weights: NDArray[np.float64] | None = None, *, missing: str | None = None
) -> pd.Series:
    """Each category's share of ``values``, weighted by ``weights`` if given; a missing value
    counts as the category ``missing``, or is left out (None). Empty when nothing counts."""
    if missing is not None:
        values = values.fillna(missing)
    present = values.notna().to_numpy()
    w = np.ones(len(values)) if weights is None else np.asarray(weights, dtype=np.float64)
    sums = pd.Series(w[present]).groupby(values[present].to_numpy()).sum()
    total = float(sums.sum())
    return sums / total if total else sums.iloc[:0]


def _weighted_shares(values: pd.Series, weights: NDArray[np.float64]) -> Mapping[str, float]:
    shares = category_shares(values, weights, missing=MISSING_LABEL)
    return {str(c): float(v) for c, v in shares.items()}
