"""Frequency risk and weighted estimates of a release, for ``evaluate``, ``protect``, the R-U
map and the utility report: the figures of :mod:`gateway.measures.frequency_risk` and
:mod:`gateway.measures.suda` over the published quasi-identifiers, before and after protection."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from gateway.measures.frequency_risk import key_codes, measure_risk, weights_of
from gateway.measures.suda import suda2
from gateway.policy import Method, Policy, Role

#: SUDA on a release searches MSUs up to this size (the cost grows with 2^keys; MSUs of more
#: than 5 variables weigh at most (ATT-5)! and disclosure reviews rarely look beyond)
RELEASE_MAX_MSU = 5


def published_keys(policy: Policy) -> list[str]:
    """The quasi-identifiers a release publishes: the intruder's key."""
    return [
        n
        for n, a in policy.attributes.items()
        if a.role is Role.QUASI_IDENTIFIER and a.method is not Method.DROP
    ]


def _keys_frame(df: pd.DataFrame, keys: Sequence[str], tokens: set[str]) -> pd.DataFrame:
    out = {}
    for name in keys:
        col = df[name]
        out[name] = col.where(~col.astype(str).isin(tokens), None)
    return pd.DataFrame(out, index=df.index)


def frequency_figures(
    df: pd.DataFrame,
    keys: Sequence[str],
    weights: np.ndarray | None,
    *,
    k: int,
    tokens: set[str],
    max_msu: int | None = RELEASE_MAX_MSU,
) -> dict[str, Any]:
    """Global frequency risk and SUDA figures of ``df`` on ``keys`` (missing matches any)."""
    frame = _keys_frame(df, keys, tokens)
    if weights is not None:
        frame = frame.assign(__weight__=weights)
    freq = measure_risk(frame, keys, "__weight__" if weights is not None else None)
    out = freq.to_dict(k)
    out["weight"] = "yes" if weights is not None else None
    m = min(len(keys), max_msu) if max_msu else None
    out["suda2"] = suda2(key_codes(frame, keys), max_msu=m).to_dict()
    return out


def release_risk(orig: pd.DataFrame, prot: pd.DataFrame, policy: Policy) -> dict[str, Any]:
    """Frequency risk of the original and of the published file on the published
    quasi-identifiers, weighted by the original's sampling weight when the policy names one."""
    keys = [n for n in published_keys(policy) if n in orig.columns and n in prot.columns]
    if not keys:
        return {}
    tokens = set(policy.input.missing_tokens)
    weight = policy.weight
    w = weights_of(orig, weight) if weight is not None and weight in orig.columns else None
    k = policy.microaggregation.k
    return {
        "keys": keys,
        "weight": weight if w is not None else None,
        "original": frequency_figures(orig, keys, w, k=k, tokens=tokens),
        "published": frequency_figures(prot, keys, w, k=k, tokens=tokens),
    }


def weighted_estimates(
    orig: pd.DataFrame,
    prot: pd.DataFrame,
    columns: Sequence[str],
    weights: np.ndarray,
    published_weights: np.ndarray | None = None,
) -> dict[str, dict[str, float]]:
    """Weighted mean and total (Horvitz-Thompson: Σ w·x) of each numeric column, original and
    published, over the records where both have a value. ``published_weights``: the
    release's own (a panel's analysis weights), else ``weights`` for both."""
    out: dict[str, dict[str, float]] = {}
    for name in columns:
        x = pd.to_numeric(orig[name], errors="coerce").to_numpy(dtype=np.float64)
        y = pd.to_numeric(prot[name], errors="coerce").to_numpy(dtype=np.float64)
        ok = np.isfinite(x) & np.isfinite(y)
        if not ok.any():
            continue
        w = weights[ok]
        wp = w if published_weights is None else published_weights[ok]
        tx, ty = math.fsum(w * x[ok]), math.fsum(wp * y[ok])
        tw, twp = math.fsum(w), math.fsum(wp)
        out[name] = {
            "total_original": tx,
            "total_published": ty,
            "mean_original": tx / tw,
            "mean_published": ty / twp,
            "relative_change_of_mean": (ty - tx) / abs(tx) if tx else float("nan"),
        }
    return out
