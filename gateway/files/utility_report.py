"""The analyst's utility report: one self-contained HTML page (``privgw evaluate … --report``).

Marginals and a two-way table (raw, published, and published after reconstruction for the
randomized attributes: EM, Agrawal & Aggarwal 2001), the correlation matrices of the numeric
attributes, one regression's coefficients before and after (weighted least squares with the
policy's weight), SSE/SST, category change rates, the risk figures, and the commands that
reproduce every figure. Pictures are PNG (matplotlib) inlined as data URIs: the page needs no
other file and no network.
"""

from __future__ import annotations

import base64
import html
import io
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from gateway.files.fileio import read_table
from gateway.measures.frequency_risk import weights_of
from gateway.measures.published import mechanisms_from_meta
from gateway.measures.reconstruction import reconstruct
from gateway.mechanisms import masking
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.policy import AttrType, Method, Policy, Role

MAX_CATEGORIES = 12  # categories shown per marginal (the most frequent in the original)


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], cls: str = "") -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return "—" if not np.isfinite(v) else f"{v:.4f}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _text(values: pd.Series, tokens: set[str]) -> pd.Series:
    s = values.astype(object).where(values.notna(), None)
    return s.map(lambda v: None if v is None or str(v) in tokens else str(v))


def _shares(values: pd.Series, cats: Sequence[str]) -> np.ndarray:
    counts = values.value_counts()
    total = counts.sum()
    return np.array([counts.get(c, 0) / total if total else np.nan for c in cats])


def _em(mech: RRMechanism, values: pd.Series) -> np.ndarray:
    index = {c: i for i, c in enumerate(mech.categories)}
    codes = np.array([index.get(v, -1) if v is not None else -1 for v in values], dtype=np.int64)
    if (codes >= 0).sum() == 0:
        return np.full(mech.m, np.nan)
    return reconstruct(mech, codes, method="em").em


def _marginal_section(
    name: str,
    raw: pd.Series,
    pub: pd.Series,
    mech: RRMechanism | None,
) -> tuple[str, str]:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    cats = [str(c) for c in raw.value_counts().index[:MAX_CATEGORIES]]
    r, p = _shares(raw, cats), _shares(pub, cats)
    rec = None
    if mech is not None:
        est = _em(mech, pub)
        rec = np.array([est[mech.categories.index(c)] if c in mech.categories else np.nan
                        for c in cats])  # fmt: skip
    rows = [
        [c, r[i], p[i], rec[i] if rec is not None else float("nan")] for i, c in enumerate(cats)
    ]
    table = _table(["category", "raw", "published", "reconstructed (EM)"], rows)
    fig, ax = plt.subplots(figsize=(7, 2.8))
    x = np.arange(len(cats))
    width = 0.27 if rec is not None else 0.4
    ax.bar(x - width, r, width, label="raw", color="#4c72b0")
    ax.bar(x, p, width, label="published", color="#dd8452")
    if rec is not None:
        ax.bar(x + width, rec, width, label="reconstructed", color="#55a868")
    ax.set_xticks(x, [c[:14] for c in cats], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("share")
    ax.set_title(name)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return table, _png(fig)


def _two_way(
    row_name: str,
    col_name: str,
    raw: pd.DataFrame,
    pub: pd.DataFrame,
    mech: RRMechanism | None,
) -> str:
    """Shares of ``col_name`` within each category of ``row_name`` (raw row categories, as
    the analyst holds them when the row attribute is published unchanged)."""
    rows_out: list[list[object]] = []
    col_cats = [str(c) for c in raw[col_name].value_counts().index[:6]]
    for rc in [str(c) for c in raw[row_name].value_counts().index[:6]]:
        in_raw = raw[row_name] == rc
        in_pub = pub[row_name] == rc
        r = _shares(raw.loc[in_raw, col_name], col_cats)
        p = _shares(pub.loc[in_pub, col_name], col_cats)
        rec = _em(mech, pub.loc[in_pub, col_name]) if mech is not None else None
        for i, cc in enumerate(col_cats):
            re = float("nan")
            if rec is not None and cc in mech.categories:  # type: ignore[union-attr]
                re = float(rec[mech.categories.index(cc)])  # type: ignore[union-attr]
            rows_out.append([rc, cc, r[i], p[i], re])
    return _table(
        [row_name, col_name, "raw share in row", "published", "reconstructed (EM)"], rows_out
    )


def _correlations(x: pd.DataFrame, xm: pd.DataFrame) -> tuple[str, str]:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    c0, c1 = x.corr().to_numpy(), xm.corr().to_numpy()
    names = list(x.columns)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, c, title in ((axes[0], c0, "original"), (axes[1], c1, "published")):
        im = ax.imshow(c, vmin=-1, vmax=1, cmap="RdBu_r")
        ax.set_xticks(range(len(names)), [n[:10] for n in names], rotation=45, fontsize=7)
        ax.set_yticks(range(len(names)), [n[:10] for n in names], fontsize=7)
        ax.set_title(f"correlations, {title}")
    fig.colorbar(im, ax=axes, shrink=0.8)
    rows = [
        [names[i], names[j], c0[i, j], c1[i, j], c1[i, j] - c0[i, j]]
        for i in range(len(names))
        for j in range(i + 1, len(names))
    ]
    return _table(["a", "b", "original", "published", "difference"], rows), _png(fig)


def _regression(x: pd.DataFrame, xm: pd.DataFrame, w: np.ndarray | None) -> tuple[str, str] | None:
    names = list(x.columns)
    if len(names) < 2:
        return None
    y_name, preds = names[-1], names[:-1]
    out = []
    for frame in (x, xm):
        design = np.column_stack([np.ones(len(frame)), frame[preds].to_numpy(dtype=float)])
        y = frame[y_name].to_numpy(dtype=float)
        sw = np.sqrt(w) if w is not None else np.ones(len(y))
        beta, *_ = np.linalg.lstsq(design * sw[:, None], y * sw, rcond=None)
        out.append(beta)
    rows = [[t, b0, b1, b1 - b0] for t, b0, b1 in zip(["intercept", *preds], *out, strict=True)]
    model = f"{y_name} ~ {' + '.join(preds)}" + (" (weighted)" if w is not None else "")
    return model, _table(["term", "original", "published", "difference"], rows)


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
    meta_file = Path(str(protected) + ".meta.json")
    mechanisms: dict[str, RRMechanism] = {}
    if meta_file.exists():
        mechanisms = mechanisms_from_meta(orjson.loads(meta_file.read_bytes()))
    weight = policy.weight if policy.weight in orig.columns else None
    parts = [
        *_heading(original, protected, policy, orig, weight, policy_path=policy_path, out=out),
        _table(["figure", "value"], _summary_rows(result, len(orig)), "summary"),
        *_marginal_parts(policy, orig, prot, mechanisms),
        *_numeric_parts(policy, orig, prot, weight),
    ]
    if result.get("weighted_estimates"):
        rows = [
            [n, e["mean_original"], e["mean_published"], e["total_original"], e["total_published"]]
            for n, e in result["weighted_estimates"].items()
        ]
        parts.append("<h2>Weighted estimates</h2>")
        parts.append(_table(["attribute", "mean original", "mean published", "total original",
                             "total published"], rows))  # fmt: skip
    body = "\n".join(parts)
    return _PAGE.replace("BODY", body)


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
        + "</code>.</p>",
        "<h2>Summary</h2>",
    ]


def _summary_rows(result: Mapping[str, Any], records: int) -> list[list[object]]:
    """The summary table: utility, linkage, category changes, retention, frequency risk."""
    rows: list[list[object]] = [["records", result.get("records", records)]]
    for name in ("sse_sst_pct", "il1s", "dld", "interval_disclosure"):
        if name in result:
            rows.append([f"{name} (numeric quasi-identifiers)", float(result[name])])
    if "whole_key_linkage" in result:
        rows.append(["whole-key record linkage", result["whole_key_linkage"]["share_linked"]])
    for attr, share in result.get("changed_categories", {}).items():
        rows.append([f"category change rate: {attr}", float(share)])
    for attr, share in result.get("retention", {}).items():
        rows.append([f"randomized response retention: {attr}", float(share)])
    freq = result.get("frequency_risk")
    if freq:
        for label in ("original", "published"):
            f = freq[label]
            rows.append(
                [f"expected re-identifications, {label}", float(f["expected_reidentifications"])]
            )
            for k, v in f["k_anonymity_violations"].items():
                rows.append([f"records violating {k}-anonymity, {label}", v])
            rows.append([f"SUDA2 records with an MSU, {label}", f["suda2"]["records_with_msu"]])
    return rows


def _marginal_parts(
    policy: Policy,
    orig: pd.DataFrame,
    prot: pd.DataFrame,
    mechanisms: Mapping[str, RRMechanism],
) -> list[str]:
    """Each categorical attribute's marginal (raw, published, reconstructed) and one two-way
    table of a randomized attribute within a plain one."""
    tokens = set(policy.input.missing_tokens)
    parts = ["<h2>Marginals: raw, published, reconstructed</h2>"]
    categorical = [
        n
        for n, a in policy.attributes.items()
        if a.type is AttrType.CATEGORICAL
        and a.method is not Method.DROP
        and a.role in (Role.QUASI_IDENTIFIER, Role.SENSITIVE)
        and n in orig.columns
        and n in prot.columns
    ]
    raw_t = pd.DataFrame({n: _text(orig[n], tokens) for n in categorical})
    for n in categorical:  # a generalized attribute is compared at its published level
        hierarchy = policy.attributes[n].hierarchy
        if policy.attributes[n].method is Method.GENERALIZE and hierarchy is not None:
            raw_t[n] = masking.generalize(raw_t[n].tolist(), hierarchy)
    pub_t = pd.DataFrame({n: _text(prot[n], tokens) for n in categorical})
    for name in categorical:
        table, img = _marginal_section(name, raw_t[name], pub_t[name], mechanisms.get(name))
        parts.append(
            f"<h3>{html.escape(name)}</h3>{table}<img alt='{html.escape(name)}' src='{img}'>"
        )
    randomized = [n for n in categorical if n in mechanisms]
    plain = [n for n in categorical if n not in mechanisms]
    if randomized and plain:
        row_name, col_name = plain[0], randomized[0]
        parts.append(
            f"<h2>Two-way table: {html.escape(col_name)} within {html.escape(row_name)}</h2>"
        )
        parts.append(_two_way(row_name, col_name, raw_t, pub_t, mechanisms[col_name]))
    return parts


def _numeric_parts(
    policy: Policy, orig: pd.DataFrame, prot: pd.DataFrame, weight: str | None
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
    w = weights_of(orig, weight)[ok] if weight else None  # type: ignore[index]
    reg = _regression(x, xm, w)
    if reg is not None:
        model, table = reg
        parts.append(f"<h2>Regression: {html.escape(model)}</h2>{table}")
    return parts


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>privgw utility report</title>
<style>
body{font-family:sans-serif;margin:1.5em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}
th,td{border:1px solid #bbb;padding:2px 8px;text-align:right}
th{background:#eef}td:first-child,th:first-child{text-align:left}
img{display:block;max-width:100%;margin:.3em 0 1em}
code{background:#f4f4f4;padding:1px 3px}
</style></head>
<body>
BODY
<script>
window.addEventListener("load", function () {
  var imgs = document.querySelectorAll("img"), ok = 0;
  imgs.forEach(function (i) { if (i.complete && i.naturalWidth > 0) ok += 1; });
  document.body.setAttribute("data-images", String(imgs.length));
  document.body.setAttribute("data-images-loaded", String(ok));
  document.body.setAttribute("data-tables", String(document.querySelectorAll("table").length));
});
</script>
</body></html>
"""
