"""Protecting a file: the engine over the whole file as one window (``privgw protect``), and
MDAV alone on numeric columns (``privgw microaggregate``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from gateway.engine.engine import Engine
from gateway.engine.records import ValidRecord, WindowReport, WindowResult
from gateway.errors import InputDataError
from gateway.files.evaluate import claim_frame, missing_to_none, whole_key_evaluation
from gateway.files.fileio import (
    Progress,
    chunks,
    is_jsonl,
    is_number_column,
    numbers_of,
    numeric_matrix,
    read_table,
    records_from_frame,
    write_table,
)
from gateway.grouping import file_claim, recode_suppress
from gateway.grouping.microaggregation import group_means, mdav_groups, microaggregate
from gateway.grouping.strata import stratified_groups, stratum_ids
from gateway.keyed.randomness import SeededSource
from gateway.measures import quality, release_risk
from gateway.policy import (
    MISSING_LABEL,
    Method,
    MicroaggAlgorithm,
    Policy,
    RRMode,
)

log = logging.getLogger(__name__)


def warn_of_waves(records: Sequence[ValidRecord], policy: Policy) -> None:
    """A file is one release: a class of k may hold fewer than k records of one wave, which
    the published wave column then tells apart. Say so when the file holds several waves (as
    validated: a missing token is no wave, 1 and 1.0 are one)."""
    wave = policy.republication.wave_attribute
    if wave is None or policy.attributes[wave].method is Method.DROP:
        return
    waves = len({r.values.get(wave) for r in records} - {None})
    if waves > 1:
        log.warning(
            "the file holds %d waves (%s) and is protected as one release: k holds over the "
            "file, not within each wave, and the published %s column splits the classes; "
            "protect a panel's waves with --state-dir for k within each wave",
            waves,
            wave,
            wave,
        )


def refuse_repeated_respondents(
    records: Sequence[ValidRecord], policy: Policy, src: str | Path
) -> None:
    """A file is one release: its k counts rows and its draws are made row by row, so a
    respondent in several rows (a panel's waves) would fill its own class and have each answer
    drawn afresh, which averaging undoes. Such a file is protected wave by wave on a state."""
    seen: set[str] = set()
    again = []
    for i, r in enumerate(records):
        if r.respondent_id is not None:
            if r.respondent_id in seen:
                again.append(i)
            seen.add(r.respondent_id)
    if again:
        raise InputDataError(
            f"{src}: {len(again)} row(s) repeat a respondent ('{policy.input.respondent_id}'), "
            f"first at data row {again[0] + 1}: a file is one release, whose k counts rows and "
            "whose randomized answers are drawn row by row. Protect a panel's waves with "
            "--state-dir DIR (each wave a release, as the stream publishes them; the secret "
            "from PRIVGW_SECRET_FILE)"
        )


def meta_path(out: str | Path) -> Path:
    p = Path(out)
    return p.with_name(p.name + ".meta.json")


def read_meta(protected: str | Path) -> dict[str, Any] | None:
    """The OUT.meta.json `protect` wrote beside a protected file (None: there is none)."""
    mp = meta_path(protected)
    if not mp.exists():
        return None
    try:
        meta = orjson.loads(mp.read_bytes())
    except (OSError, orjson.JSONDecodeError) as err:
        meta = err
    if not isinstance(meta, dict):
        raise InputDataError(
            f"{mp} is not the JSON object `privgw protect` writes ({meta.__class__.__name__}):"
            " restore it, or protect the data again to write it anew"
        )
    return meta


def value_frequencies(
    records: Sequence[ValidRecord], policy: Policy
) -> dict[str, dict[str, float]]:
    """Value frequencies for fine-grain weights when the policy gives none (file workflow)."""
    return shares(value_counts(records, policy))


def shares(counts: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each attribute's counts as shares of their total."""
    out: dict[str, dict[str, float]] = {}
    for name, by_value in counts.items():
        total = sum(by_value.values()) or 1.0
        out[name] = {c: n / total for c, n in by_value.items()}
    return out


def value_counts(records: Sequence[ValidRecord], policy: Policy) -> dict[str, dict[str, float]]:
    """The counts :func:`value_frequencies` turns into shares (summed over a file's chunks)."""
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
        out[name] = counts
    return out


def run_engine(
    records: Sequence[ValidRecord],
    df: pd.DataFrame,
    policy: Policy,
    randomness: SeededSource,
    frequencies: dict[str, dict[str, float]],
) -> tuple[Engine, WindowResult, pd.DataFrame]:
    """The engine over ``records`` (the rows of ``df``) as one window: the engine, its
    result, and the published columns in ``df``'s row order."""
    engine = Engine(
        recode_suppress.engine_policy(policy) if policy.grouped_by_file else policy,
        randomness=randomness,
        frequencies=frequencies,
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
    return engine, result, protected[[c for c in columns if c in df.columns]]


def protect_file(
    src: str | Path, policy: Policy, out: str | Path, *, seed: int | None = None
) -> dict[str, Any]:
    """Protect a whole file as one window; writes OUT and OUT.meta.json (what analysts need)."""
    df = read_table(src, as_text=True)
    records = records_from_frame(df, policy, src)
    if not records:
        raise InputDataError(f"{src}: no data rows")
    refuse_repeated_respondents(records, policy, src)
    warn_of_waves(records, policy)
    k = policy.microaggregation.k
    if policy.k_claim and len(records) < k:  # before anything is written
        raise InputDataError(
            f"{src}: {len(records)} data rows, fewer than k = {k}: no group of k can be "
            f"formed; protect at least {k} rows (or lower microaggregation.k)"
        )
    recoding = policy.microaggregation.algorithm is MicroaggAlgorithm.RECODE_SUPPRESS
    engine, result, protected = run_engine(
        records, df, policy, SeededSource(seed), value_frequencies(records, policy)
    )
    meta = engine.metadata(policy)  # the file's policy, not the engine's part of it
    # the sd the window applied: an analyst deconvolving a published distribution needs it
    # (σ² + h²/12 with a rounding step h), and the policy's noise.sd is only its floor
    meta["noise_sd_applied"] = dict(result.report.noise_sd)
    whole_key: dict[str, Any] = {}
    file_groups: dict[str, Any] | None = None  # the groups formed here, not by the engine
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
        strata = [missing_to_none(df[s].tolist(), tokens) for s in spec.strata or []]
        ldiv = spec.l_diversity
        grouped = file_claim.group_claim(
            claim_frame(df, policy, published=False),
            policy,
            strata,
            protected[ldiv.attribute] if ldiv is not None else None,
        )
        for name in grouped.published.columns:
            protected[name] = grouped.published[name].to_numpy()
        meta["k_claim"] = file_groups = grouped.report
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
        **_groups(rep, recoding=recoding, file_groups=file_groups),
        "measures": dict(rep.measures),
        "retention": dict(rep.retention),
        "policy_version": policy.version,
        "meta": str(meta_path(out)),
    }


def _groups(
    rep: WindowReport, *, recoding: bool, file_groups: dict[str, Any] | None
) -> dict[str, Any]:
    """The groups a protected file publishes, its smallest, and the records suppressed."""
    if recoding:  # no groups: cells are suppressed one by one
        return {"groups": None, "min_group_size": None, "suppressed": rep.suppressed}
    if file_groups is not None:  # the engine grouped nothing: the file's groups are these
        return {
            "groups": file_groups["groups"],
            "min_group_size": file_groups["smallest_group"] or None,
            "suppressed": rep.suppressed + file_groups["suppressed_records"],
        }
    return {
        "groups": rep.groups,
        "min_group_size": rep.min_group_size,
        "suppressed": rep.suppressed,
    }


_NEARLY_NUMERIC = 0.9  # a text column whose values are numbers but for a few: a typo


def _refuse_nearly_numeric(df: pd.DataFrame, path: str | Path) -> None:
    """A numeric column with a typo in one cell reads as text, and "all numeric columns" would
    leave it out, published unchanged: refuse it, naming the column and the row."""
    for c in df.columns:
        if is_number_column(df[c]):
            continue
        given = df[c].notna().to_numpy()
        bad = given & numbers_of(df[c]).isna().to_numpy()
        if bad.any() and 1.0 - bad.sum() / given.sum() >= _NEARLY_NUMERIC:
            row = int(np.flatnonzero(bad)[0]) + 1
            raise InputDataError(
                f"{path}: column '{c}' is numeric but for {int(bad.sum())} value(s), first at "
                f"data row {row}; fix them, or list the columns to microaggregate with --columns"
            )
        if given.any() and not bad.any():  # a JSON file's numbers written as strings
            raise InputDataError(
                f"{path}: column '{c}' holds numbers written as text; write them as numbers, "
                "or list the columns to microaggregate with --columns"
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
    cols = list(columns) if columns else [str(c) for c in df.columns if is_number_column(df[c])]
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
    # every other cell as it was written ("00100" stays, "NA" is not made missing)
    result = df.copy() if is_jsonl(src) else read_table(src, as_text=True)
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
