"""The file workflow of ``privgw risk`` (sdcMicro's ``measure_risk`` and ``suda2`` on a file)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from gateway.errors import InputDataError
from gateway.files.fileio import read_table, write_table
from gateway.measures.frequency_risk import FrequencyRisk, Int, key_codes, measure_risk
from gateway.measures.suda import Suda, suda2


def sdcmicro_values(frame: pd.DataFrame, keys: Sequence[str]) -> Int:
    """The key values as sdcMicro's C++ code sees them: a numeric column's values truncated to
    integers, any other column's values by rank among its sorted distinct values from 1 (an R
    factor's level numbers); missing values are replaced later."""
    out = np.zeros((len(frame), len(keys)), dtype=np.int64)
    for j, name in enumerate(keys):
        col = frame[name]
        if pd.api.types.is_numeric_dtype(col):
            out[:, j] = np.trunc(col.fillna(0).to_numpy(dtype=np.float64)).astype(np.int64)
        else:
            text = col.astype(str)
            levels = {v: i + 1 for i, v in enumerate(sorted(set(text[col.notna()])))}
            out[:, j] = [levels.get(v, 0) for v in text]
    return out


def file_risk(
    frame: pd.DataFrame,
    keys: Sequence[str],
    *,
    weight: str | None = None,
    k: int = 3,
    max_msu: int | None = None,
    dis_fraction: float = 0.01,
) -> tuple[FrequencyRisk, Suda, dict[str, Any]]:
    """Frequency risk and SUDA of ``frame`` on ``keys``, and the global figures as a dict."""
    freq = measure_risk(frame, keys, weight)
    codes = key_codes(frame, keys)
    suda = suda2(
        codes,
        max_msu=max_msu,
        dis_fraction=dis_fraction,
        raw_values=sdcmicro_values(frame, keys),
    )
    summary = freq.to_dict(k)
    summary["suda2"] = suda.to_dict()
    return freq, suda, summary


def per_record(freq: FrequencyRisk, suda: Suda) -> pd.DataFrame:
    """One row per input record, in input order: fk, Fk, risk, suda2_score, suda2_dis."""
    return pd.DataFrame(
        {
            "fk": freq.fk,
            "Fk": freq.pop_fk,
            "risk": freq.risk,
            "suda2_score": suda.score,
            "suda2_dis": suda.dis,
        }
    )


def as_missing(frame: pd.DataFrame, keys: Sequence[str], tokens: Sequence[str]) -> pd.DataFrame:
    """``frame`` with the key cells that read one of ``tokens`` (e.g. Adult's "?") missing; a
    key column numeric but for them becomes numeric."""
    if not tokens:
        return frame
    frame = frame.copy()
    for name in (c for c in keys if c in frame.columns):
        column = frame[name].astype(object)
        column = column.where(~column.astype(str).isin(list(tokens)), None)
        try:
            frame[name] = pd.to_numeric(column)
        except (ValueError, TypeError):
            frame[name] = column
    return frame


@dataclass(frozen=True)
class KeySet:
    """A subset of the keys whose risk is reported beside the full key's."""

    keys: tuple[str, ...]
    left_out: str | None = None  # --by-variable: the key left out

    @property
    def label(self) -> str:
        return f"without {self.left_out}" if self.left_out else "+".join(self.keys)


def key_sets(
    keys: Sequence[str], *, by_variable: bool, combinations: Sequence[Sequence[str]]
) -> list[KeySet]:
    """Each key left out in turn (``by_variable``), then the chosen ``combinations``."""
    sets: list[KeySet] = []
    if by_variable:
        if len(keys) < 2:
            raise InputDataError("--by-variable needs at least 2 --keys: one is left out at a time")
        sets += [KeySet(tuple(c for c in keys if c != name), name) for name in keys]
    for combo in combinations:
        if not set(combo) <= set(keys):
            raise InputDataError(
                f"--combinations: {'+'.join(combo)} names a column not in --keys; each "
                "combination is a subset of --keys, joined by + (e.g. roof+sex)"
            )
        sets.append(KeySet(tuple(combo)))
    return sets


_CHANGED = ("sample_uniques", "expected_reidentifications", "global_risk_pct")


def change(reduced: dict[str, Any], full: dict[str, Any]) -> dict[str, Any]:
    """Figures of a reduced key minus those of the full key (negative: less risk)."""
    out: dict[str, Any] = {name: reduced[name] - full[name] for name in _CHANGED}
    out["k_anonymity_violations"] = {
        kk: v - full["k_anonymity_violations"][kk]
        for kk, v in reduced["k_anonymity_violations"].items()
    }
    return out


def risk_file(
    src: str | Path,
    keys: Sequence[str],
    *,
    weight: str | None = None,
    out: str | Path | None = None,
    k: int = 3,
    max_msu: int | None = None,
    dis_fraction: float = 0.01,
    sets: Sequence[KeySet] = (),
    missing: Sequence[str] = (),
) -> dict[str, Any]:
    """``privgw risk``: the global figures, and with ``out`` the per-record table. With
    ``sets``: ``{"full": …, "by_variable": […], "combinations": […]}``, each entry the figures
    of its key set as without them (a left-out key's with ``left_out`` and its ``change``),
    and the per-record table gains each set's columns, suffixed ``[label]``."""
    frame = as_missing(read_table(src), keys, missing)
    if frame.empty:
        raise InputDataError(f"{src}: no data rows, no key to count")

    def run(names: Sequence[str], msu: int | None) -> tuple[pd.DataFrame, dict[str, Any]]:
        freq, suda, summary = file_risk(
            frame, names, weight=weight, k=k, max_msu=msu, dis_fraction=dis_fraction
        )
        return per_record(freq, suda), summary

    table, summary = run(keys, max_msu)  # a --max-msu beyond the keys is refused here
    if sets:
        result: dict[str, Any] = {"full": summary, "by_variable": [], "combinations": []}
        for ks in sets:
            part, figures = run(ks.keys, None if max_msu is None else min(max_msu, len(ks.keys)))
            table = table.join(part.add_suffix(f"[{ks.label}]"))
            if ks.left_out is not None:
                figures = {"left_out": ks.left_out, **figures, "change": change(figures, summary)}
                result["by_variable"].append(figures)
            else:
                result["combinations"].append(figures)
        summary = result
    if out is not None:
        write_table(table, out)
    return summary


def kanon_file(
    src: str | Path,
    keys: Sequence[str],
    *,
    k: int,
    out: str | Path,
    importance: Sequence[int] | None = None,
    strata: Sequence[str] | None = None,
    missing: Sequence[str] = (),
) -> dict[str, Any]:
    """``privgw kanon``: local suppression of ``keys`` to k (missing matches anything, and so
    does a key cell reading one of ``missing``), within each stratum of ``strata`` (sdcMicro's
    ``strataVars``); the file is written with the suppressed cells empty, every other cell as
    read."""
    import time  # noqa: PLC0415

    from gateway.grouping.strata import stratum_ids  # noqa: PLC0415
    from gateway.mechanisms.local_suppression import default_importance, suppress_to_k  # noqa: PLC0415

    frame = read_table(src, as_text=True)
    frame = frame.where(frame != "", None)
    codes = key_codes(as_missing(frame, keys, missing), keys)
    ids = None
    for name in strata or ():
        if name not in frame.columns:
            raise InputDataError(f"--strata: no column {name!r} in the file; fix the name")
        if name in keys:
            raise InputDataError(f"--strata {name!r} is also a key; a stratum is never a key")
    if strata:
        ids = stratum_ids([frame[name].tolist() for name in strata], len(frame))
    fk_before = _matches_within(codes, ids)
    start = time.perf_counter()
    result = suppress_to_k(codes, k, importance, strata=ids)
    seconds = time.perf_counter() - start
    published = frame.copy()
    for j, name in enumerate(keys):
        column = published[name].astype(object)
        column[result.suppressed[:, j]] = None
        published[name] = column
    write_table(published, out)
    return {
        "records": len(frame),
        "keys": list(keys),
        "k": k,
        "importance": list(importance) if importance is not None else default_importance(codes),
        "strata": list(strata or []),
        "strata_count": int(ids.max()) + 1 if ids is not None and ids.size else 1,
        "violations_before": int((fk_before < k).sum()),
        "violations_after": int((result.fk < k).sum()),
        "suppressed_cells": result.cells,
        "suppressed_records": result.records,
        "suppressed_per_key": result.per_key(keys),
        "seconds": seconds,
    }


def _matches_within(codes: Int, strata: Int | None) -> NDArray[np.float64]:
    """fk of every record, counted within its stratum."""
    from gateway.measures.frequency_risk import sample_frequencies  # noqa: PLC0415

    if strata is None:
        return sample_frequencies(codes)[0]
    fk = np.zeros(len(codes))
    for s in np.unique(strata):
        rows = np.flatnonzero(strata == s)
        fk[rows] = sample_frequencies(codes[rows])[0]
    return fk
