"""The file workflow behind the CLI: protect, microaggregate, evaluate, R-U map, policy report,
reconstruction. Each function returns data; the CLI only formats it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from gateway.engine import Engine, ValidRecord
from gateway.errors import InputDataError
from gateway.files.fileio import Progress, chunks, read_table, records_from_frame, write_table
from gateway.grouping import file_claim, recode_suppress
from gateway.grouping.guarantees import republication_statement
from gateway.grouping.microaggregation import group_means, mdav_groups, microaggregate
from gateway.grouping.mixed_microaggregation import (
    QIKind,
    claim_columns,
    claim_inputs,
    mixed_microaggregate,
)
from gateway.grouping.strata import stratified_groups, stratum_ids
from gateway.measures import key_risk, linkage, quality, release_risk
from gateway.measures.attack import averaging_attack, intersection_attack
from gateway.measures.frequency_risk import measure_risk, weights_of
from gateway.measures.published import (
    is_missing,
    mechanisms_from_meta,
    reconstruct_rows,
)
from gateway.mechanisms.randomized_response import RRMechanism, from_spec
from gateway.policy import (
    MISSING_LABEL,
    AttrType,
    Method,
    MicroaggAlgorithm,
    Policy,
    Role,
    RRMode,
)
from gateway.randomness import SeededSource

RHO1_GRID = (0.05, 0.1, 0.2, 0.3)


def meta_path(out: str | Path) -> Path:
    p = Path(out)
    return p.with_name(p.name + ".meta.json")


def _frequencies(records: Sequence[ValidRecord], policy: Policy) -> dict[str, dict[str, float]]:
    """Value frequencies for fine-grain weights when the policy gives none (file workflow)."""
    out: dict[str, dict[str, float]] = {}
    for name in policy.randomized:
        attr = policy.attributes[name]
        assert attr.rr is not None
        if attr.rr.mode not in (RRMode.FINE_GRAIN, RRMode.INVARIANT) or attr.rr.weights:
            continue
        counts = dict.fromkeys(attr.domain, 0.0)
        for r in records:
            v = r.values.get(name)
            label = MISSING_LABEL if v is None else str(v)
            if label in counts:
                counts[label] += 1.0
        total = sum(counts.values()) or 1.0
        out[name] = {c: n / total for c, n in counts.items()}
    return out


def protect_file(
    src: str | Path, policy: Policy, out: str | Path, *, seed: int | None = None
) -> dict[str, Any]:
    """Protect a whole file as one window; writes OUT and OUT.meta.json (what analysts need)."""
    df = read_table(src, as_text=True)
    records = records_from_frame(df, policy, src)
    if not records:
        raise InputDataError(f"{src}: no data rows")
    k = policy.microaggregation.k
    if policy.k_claim and len(records) < k:  # before anything is written
        raise InputDataError(
            f"{src}: {len(records)} data rows, fewer than k = {k}: no group of k can be "
            f"formed; protect at least {k} rows (or lower microaggregation.k)"
        )
    recoding = policy.microaggregation.algorithm is MicroaggAlgorithm.RECODE_SUPPRESS
    engine = Engine(
        recode_suppress.engine_policy(policy) if policy.grouped_by_file else policy,
        randomness=SeededSource(seed),
        frequencies=_frequencies(records, policy),
        consistency_override=True,  # one release of a file: nothing to average over
    )
    result = engine.protect_window(records, now=0.0, flush_all=True)
    columns = [n for n, a in policy.attributes.items() if a.method is not Method.DROP]
    progress = Progress(len(result.rows), "writing")
    frames = []
    for start, stop in chunks(len(result.rows), 50_000):
        frames.append(pd.DataFrame(list(result.rows[start:stop]), columns=columns))
        progress.update(stop)
    progress.close()
    protected = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    protected = protected[[c for c in columns if c in df.columns]]
    meta = engine.metadata()
    whole_key: dict[str, Any] = {}
    if recoding:  # the keys: recoded and suppressed here, the engine published the rest
        release = recode_suppress.protect_keys(claim_frame(df, policy, published=False), policy)
        for name in release.keys:
            protected[name] = release.published[name].to_numpy()
        whole_key = release.summary()
        whole_key["strict_records_below_k"] = recode_suppress.strict_classes_below_k(
            protected, release.keys, policy.microaggregation.k
        )
        meta["k_claim"] = {**whole_key, "k": policy.microaggregation.k}
    elif policy.grouped_by_file:  # strata and l-diversity: grouped here, the rest by the engine
        spec = policy.microaggregation
        tokens = set(policy.input.missing_tokens)
        strata = [_missing_to_none(df[s].tolist(), tokens) for s in spec.strata or []]
        ldiv = spec.l_diversity
        grouped = file_claim.group_claim(
            claim_frame(df, policy, published=False),
            policy,
            strata,
            protected[ldiv.attribute] if ldiv is not None else None,
        )
        for name in grouped.published.columns:
            protected[name] = grouped.published[name].to_numpy()
        meta["k_claim"] = grouped.report
        whole_key = whole_key_evaluation(df, protected, policy, src, out)
        whole_key["grouping"] = grouped.report
    elif policy.k_claim:
        whole_key = whole_key_evaluation(df, protected, policy, src, out)
    write_table(protected, out)
    meta_path(out).write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    rep = result.report
    return {
        "whole_key": whole_key,
        "frequency_risk": release_risk.release_risk(df, protected, policy),
        "records": rep.records_in,
        "published": rep.published,
        "suppressed": rep.suppressed,
        "groups": rep.groups,
        "min_group_size": rep.min_group_size,
        "measures": dict(rep.measures),
        "retention": dict(rep.retention),
        "policy_version": engine.version,
        "meta": str(meta_path(out)),
    }


def numeric_matrix(df: pd.DataFrame, columns: Sequence[str], path: str | Path) -> np.ndarray:
    out = np.empty((len(df), len(columns)))
    for j, c in enumerate(columns):
        if c not in df.columns:
            raise InputDataError(f"{path}: no column '{c}'")
        col = pd.to_numeric(df[c], errors="coerce")
        bad = int((col.isna() & df[c].notna()).sum())
        if bad:
            raise InputDataError(f"{path}: column '{c}' has {bad} non-numeric value(s)")
        out[:, j] = col.to_numpy(dtype=float)
    return out


_NEARLY_NUMERIC = 0.9  # a text column whose values are numbers but for a few: a typo


def _refuse_nearly_numeric(df: pd.DataFrame, path: str | Path) -> None:
    """A numeric column with a typo in one cell reads as text, and "all numeric columns" would
    leave it out, published unchanged: refuse it, naming the column and the row."""
    for c in df.columns:
        if pd.api.types.is_numeric_dtype(df[c]):
            continue
        given = df[c].notna().to_numpy()
        bad = given & pd.to_numeric(df[c], errors="coerce").isna().to_numpy()
        if bad.any() and 1.0 - bad.sum() / given.sum() >= _NEARLY_NUMERIC:
            row = int(np.flatnonzero(bad)[0]) + 1
            raise InputDataError(
                f"{path}: column '{c}' is numeric but for {int(bad.sum())} value(s), first at "
                f"data row {row}; fix them, or list the columns to microaggregate with --columns"
            )


def microaggregate_file(
    src: str | Path,
    out: str | Path,
    *,
    k: int,
    columns: Sequence[str] | None = None,
    algorithm: str = "mdav",
    standardize: bool = True,
    strata: Sequence[str] | None = None,
) -> dict[str, Any]:
    """MDAV (or individual ranking) on the given or all numeric columns, nothing else changed."""
    df = read_table(src)
    if not columns:
        _refuse_nearly_numeric(df, src)
    cols = (
        list(columns)
        if columns
        else [str(c) for c in df.columns if pd.api.types.is_numeric_dtype(df[c])]
    )
    if not cols:
        raise InputDataError(
            f"{src}: no numeric columns to microaggregate; name them with --columns"
        )
    x = numeric_matrix(df, cols, src)
    if not np.isfinite(x).all():
        raise InputDataError(f"{src}: the columns to microaggregate have missing values")
    strata_report: dict[str, Any] = {}
    if strata:  # MDAV within each stratum (sdcMicro's strata_variables); small strata pooled
        for name in strata:
            if name not in df.columns:
                raise InputDataError(f"--strata: no column {name!r} in {src}; fix the name")
        if algorithm != "mdav":
            raise InputDataError("--strata works with --algorithm mdav")
        ids = stratum_ids([df[name].tolist() for name in strata], len(df))
        res = stratified_groups(
            ids, k, lambda rows: mdav_groups(x[rows], k, standardize=standardize)
        )
        labels = res.labels
        masked = group_means(x, labels)
        strata_report = {
            "strata": res.strata,
            "small_strata": res.small_strata,
            "records_in_small_strata": res.records_in_small_strata,
        }
    else:
        masked, labels = microaggregate(x, k, algorithm=algorithm, standardize=standardize)
    result = df.copy()
    for j, c in enumerate(cols):
        result[c] = masked[:, j]
    write_table(result, out)
    lab = labels if labels.ndim == 1 else labels[:, 0]
    sizes = np.bincount(lab)
    return {
        "records": len(df),
        "columns": cols,
        "groups": int(sizes.size),
        "min_group_size": int(sizes.min()),
        "max_group_size": int(sizes.max()),
        "sse_sst_pct": quality.sse_sst_pct(x, masked),
        **({"strata": strata_report} if strata_report else {}),
    }


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
    return [
        str(c)
        for c in orig.columns
        if c in prot.columns
        and pd.api.types.is_numeric_dtype(orig[c])
        and pd.api.types.is_numeric_dtype(prot[c])
    ]


def evaluate_files(
    original: str | Path,
    protected: str | Path,
    policy: Policy | None = None,
    *,
    p_pct: float | None = None,
) -> dict[str, Any]:
    """Information loss and disclosure risk of PROTECTED against ORIGINAL (rows aligned)."""
    orig = read_table(original)
    prot = read_table(protected)
    if len(orig) != len(prot):
        raise InputDataError(
            f"the files have {len(orig)} and {len(prot)} rows; evaluation needs the rows of "
            "both files in the same order"
        )
    cols = _numeric_columns_for(policy, orig, prot)
    if not cols and not (
        policy is not None
        and any(n in orig.columns and n in prot.columns for n in policy.randomized)
    ):
        raise InputDataError(
            f"{original} and {protected} have no numeric column in common to evaluate; check "
            "that both files have the same header (or give the --policy that protected them)"
        )
    pct = p_pct if p_pct is not None else (policy.risk.interval_pct if policy else 10.0)
    result: dict[str, Any] = {"records": len(orig), "columns": cols}
    if cols:
        x = numeric_matrix(orig, cols, original)
        xm = numeric_matrix(prot, cols, protected)
        complete = np.isfinite(x).all(axis=1) & np.isfinite(xm).all(axis=1)
        result["excluded_incomplete_rows"] = int((~complete).sum())
        rep = quality.evaluate_numeric(x[complete], xm[complete], p_pct=pct)
        result.update(rep.to_dict())
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


def _weighted_and_frequency(
    orig: pd.DataFrame, prot: pd.DataFrame, policy: Policy, numeric: Sequence[str]
) -> dict[str, Any]:
    """The frequency risk of the release and, with a weight, the weighted estimates."""
    out: dict[str, Any] = {}
    freq = release_risk.release_risk(orig, prot, policy)
    if freq:
        out["frequency_risk"] = freq
    weight = policy.weight
    if weight is not None and weight in orig.columns and numeric:
        w = weights_of(orig, weight)
        assert w is not None
        out["weighted_estimates"] = release_risk.weighted_estimates(orig, prot, numeric, w)
    return out


def _missing_to_none(values: Sequence[object], tokens: set[str]) -> list[object]:
    return [None if is_missing(v, tokens) else v for v in values]


def claim_frame(df: pd.DataFrame, policy: Policy, *, published: bool) -> pd.DataFrame:
    """The k claim's columns as the partition sees them: numbers as floats, categories as
    text (an original's generalized as the policy says; a published file's already are), a
    missing value as the missing category where it is one, else None."""
    tokens = set(policy.input.missing_tokens)
    out: dict[str, list[object]] = {}
    for name in policy.k_claim:
        attr = policy.attributes[name]
        values = _missing_to_none(df[name].tolist(), tokens)
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
    sens_o = pd.DataFrame({n: _missing_to_none(orig[n].tolist(), tokens) for n in sensitive})
    sens_p = pd.DataFrame({n: _missing_to_none(prot[n].tolist(), tokens) for n in sensitive})
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


def policy_report(policy: Policy, data: str | Path | None = None) -> dict[str, Any]:
    """What the policy guarantees, per attribute. With ``data``, fine-grain mechanisms
    without rr.weights are built from its value frequencies, as ``protect_file`` builds them."""
    freqs: dict[str, dict[str, float]] = {}
    if data is not None:
        freqs = _frequencies(
            records_from_frame(read_table(data, as_text=True), policy, data), policy
        )
    attrs: dict[str, Any] = {}
    claim = policy.k_claim
    kinds = {c.name: c.kind.value for c in claim_columns(policy)}
    for name, attr in policy.attributes.items():
        entry: dict[str, Any] = {
            "role": attr.role.value,
            "type": attr.type.value,
            "method": attr.method.value,
        }
        if attr.method is Method.RANDOMIZED_RESPONSE:
            mech = from_spec(attr, freqs.get(name))
            entry.update(_mechanism_report(mech))
            assert attr.rr is not None
            if attr.rr.mode in (RRMode.FINE_GRAIN, RRMode.INVARIANT) and attr.rr.weights is None:
                entry["note"] = (
                    f"no rr.weights: the matrix of {data}'s value frequencies, as `privgw "
                    "protect` builds it for that file"
                    if name in freqs
                    else "no rr.weights: equal weights, the matrix `privgw run` uses; `privgw "
                    "protect` weighs by the input's value frequencies (see it with --data FILE) "
                    "and publishes that matrix in OUT.meta.json"
                )
        elif name in claim:
            entry["k"] = policy.microaggregation.k
            entry["algorithm"] = policy.microaggregation.algorithm.value
            entry["kind"] = kinds[name]
            if attr.method is Method.GENERALIZE:
                entry["note"] = "generalized, then microaggregated at the generalized level"
        elif attr.method is Method.NOISE:
            assert attr.noise is not None
            entry["noise"] = attr.noise.model_dump(mode="json", exclude_none=True)
            if attr.coding is not None:
                entry["coding"] = attr.coding.model_dump(mode="json", exclude_none=True)
        if attr.round_to is not None:
            entry["round_to"] = attr.round_to
        if attr.unprotected:
            entry["k"] = None
            entry["note"] = "unprotected: published outside the k claim"
        attrs[name] = entry
    return {
        "policy": policy.name,
        "version": policy.version,
        "k": policy.microaggregation.k,
        "quasi_identifiers": [
            n for n, a in policy.attributes.items() if a.role.value == "quasi_identifier"
        ],
        # every published tuple of these, together, is shared by >= k respondents over the
        # whole publication history; the unprotected ones are outside that claim
        "k_claim": claim,
        "unprotected_quasi_identifiers": policy.unprotected_quasi_identifiers,
        # published beside the claim (role other): outside it, whatever their method
        "published_outside_k_claim": policy.published_outside_claim,
        "consistency": policy.consistency.mode.value,
        "republication": republication_statement(policy),
        "attributes": attrs,
    }


def _mechanism_report(mech: RRMechanism) -> dict[str, Any]:
    return {
        "categories": list(mech.categories),
        "matrix": np.asarray(mech.matrix).round(6).tolist(),
        "retention": np.asarray(mech.retention).round(6).tolist(),
        "gamma": mech.gamma,
        "epsilon": mech.epsilon,
        "rho2_for_rho1": {str(r): mech.rho2_for(r) for r in RHO1_GRID},
    }


def reconstruct_file(protected: str | Path, policy: Policy) -> dict[str, Any]:
    df = read_table(protected)
    mp = meta_path(protected)
    if mp.exists():
        try:
            meta = orjson.loads(mp.read_bytes())
        except (OSError, orjson.JSONDecodeError) as err:
            meta = err
        if not isinstance(meta, dict):
            raise InputDataError(
                f"{mp} is not the JSON object `privgw protect` writes ({meta.__class__.__name__}):"
                " restore it, or protect the data again to write it anew"
            )
        if meta.get("policy_version") != policy.version:
            raise InputDataError(
                f"{mp} was written under policy version {meta.get('policy_version')}, not "
                f"{policy.version}; reconstruct with the policy that protected the file"
            )
        mechanisms = mechanisms_from_meta(meta)
    else:
        mechanisms = {}
        for name in policy.randomized:
            attr = policy.attributes[name]
            assert attr.rr is not None
            if attr.rr.mode in (RRMode.FINE_GRAIN, RRMode.INVARIANT) and attr.rr.weights is None:
                raise InputDataError(
                    f"{mp} is missing and '{name}' uses fine-grain weights from the data: the "
                    "matrix is only in that file"
                )
            mechanisms[name] = from_spec(attr)
    return reconstruct_rows(frame_rows(df), mechanisms)


def frame_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts with None for missing cells."""
    clean = df.astype(object).where(df.notna(), None)
    return [{str(k): v for k, v in row.items()} for row in clean.to_dict(orient="records")]


def read_jsonl_rows(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows.extend(frame_rows(read_table(path)))
    return rows


def attack_history(
    history: Sequence[Mapping[str, Any]],
    truth: Sequence[Mapping[str, Any]],
    *,
    attribute: str | None,
    qi_columns: Sequence[str],
    k: int,
    ts: Sequence[int],
) -> dict[str, Any]:
    """Run both adversaries on a publication history (rows with record_id and wave).

    ``truth`` rows carry record_id, respondent_id and the true values: the simulator's
    ground truth, linking each published record to its respondent.
    """
    respondent_of = {str(t["record_id"]): str(t["respondent_id"]) for t in truth}
    waves: dict[Any, list[Mapping[str, Any]]] = {}
    for row in history:
        waves.setdefault(row.get("wave"), []).append(row)
    order = sorted(waves, key=lambda w: (w is None, w))
    result: dict[str, Any] = {"releases": len(order), "records": len(history)}
    if attribute is not None:
        true_value: dict[str, Any] = {}
        for t in truth:
            true_value[str(t["respondent_id"])] = t.get(attribute)
        releases = [
            {
                respondent_of[str(r["record_id"])]: r.get(attribute)
                for r in waves[w]
                if str(r["record_id"]) in respondent_of
            }
            for w in order
        ]
        ts_ok = [t for t in ts if t <= len(releases)]
        result["averaging"] = [
            {
                "T": p.releases,
                "respondents": p.respondents,
                "accuracy": p.accuracy,
                "ci95": [p.ci_low, p.ci_high],
            }
            for p in averaging_attack(releases, true_value, ts_ok)
        ]
    if qi_columns:
        qi_releases = []
        for w in order:
            rel: dict[str, Any] = {}
            for r in waves[w]:
                rid = respondent_of.get(str(r["record_id"]))
                if rid is None:
                    continue
                tup = tuple(r.get(c) for c in qi_columns)
                rel[rid] = None if any(v is None for v in tup) else tup
            qi_releases.append(rel)
        inter = intersection_attack(qi_releases, k)
        dist = inter.distribution(k)
        result["intersection"] = {
            "k": k,
            "respondents": inter.respondents,
            "below_k": inter.below_k,
            "share_below_k": dist["share_below_k"],
            "singled_out": int(dist["singled_out"]),
            "median": dist["median"],
            "smallest_candidate_sets": inter.smallest,
        }
    return result
