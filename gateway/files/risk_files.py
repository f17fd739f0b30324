"""The file workflow of ``privgw risk`` (sdcMicro's ``measure_risk`` and ``suda2`` on a file)."""

from __future__ import annotations

from collections.abc import Sequence
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


def risk_file(
    src: str | Path,
    keys: Sequence[str],
    *,
    weight: str | None = None,
    out: str | Path | None = None,
    k: int = 3,
    max_msu: int | None = None,
    dis_fraction: float = 0.01,
) -> dict[str, Any]:
    """``privgw risk``: the global figures, and with ``out`` the per-record table."""
    frame = read_table(src)
    freq, suda, summary = file_risk(
        frame, keys, weight=weight, k=k, max_msu=max_msu, dis_fraction=dis_fraction
    )
    if out is not None:
        write_table(per_record(freq, suda), out)
    return summary


def kanon_file(
    src: str | Path,
    keys: Sequence[str],
    *,
    k: int,
    out: str | Path,
    importance: Sequence[int] | None = None,
    strata: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``privgw kanon``: local suppression of ``keys`` to k (missing matches anything), within
    each stratum of ``strata`` (sdcMicro's ``strataVars``); the file is written with the
    suppressed cells empty, every other cell as read."""
    import time  # noqa: PLC0415

    from gateway.grouping.strata import stratum_ids  # noqa: PLC0415
    from gateway.mechanisms.local_suppression import default_importance, suppress_to_k  # noqa: PLC0415

    frame = read_table(src, as_text=True)
    frame = frame.where(frame != "", None)
    codes = key_codes(frame, keys)
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
