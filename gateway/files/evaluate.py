"""Evaluating a protected file against its original: information loss and disclosure risk
of the numeric columns, retention of the randomized ones, risk over the whole key (the k
claim) and the frequency risk of the release. Each function returns data; the CLI formats it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gateway.errors import InputDataError
from gateway.files.fileio import (
    is_number_column,
    numbers_of,
    numeric_matrix,
    read_table,
)
from gateway.files.panel_align import align_panel_release, is_panel_release
from gateway.files.panel_weights import categorical_frames, published_weights, share_gaps
from gateway.grouping.mixed_microaggregation import (
    QIKind,
    claim_columns,
    claim_inputs,
)
from gateway.measures import key_risk, linkage, quality, release_risk
from gateway.measures.estimates import weighted_mean_se, weighted_total_se
from gateway.measures.frequency_risk import weights_of
from gateway.measures.published import (
    is_missing,
)
from gateway.policy import (
    MISSING_LABEL,
    AttrType,
    Method,
    MicroaggAlgorithm,
    Policy,
    Role,
)

RECODE = MicroaggAlgorithm.RECODE_SUPPRESS


def missing_to_none(values: Sequence[object], tokens: set[str]) -> list[object]:
    return [None if is_missing(v, tokens) else v for v in values]


def claim_frame(df: pd.DataFrame, policy: Policy, *, published: bool) -> pd.DataFrame:
    """The k claim's columns as the partition sees them: numbers as floats, categories as
    text (an original's generalized as the policy says; a published file's already are), a
    missing value as the missing category where it is one, else None."""
    tokens = set(policy.input.missing_tokens)
    out: dict[str, list[object]] = {}
    for name in policy.k_claim:
        attr = policy.attributes[name]
        values = missing_to_none(df[name].tolist(), tokens)
        if attr.type is AttrType.NUMERIC:
            out[name] = [None if v is None else float(str(v)) for v in values]
        elif published:
            label = MISSING_LABEL if attr.missing_is_category else None
            out[name] = [label if v is None else str(v) for v in values]
        else:
            out[name] = claim_inputs(attr, values)
    return pd.DataFrame(out, index=df.index)


def changed_categories(
    original: pd.DataFrame, published: pd.DataFrame, policy: Policy
) -> dict[str, float]:
    """Per categorical attribute of the k claim: the share of records published with another
    category than their own (the categorical information loss of the microaggregation)."""
    out: dict[str, float] = {}
    for c in claim_columns(policy):
        if c.kind is QIKind.NUMERIC:
            continue
        a, b = original[c.name].to_numpy(dtype=object), published[c.name].to_numpy(dtype=object)
        both = np.array([x is not None and y is not None for x, y in zip(a, b, strict=True)])
        out[c.name] = float(np.mean(a[both] != b[both])) if both.any() else float("nan")
    return out


def whole_key_evaluation(
    orig: pd.DataFrame,
    prot: pd.DataFrame,
    policy: Policy,
    original: str | Path,
    protected: str | Path,
) -> dict[str, Any]:
    """Risk over the whole quasi-identifier tuple (the k claim): frequency counts and
    l-diversity of the original and of the published file, record linkage with the mixed
    distance, and the categories the microaggregation changed."""
    claim = policy.k_claim
    if not claim:
        return {}
    for name in claim:
        for df, path in ((orig, original), (prot, protected)):
            if name not in df.columns:
                raise InputDataError(
                    f"{path}: no column '{name}', a quasi-identifier of the policy's k claim"
                )
    k = policy.microaggregation.k
    sensitive = [
        n
        for n, a in policy.attributes.items()
        if a.role is Role.SENSITIVE and n in orig.columns and n in prot.columns
    ]
    before, after = (
        claim_frame(orig, policy, published=False),
        claim_frame(prot, policy, published=True),
    )
    tokens = set(policy.input.missing_tokens)
    sens_o = pd.DataFrame({n: missing_to_none(orig[n].tolist(), tokens) for n in sensitive})
    sens_p = pd.DataFrame({n: missing_to_none(prot[n].tolist(), tokens) for n in sensitive})
    risk_before = key_risk.key_risk(pd.concat([before, sens_o], axis=1), claim, k, sensitive)
    risk_after = key_risk.key_risk(pd.concat([after, sens_p], axis=1), claim, k, sensitive)
    linked = linkage.mixed_linkage(before, after, claim_columns(policy))
    return {
        "k_claim": claim,
        "unprotected_quasi_identifiers": policy.unprotected_quasi_identifiers,
        "whole_key_original": risk_before.to_dict(),
        "whole_key": risk_after.to_dict(),
        "whole_key_linkage": linked.to_dict(),
        "changed_categories": changed_categories(before, after, policy),
    }


def _category_codes(
    values: Sequence[object], domain: Sequence[str], tokens: set[str]
) -> np.ndarray:
    """Codes in the policy's domain; missing → the missing category or -1; unknown → -2."""
    index = {c: i for i, c in enumerate(domain)}
    missing = index.get(MISSING_LABEL, -1)
    out = [missing if is_missing(v, tokens) else index.get(str(v), -2) for v in values]
    return np.array(out, dtype=np.int64)


def _numeric_columns_for(
    policy: Policy | None, orig: pd.DataFrame, prot: pd.DataFrame
) -> list[str]:
    if policy is not None:
        return [
            n
            for n, a in policy.attributes.items()
            if a.type is AttrType.NUMERIC
            and a.method in (Method.MICROAGGREGATION, Method.NOISE, Method.TOP_BOTTOM_CODE)
            and n in orig.columns
            and n in prot.columns
        ]
    # the original's numbers: a cell of text in the protected file is an error, not a reason
    # to leave the column out
    return [str(c) for c in orig.columns if c in prot.columns and is_number_column(orig[c])]


def evaluate_files(
    original: str | Path,
    protected: str | Path,
    policy: Policy | None = None,
    *,
    p_pct: float | None = None,
) -> dict[str, Any]:
    """Information loss and disclosure risk of PROTECTED against ORIGINAL (rows aligned)."""
    orig = read_table(original, policy=policy)
    prot = read_table(protected, policy=policy)
    if orig.empty:
        raise InputDataError(f"{original}: no data rows to evaluate")
    paired: dict[str, Any] = {}
    if is_panel_release(prot, policy):  # in record-id order, the absent members imputed
        assert policy is not None
        orig, prot, paired = align_panel_release(orig, prot, policy, (original, protected))
    if len(orig) != len(prot):
        raise InputDataError(
            f"the files have {len(orig)} and {len(prot)} rows; evaluation needs the rows of "
            "both files in the same order"
        )
    published = prot  # before the stand-ins: which cells it left empty
    if policy is not None and policy.microaggregation.algorithm is RECODE:
        prot = recoded_standins(orig, prot, policy, original)  # intervals: their means
    cols = _numeric_columns_for(policy, orig, prot)
    if not cols and not (
        policy is not None
        and any(n in orig.columns and n in prot.columns for n in policy.randomized)
    ):
        raise InputDataError(
            f"{original} and {protected} have no numeric column in common to evaluate; check "
            "that both files have the same header (or give the --policy that protected them)"
        )
    # a column with no value in either file leaves every row incomplete: named, left out
    empty = [c for c in cols if orig[c].isna().all() or prot[c].isna().all()]
    cols = [c for c in cols if c not in empty]
    pct = p_pct if p_pct is not None else (policy.risk.interval_pct if policy else 10.0)
    result: dict[str, Any] = {"records": len(orig), "columns": cols, **paired}
    if empty:
        result["columns_without_values"] = empty
    if cols:
        tokens = set(policy.input.missing_tokens) if policy is not None else set()
        suppressed = suppressed_cells(orig, published, cols, tokens)
        rep = _numeric_quality(orig, prot, cols, (original, protected), pct)
        # the same count as the report's n_excluded: rows without a value in the original
        result["excluded_incomplete_rows"] = rep.n_excluded
        if suppressed:
            result["suppressed_cells"] = suppressed
        result.update(rep.to_dict())
    if policy is not None and policy.numeric_claim:
        # what `protect` and the stream's metrics report under "numeric quasi-identifiers"
        qi = [n for n in policy.numeric_claim if n in orig.columns and n in prot.columns]
        if qi:
            rep = _numeric_quality(orig, prot, qi, (original, protected), pct)
            full = rep.to_dict()
            result["numeric_quasi_identifiers"] = {
                "columns": qi,
                **{m: full[m] for m in ("sse_sst_pct", "il1s", "dld", "interval_disclosure")},
            }
    if policy is not None:
        retention = {}
        for name in policy.randomized:
            attr = policy.attributes[name]
            if name not in orig.columns or name not in prot.columns:
                continue
            tokens = set(policy.input.missing_tokens)
            t = _category_codes(orig[name].tolist(), attr.domain, tokens)
            p = _category_codes(prot[name].tolist(), attr.domain, tokens)
            if (t == -2).any() or (p == -2).any():
                raise InputDataError(f"column '{name}' has values outside the policy's categories")
            retention[name] = quality.rr_retention(t, p)
        if retention:
            result["retention"] = retention
        result.update(whole_key_evaluation(orig, prot, policy, original, protected))
        result.update(_weighted_and_frequency(orig, prot, policy, cols))
    return result


def recoded_standins(
    orig: pd.DataFrame, prot: pd.DataFrame, policy: Policy, original: str | Path
) -> pd.DataFrame:
    """A recoded file's numeric keys as numbers: each published interval (or value) stands
    for the mean of the originals published under it, a suppressed cell for the overall mean
    (docs/policy.md): what SSE/SST and linkage of a recoding measure."""
    tokens = set(policy.input.missing_tokens)
    out = prot.copy()
    for name in policy.numeric_claim:
        if name not in orig.columns or name not in prot.columns:
            continue
        x = pd.Series(numeric_matrix(orig, [name], original)[:, 0], index=orig.index)
        label = pd.Series(missing_to_none(prot[name].tolist(), tokens), index=prot.index)
        means = x.groupby(label.where(label.notna(), "\0").astype(str)).transform("mean")
        out[name] = np.where(label.isna(), x.mean(), means)
    return out


def suppressed_cells(
    orig: pd.DataFrame, published: pd.DataFrame, cols: Sequence[str], tokens: set[str]
) -> dict[str, int]:
    """Per column of ``cols``, the cells with a number in the original that the published
    file leaves empty (suppressed: ``kanon``'s cells, a record whose quasi-identifiers were
    suppressed, a recoding's suppressed key); columns without one are left out."""
    out: dict[str, int] = {}
    for c in cols:
        had = numbers_of(orig[c]).notna().to_numpy()
        gone = np.array([is_missing(v, tokens) for v in published[c].tolist()], dtype=bool)
        if n := int((had & gone).sum()):
            out[c] = n
    return out


def _numeric_quality(
    orig: pd.DataFrame,
    prot: pd.DataFrame,
    cols: Sequence[str],
    paths: tuple[str | Path, str | Path],
    pct: float,
) -> quality.QualityReport:
    """The numeric measures of ``cols``. A cell the protected file leaves empty where the
    original has a number was suppressed: it stands for the original column's mean, as a
    recoding's suppressed number does (docs/policy.md), so the loss it causes is counted, not
    dropped with its row. A row with a missing value in the original has nothing to compare
    with and is left out (the report's ``n_excluded``)."""
    x = numeric_matrix(orig, list(cols), paths[0])
    xm = numeric_matrix(prot, list(cols), paths[1])
    suppressed = np.isnan(xm) & ~np.isnan(x)
    for j in np.flatnonzero(suppressed.any(axis=0)):  # such a column has an original value
        xm[suppressed[:, j], j] = np.nanmean(x[:, j])
    return quality.evaluate_numeric(x, xm, p_pct=pct)


def _weighted_and_frequency(
    orig: pd.DataFrame, prot: pd.DataFrame, policy: Policy, numeric: Sequence[str]
) -> dict[str, Any]:
    """The frequency risk of the release and, with a weight, the weighted estimates."""
    out: dict[str, Any] = {}
    freq = release_risk.release_risk(orig, prot, policy)
    if freq:
        out["frequency_risk"] = freq
    weight = policy.weight
    w = weights_of(orig, weight) if weight is not None and weight in orig.columns else None
    # a panel release's analysis weights stand for the sampling weights in the published file
    w_pub = published_weights(prot, policy)
    if w_pub is not None:
        raw_t, pub_t = categorical_frames(policy, orig, prot)
        out["weighted_shares"] = share_gaps(raw_t, pub_t, w, w_pub)
    if (w is not None or w_pub is not None) and numeric:
        w_orig = np.ones(len(orig)) if w is None else w
        w_out = w_orig if w_pub is None else w_pub
        estimates = release_risk.weighted_estimates(orig, prot, numeric, w_orig, w_out)
        for name, est in estimates.items():  # the SEs, over the same records
            x = pd.to_numeric(orig[name], errors="coerce").to_numpy(dtype=np.float64)
            y = pd.to_numeric(prot[name], errors="coerce").to_numpy(dtype=np.float64)
            ok = np.isfinite(x) & np.isfinite(y)
            for label, v, wv in (("original", x[ok], w_orig[ok]), ("published", y[ok], w_out[ok])):
                est[f"se_mean_{label}"] = weighted_mean_se(v, wv)
                est[f"se_total_{label}"] = weighted_total_se(v, wv)
        out["weighted_estimates"] = estimates
    return out
