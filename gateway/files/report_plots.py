"""The utility report's pictures (matplotlib, PNG inlined as data URIs): the marginals as
horizontal bars, so every category's full name fits, and the correlation matrices on a
diverging scale centred at 0 whose range is the largest correlation shown."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

COLORS = {"raw": "#4c72b0", "published": "#dd8452", "reconstructed": "#55a868"}


@dataclass(frozen=True, eq=False)
class Bars:
    """One series of a marginal plot: a share per category, with SEs or None."""

    label: str
    shares: np.ndarray
    se: np.ndarray | None = None


def png(fig: Any) -> str:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def marginal_plot(name: str, cats: Sequence[str], series: Sequence[Bars]) -> str:
    """Horizontal bars, the first category on top; a reconstruction's bars carry ±1.96 SE."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.32 * len(cats) * max(1, len(series) - 1)))
    y = np.arange(len(cats))[::-1].astype(float)
    height = 0.8 / len(series)
    for i, s in enumerate(series):
        offset = (len(series) - 1) / 2 * height - i * height
        err = None if s.se is None else 1.96 * np.nan_to_num(s.se, posinf=0.0)
        ax.barh(
            y + offset,
            s.shares,
            height,
            xerr=err,
            label=s.label,
            color=COLORS[s.label],
            error_kw={"elinewidth": 0.8, "capsize": 2},
        )
    ax.set_yticks(y, list(cats), fontsize=8)
    ax.set_xlabel(
        "share" + (" (error bars: ±1.96 SE)" if any(s.se is not None for s in series) else ""),
        fontsize=8,
    )
    ax.set_title(name, fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return png(fig)


def correlation_limit(*matrices: np.ndarray) -> float:
    """The colour scale's half-range: the largest |correlation| off the diagonal, rounded up
    to 0.05 (at least 0.05), so small correlations still show in colour."""
    off = [np.abs(c[~np.eye(c.shape[0], dtype=bool)]) for c in matrices]
    top = max((float(np.nanmax(o)) for o in off if o.size), default=0.0)
    return max(0.05, math.ceil(top / 0.05 - 1e-9) * 0.05)


def correlation_plot(names: Sequence[str], c0: np.ndarray, c1: np.ndarray) -> str:
    """Both matrices side by side, the diagonal (always 1) left grey, each cell annotated."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    lim = correlation_limit(c0, c1)
    k = len(names)
    fig, axes = plt.subplots(1, 2, figsize=(10, 1.6 + 0.75 * k), layout="constrained")
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="#dddddd")
    im = None
    for ax, c, title in ((axes[0], c0, "original"), (axes[1], c1, "published")):
        shown = np.where(np.eye(k, dtype=bool), np.nan, c)
        im = ax.imshow(shown, vmin=-lim, vmax=lim, cmap=cmap)
        for i in range(k):
            for j in range(k):
                if i != j:
                    dark = abs(c[i, j]) > 0.6 * lim
                    ax.text(
                        j,
                        i,
                        f"{c[i, j]:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if dark else "black",
                    )
        ax.set_xticks(range(k), list(names), rotation=35, ha="right", fontsize=8)
        ax.set_yticks(range(k), list(names), fontsize=8)
        ax.set_title(f"correlations, {title}", fontsize=10)
    assert im is not None
    bar = fig.colorbar(im, ax=axes, shrink=0.8)
    bar.set_label(f"correlation (scale ±{lim:.2f}, centred at 0)", fontsize=8)
    return png(fig)
