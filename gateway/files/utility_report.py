"""The analyst's utility report: one self-contained HTML page (``privgw evaluate … --report``).

Marginals and a two-way table (raw, published, and published after reconstruction for the
randomized attributes: EM, Agrawal & Aggarwal 2001), the correlation matrices of the numeric
attributes, one regression's coefficients before and after (weighted least squares with the
policy's weight), SSE/SST, category change rates, the risk figures, and the commands that
reproduce every figure. Pictures are PNG (matplotlib) inlined as data URIs: the page needs no
other file and no network.
"""

from __future__ import annotations

import html
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gateway.files.fileio import read_table
from gateway.files.panel_weights import categorical_frames, category_shares, published_weights
from gateway.files.protect import read_meta
from gateway.files.report_changes import data_changes
from gateway.files.report_html import PAGE, Page, cell, html_table
from gateway.files.report_plots import Bars, correlation_plot, marginal_plot
from gateway.measures.estimates import wls
from gateway.measures.frequency_risk import weights_of
from gateway.measures.published import mechanisms_from_meta, reconstruct_column
from gateway.measures.reconstruction import Renormalised, renormalise
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.policy import MISSING_LABEL, AttrType, Method, Policy, Role

MAX_CATEGORIES = 12  # categories shown per marginal (the most frequent in the original)
MAX_TWO_WAY = 6  # categories shown per margin of the two-way table
FLAG_SES = 2.0  # a published estimate further than this many SEs from the original is flagged


def _shares(
    values: pd.Series, cats: Sequence[str], weights: np.ndarray | None = None
) -> np.ndarray:
    """Each category's share (weighted: a panel release's analysis weights); missing values
    left out."""
    shares = category_shares(values, weights)
    if shares.empty:
        return np.full(len(cats), np.nan)
    return np.array([shares.get(c, 0.0) for c in cats])


def _em(name: str, mech: RRMechanism, pub: pd.Series) -> Renormalised | None:
    """``privgw reconstruct``'s EM estimate (the same computation), renormalised without the
    missing category, with its SEs."""
    est = reconstruct_column(name, pub.tolist(), mech)
    return None if est is None else renormalise(est, MISSING_LABEL)


def _em_header(mech: RRMechanism | None) -> list[str]:
    if mech is None:
        return []
    if MISSING_LABEL in mech.categories:
        return [f"EM (privgw reconstruct, renormalised without {MISSING_LABEL})", "± SE"]
    return ["EM (privgw reconstruct)", "± SE"]


def _em_values(rec: Renormalised | None, cats: Sequence[str]) -> list[list[float]]:
    if rec is None:
        return [[float("nan"), float("nan")] for _ in cats]
    at = {c: i for i, c in enumerate(rec.categories)}
    return [
        [float(rec.shares[at[c]]), float(rec.se[at[c]])] if c in at else [np.nan, np.nan]
        for c in cats
    ]


def _categories(raw: pd.Series, pub: pd.Series, mech: RRMechanism | None) -> list[str]:
    """The original's categories, most frequent first, then any only published or only in
    the mechanism (the missing category aside: the shares are among the answers given)."""
    cats = [str(c) for c in raw.value_counts().index]
    more = [str(c) for c in pub.value_counts().index] + list(mech.categories if mech else [])
    for c in more:
        if c not in cats and c != MISSING_LABEL:
            cats.append(c)
    return cats


def _marginal_section(  # noqa: PLR0917
    page: Page,
    name: str,
    raw: pd.Series,
    pub: pd.Series,
    mech: RRMechanism | None,
    weights: np.ndarray | None,
) -> str:
    all_cats = _categories(raw, pub, mech)
    rec = _em(name, mech, pub) if mech is not None else None
    r, p = _shares(raw, all_cats), _shares(pub, all_cats, weights)
    em = _em_values(rec, all_cats)
    rows = [[c, r[i], p[i], *(em[i] if mech is not None else [])] for i, c in enumerate(all_cats)]
    published = "published" if weights is None else "published (weighted)"
    header = ["category", "raw", published, *_em_header(mech)]
    cut = page.cut_table(
        name, MAX_CATEGORIES, len(all_cats), "categories", html_table(header, rows)
    )
    shown = all_cats[:MAX_CATEGORIES]
    series = [Bars("raw", r[: len(shown)]), Bars("published", p[: len(shown)])]
    if mech is not None:
        est = np.array(em[: len(shown)], dtype=np.float64).reshape(-1, 2)
        series.append(Bars("reconstructed", est[:, 0], est[:, 1]))
    img = marginal_plot(name, shown, series)
    return (
        f"<h3>{html.escape(name)}</h3>{cut}<div class='pair'>"
        f"{html_table(header, rows[: len(shown)])}<img alt='{html.escape(name)}' src='{img}'></div>"
    )


def _two_way(
    page: Page,
    raw: pd.DataFrame,
    pub: pd.DataFrame,
    mech: RRMechanism,
    *,
    row_name: str,
    col_name: str,
) -> str:
    """Shares of ``col_name`` within each category of ``row_name`` (raw row categories, as
    the analyst holds them when the row attribute is published unchanged)."""
    row_cats = [str(c) for c in raw[row_name].value_counts().index]
    col_cats = _categories(raw[col_name], pub[col_name], mech)
    rows: list[list[object]] = []
    shown: list[list[object]] = []
    for i, rc in enumerate(row_cats):
        in_raw, in_pub = raw[row_name] == rc, pub[row_name] == rc
        r = _shares(raw.loc[in_raw, col_name], col_cats)
        p = _shares(pub.loc[in_pub, col_name], col_cats)
        em = _em_values(_em(col_name, mech, pub.loc[in_pub, col_name]), col_cats)
        for j, cc in enumerate(col_cats):
            rows.append([rc, cc, r[j], p[j], *em[j]])
            if i < MAX_TWO_WAY and j < MAX_TWO_WAY:
                shown.append(rows[-1])
    header = [row_name, col_name, "raw share in row", "published", *_em_header(mech)]
    detail = (
        f" ({min(len(row_cats), MAX_TWO_WAY)} of {len(row_cats)} {row_name} categories × "
        f"{min(len(col_cats), MAX_TWO_WAY)} of {len(col_cats)} {col_name} categories)"
    )
    name = f"{col_name} within {row_name}"
    cut = page.cut_table(
        name, len(shown), len(rows), "cells", html_table(header, rows), detail=detail
    )
    return cut + html_table(header, shown)


def _correlations(x: pd.DataFrame, xm: pd.DataFrame) -> tuple[str, str]:
    c0, c1 = x.corr().to_numpy(), xm.corr().to_numpy()
    names = list(x.columns)
    rows = [
        [names[i], names[j], c0[i, j], c1[i, j], c1[i, j] - c0[i, j]]
        for i in range(len(names))
        for j in range(i + 1, len(names))
    ]
    table = html_table(["a", "b", "original", "published", "difference"], rows)
    return table, correlation_plot(names, c0, c1)


def _regression(x: pd.DataFrame, xm: pd.DataFrame, w: np.ndarray | None) -> tuple[str, str] | None:
    """The last numeric attribute on the others, on both files; each coefficient's change in
    SEs of the original fit (sandwich SEs: the weights are sampling weights)."""
    names = list(x.columns)
    if len(names) < 2:
        return None
    y_name, preds = names[-1], names[:-1]
    fits = [
        wls(f[preds].to_numpy(dtype=float), f[y_name].to_numpy(dtype=float), w) for f in (x, xm)
    ]
    rows = []
    for i, term in enumerate(["intercept", *preds]):
        b0, s0, b1, s1 = fits[0].beta[i], fits[0].se[i], fits[1].beta[i], fits[1].se[i]
        z = (b1 - b0) / s0 if s0 > 0 else float("nan")
        flag = f"moved > {FLAG_SES:g} SE" if abs(z) > FLAG_SES else ""
        rows.append([term, b0, s0, b1, s1, b1 - b0, z, flag])
    model = f"{y_name} ~ {' + '.join(preds)}" + (" (weighted)" if w is not None else "")
    header = [
        "term",
        "original",
        "± SE",
        "published",
        "± SE",
        "difference",
        "difference / SE(original)",
        "flag",
    ]
    return model, html_table(header, rows, "regression")


def build_report(
    original: str | Path,
    protected: str | Path,
    policy: Policy,
    result: Mapping[str, Any],
    *,
    policy_path: str | Path,
    out: str | Path,
) -> str:
    """The report's HTML (the figures of ``result`` from ``evaluate`` and its own tables)."""
    orig = read_table(original, as_text=True)
    prot = read_table(protected, as_text=True)
    meta = read_meta(protected)
    mechanisms = {} if meta is None else mechanisms_from_meta(meta)
    weight = policy.weight if policy.weight in orig.columns else None
    w = weights_of(orig, weight) if weight else None
    raw_t, pub_t = categorical_frames(policy, orig, prot)
    changes = data_changes(policy, orig, prot, raw_t, pub_t, weights=w)
    page = Page()
    page.parts.extend(
        [
            *_heading(original, protected, policy, orig, weight, policy_path=policy_path, out=out),
            _summary_table(result, policy, len(orig)),
            "<h2 id='changes'>What changed in the data</h2>",
            html_table(
                ["attribute", "what was done", "records", "of", "share"],
                [[c.attribute, c.what, c.records, c.of, c.share] for c in changes],
                "changes",
            ),
            *_marginal_parts(page, raw_t, pub_t, mechanisms, published_weights(prot, policy)),
            *_numeric_parts(policy, orig, prot, w),
            *_weighted_parts(result),
        ]
    )
    if page.full:
        page.parts.extend(["<h2 id='full-tables'>Full tables</h2>", *page.full])
    return PAGE.replace("BODY", "\n".join(page.parts))


def _heading(
    original: str | Path,
    protected: str | Path,
    policy: Policy,
    orig: pd.DataFrame,
    weight: str | None,
    *,
    policy_path: str | Path,
    out: str | Path,
) -> list[str]:
    """The title and the commands that reproduce every figure."""
    q = shlex.quote
    cmd = (
        f"privgw evaluate {q(str(original))} {q(str(protected))} --policy {q(str(policy_path))} "
        f"--report {q(str(out))}"
    )
    keys = [n for n in policy.k_claim if n in orig.columns]
    return [
        f"<h1>Utility report: {html.escape(Path(protected).name)}</h1>",
        "<p>Every figure on this page is reproduced by <code>"
        + html.escape(cmd)
        + "</code>; the numbers alone by the same command with <code>--json</code>, the "
        "reconstructions by <code>privgw reconstruct "
        + html.escape(f"{q(str(protected))} --policy {q(str(policy_path))}")
        + "</code>, the frequency risk of the original by <code>privgw risk "
        + html.escape(
            f"{q(str(original))} --keys {','.join(keys)}"
            + (f" --weight {weight}" if weight else "")
        )
        + "</code>. A ± SE is a standard error: the EM shares' from the observed Fisher "
        "information (delta method through the renormalisation), the weighted estimates' and "
        "the coefficients' by linearisation with the sampling weights.</p>",
        "<h2>Summary</h2>",
    ]


_NUMERIC_FIGURES = {
    "sse_sst_pct": "SSE/SST (%)",
    "il1s": "IL1s",
    "dld": "distance-based linkage (DLD)",
    "interval_disclosure": "interval disclosure",
}


def _summary_table(result: Mapping[str, Any], policy: Policy, records: int) -> str:
    """The summary: each figure, the columns it covers (also in ``data-columns``), its value."""
    rows: list[tuple[str, str, Sequence[str], object]] = [
        ("records", "records", [], result.get("records", records))
    ]
    qi = result.get("numeric_quasi_identifiers")
    for name, label in _NUMERIC_FIGURES.items():
        if qi and name in qi:
            rows.append((name, f"{label}, numeric quasi-identifiers", qi["columns"], qi[name]))
        if name in result:
            cols = result.get("columns", [])
            rows.append(
                (
                    name,
                    f"{label}, all {len(cols)} numeric attributes compared",
                    cols,
                    float(result[name]),
                )
            )
    if "whole_key_linkage" in result:
        rows.append(
            (
                "whole_key_linkage",
                "whole-key record linkage (the k claim)",
                result.get("k_claim", []),
                result["whole_key_linkage"]["share_linked"],
            )
        )
    for attr, share in result.get("changed_categories", {}).items():
        rows.append(("changed_categories", "category change rate", [attr], float(share)))
    for attr, share in result.get("retention", {}).items():
        rows.append(("retention", "randomized response retention", [attr], float(share)))
    freq = result.get("frequency_risk") or {}
    for label in ("original", "published") if freq else ():
        f, keys = freq[label], freq.get("keys", [])
        rows.append(
            (
                "expected_reidentifications",
                f"expected re-identifications, {label}",
                keys,
                float(f["expected_reidentifications"]),
            )
        )
        for k, v in f["k_anonymity_violations"].items():
            rows.append(
                ("k_anonymity_violations", f"records violating {k}-anonymity, {label}", keys, v)
            )
        rows.append(
            ("suda2", f"SUDA2 records with an MSU, {label}", keys, f["suda2"]["records_with_msu"])
        )
    body = "".join(
        f"<tr data-figure='{key}' data-columns='{html.escape(','.join(cols))}'>"
        f"<td>{html.escape(label)}</td><td class='t'>{html.escape(', '.join(cols))}</td>"
        f"<td>{cell(value)}</td></tr>"
        for key, label, cols, value in rows
    )
    return (
        "<table class='summary'><thead><tr><th>figure</th><th>columns it covers</th>"
        f"<th>value</th></tr></thead><tbody>{body}</tbody></table>"
    )


def _marginal_parts(
    page: Page,
    raw_t: pd.DataFrame,
    pub_t: pd.DataFrame,
    mechanisms: Mapping[str, RRMechanism],
    weights: np.ndarray | None,
) -> list[str]:
    """Each categorical attribute's marginal (raw, published, reconstructed) and one two-way
    table of a randomized attribute within a plain one."""
    parts = ["<h2>Marginals: raw, published, reconstructed</h2>"]
    for name in raw_t.columns:
        parts.append(
            _marginal_section(page, name, raw_t[name], pub_t[name], mechanisms.get(name), weights)
        )
    randomized = [n for n in raw_t.columns if n in mechanisms]
    plain = [n for n in raw_t.columns if n not in mechanisms]
    if randomized and plain:
        row_name, col_name = plain[0], randomized[0]
        parts.append(
            f"<h2>Two-way table: {html.escape(col_name)} within {html.escape(row_name)}</h2>"
        )
        parts.append(
            _two_way(page, raw_t, pub_t, mechanisms[col_name], row_name=row_name, col_name=col_name)
        )
    return parts


def _numeric_parts(
    policy: Policy, orig: pd.DataFrame, prot: pd.DataFrame, weights: np.ndarray | None
) -> list[str]:
    """The numeric attributes' correlation matrices and one regression, before and after."""
    numeric = [
        n
        for n, a in policy.attributes.items()
        if a.type is AttrType.NUMERIC
        and a.role in (Role.QUASI_IDENTIFIER, Role.SENSITIVE)
        and a.method is not Method.DROP
        and n in orig.columns
        and n in prot.columns
    ]
    if len(numeric) < 2:
        return []
    x = orig[numeric].apply(pd.to_numeric, errors="coerce")
    xm = prot[numeric].apply(pd.to_numeric, errors="coerce")
    ok = (x.notna() & xm.notna()).all(axis=1).to_numpy()
    x, xm = x[ok], xm[ok]
    table, img = _correlations(x, xm)
    parts = [f"<h2>Correlation matrices</h2><img alt='correlations' src='{img}'>{table}"]
    reg = _regression(x, xm, weights[ok] if weights is not None else None)
    if reg is not None:
        model, table = reg
        parts.append(f"<h2>Regression: {html.escape(model)}</h2>{table}")
    return parts


def _weighted_parts(result: Mapping[str, Any]) -> list[str]:
    """The weighted means and totals with their SEs; a mean further than 2 SEs is flagged."""
    est = result.get("weighted_estimates")
    if not est:
        return []
    rows = []
    for n, e in est.items():
        se = e.get("se_mean_original", float("nan"))
        z = (e["mean_published"] - e["mean_original"]) / se if se > 0 else float("nan")
        rows.append(
            [
                n,
                e["mean_original"],
                se,
                e["mean_published"],
                e.get("se_mean_published", np.nan),
                z,
                f"moved > {FLAG_SES:g} SE" if abs(z) > FLAG_SES else "",
                e["total_original"],
                e.get("se_total_original", np.nan),
                e["total_published"],
                e.get("se_total_published", np.nan),
            ]
        )
    header = [
        "attribute",
        "mean original",
        "± SE",
        "mean published",
        "± SE",
        "difference / SE(original)",
        "flag",
        "total original",
        "± SE",
        "total published",
        "± SE",
    ]
    return [
        "<h2>Weighted estimates</h2>",
        html_table(header, rows, "weighted"),
        "<p>See <a href='#changes'>what changed in the data</a> for the top/bottom "
        "coding behind a flagged mean.</p>",
    ]
