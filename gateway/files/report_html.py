"""The utility report's HTML: cells, tables, the page's parts with the full tables of the cut
ones, and the page template (self-contained: no link or picture outside the page)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


def cell(v: object) -> str:
    """A value as shown: large numbers with thousands separators, 4 decimals, or 4
    significant digits below 0.01 (a small coefficient and its SE keep their digits)."""
    if isinstance(v, float):
        if not np.isfinite(v):
            return "—"
        if abs(v) >= 1e5:
            return f"{v:,.0f}"
        return f"{v:.4f}" if v == 0 or abs(v) >= 0.01 else f"{v:.4g}"  # small: 4 digits
    return html.escape(str(v))


def td(v: object) -> str:
    """A cell: text left-aligned, numbers right-aligned."""
    text = isinstance(v, str)
    return f"<td class='t'>{cell(v)}</td>" if text else f"<td>{cell(v)}</td>"


def html_table(header: Sequence[str], rows: Sequence[Sequence[object]], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(td(v) for v in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def anchor_of(name: str) -> str:
    return "full-" + "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


@dataclass(frozen=True)
class Page:
    """The page's parts, and the full tables of the cut ones (shown at the end)."""

    parts: list[str] = field(default_factory=list)
    full: list[str] = field(default_factory=list)

    def cut_table(
        self, name: str, shown: int, total: int, what: str, table: str, *, detail: str = ""
    ) -> str:
        """A note that says how much of ``table`` is shown, with a link to it in full."""
        if shown >= total:
            return ""
        anchor = anchor_of(name)
        self.full.append(f"<h3 id='{anchor}'>{html.escape(name)}: all {total} {what}</h3>{table}")
        return (
            f"<p class='cut'>{shown} of {total} {what}{html.escape(detail)} shown (the most "
            f"frequent in the original); <a href='#{anchor}'>all {total} in the full table</a> "
            "below.</p>"
        )


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>privgw utility report</title>
<style>
body{font-family:sans-serif;margin:1.5em;max-width:1250px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}
th,td{border:1px solid #bbb;padding:2px 8px;text-align:right}
th{background:#eef;max-width:14em}td:first-child,th:first-child{text-align:left}
img{display:block;max-width:100%;margin:.3em 0 1em}
code{background:#f4f4f4;padding:1px 3px}
p.cut{font-size:13px;color:#555;margin:.2em 0}
td.t{text-align:left}
.pair{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}
.pair img{max-width:620px}
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
