"""The R-U map of a file (``privgw ru-map``): information loss against disclosure risk of
MDAV over the policy's whole k claim, per k."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from gateway.errors import InputDataError
from gateway.files.evaluate import changed_categories, claim_frame
from gateway.files.fileio import (
    read_table,
    records_from_frame,
)
from gateway.grouping.mixed_microaggregation import (
    QIKind,
    claim_columns,
    mixed_microaggregate,
)
from gateway.measures import linkage, quality
from gateway.measures.frequency_risk import measure_risk, weights_of
from gateway.policy import (
    Policy,
)


def ru_map(
    src: str | Path, policy: Policy, ks: Sequence[int], *, p_pct: float | None = None
) -> list[dict[str, float]]:
    """Information loss vs disclosure risk of MDAV on the policy's whole k claim, per k.

    IL: SSE/SST and IL1s over the numeric quasi-identifiers, and the share of changed
    categories over the categorical ones; risk: DLD and ID over the numeric ones (DR and the
    score as in the seed paper), and record linkage over the whole key (mixed distance)."""
    claim = policy.k_claim
    if not claim:
        raise InputDataError("the policy microaggregates no attribute; an R-U map needs some")
    df = read_table(src, as_text=True)
    records_from_frame(df, policy, src)  # validates the file against the policy
    before = claim_frame(df, policy, published=False)
    complete = before.notna().all(axis=1).to_numpy()
    before = before[complete].reset_index(drop=True)
    weight = policy.weight
    all_w = weights_of(df, weight) if weight is not None and weight in df.columns else None
    w = all_w[complete] if all_w is not None else None
    columns = claim_columns(policy)
    numeric = [c.name for c in columns if c.kind is QIKind.NUMERIC]
    pct = p_pct if p_pct is not None else policy.risk.interval_pct
    rows = []
    for k in ks:
        if k < 2 or k > len(before):
            raise InputDataError(
                f"--k: each k must be between 2 and the {len(before)} complete records; got {k}"
            )
        published, _ = mixed_microaggregate(
            columns,
            [before[c.name].tolist() for c in columns],
            k,
            standardize=policy.microaggregation.standardize,
        )
        after = pd.DataFrame(dict(zip([c.name for c in columns], published, strict=True)))
        row: dict[str, float] = {"k": float(k)}
        if numeric:
            rep = quality.evaluate_numeric(
                before[numeric].to_numpy(dtype=float),
                after[numeric].to_numpy(dtype=float),
                p_pct=pct,
            )
            row.update(
                il=rep.sse_sst_pct,
                il1s=rep.il1s,
                dld=rep.dld,
                interval_disclosure=rep.interval_disclosure,
                dr=rep.dr,
                score=rep.score,
            )
        changed = changed_categories(before, after, policy)
        row["changed_categories"] = float(np.mean(list(changed.values()))) if changed else 0.0
        row["whole_key_linkage"] = linkage.mixed_linkage(before, after, columns).share_linked
        freq = measure_risk(after.assign(__w__=w) if w is not None else after, claim,
                            "__w__" if w is not None else None)  # fmt: skip
        row["expected_reidentifications"] = freq.expected_reidentifications
        rows.append(row)
    return rows


def plot_ru_map(rows: Sequence[Mapping[str, float]], out: str | Path) -> None:
    import matplotlib  # noqa: PLC0415 - heavy; only this command needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=120)
    il = [r.get("il", r["changed_categories"] * 100) for r in rows]
    dr = [r["whole_key_linkage"] for r in rows]
    ax.plot(il, dr, "o-", color="#1f77b4")
    for r, x, y in zip(rows, il, dr, strict=True):
        ax.annotate(f"k={int(r['k'])}", (x, y), textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("information loss: 100·SSE/SST of the numeric quasi-identifiers")
    ax.set_ylabel("record linkage over the whole key (share re-identified)")
    ax.set_title("R-U map, MDAV over every quasi-identifier")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
