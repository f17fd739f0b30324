"""Local suppression to k-anonymity (privgw kanon) against sdcMicro 5.8.1's kAnon.

sdcMicro's figure is computed here by a port of its published heuristic (``suppSubset`` in
``R/localSuppression.R``, the default ``kAnon`` of 5.8.x), checked against the figure
sdcMicro publishes for it: ``tests/testthat/test_localSuppression.R`` expects 97 new
suppressions for ``localSuppression(testdata2[, keys], keyVars = 1:7)`` (k = 2)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cli import main
from gateway.measures.frequency_risk import MISSING, key_codes
from gateway.mechanisms.local_suppression import suppress_to_k

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
KEYS = ["urbrur", "roof", "walls", "water", "electcon", "relat", "sex"]


def _matches(codes: np.ndarray) -> np.ndarray:
    """Brute force: for each row, the rows equal to it wherever both have a value."""
    out = np.zeros(len(codes))
    for i, r in enumerate(codes):
        out[i] = ((codes == r) | (codes == MISSING) | (r == MISSING)).all(axis=1).sum()
    return out


def sdcmicro_kanon_cells(frame: pd.DataFrame, keys: list[str], k: int) -> int:
    """Cells sdcMicro 5.8.1's kAnon(k) suppresses (default importance, no NA before)."""
    x = frame[keys].reset_index(drop=True)
    p = len(keys)
    cats = [x[c].nunique() for c in keys]  # importance: fewer categories = more important
    ranked = sorted(range(p), key=lambda j: (cats[j], j))
    importance = [0] * p
    for rank, j in enumerate(ranked, 1):
        importance[j] = rank
    # of each key with more than k records only the first k (in key order) take part
    ordered = x.sort_values(keys, kind="mergesort")
    first_k = ordered.groupby(keys, sort=False).cumcount().to_numpy() < k
    keep = np.sort(ordered.index[first_k].to_numpy())
    mat = np.stack([pd.factorize(x[c])[0] for c in keys], 1)[keep].astype(np.int64)
    least_important_first = sorted(range(p), key=lambda j: -importance[j])
    while True:
        fk = _matches(mat)
        if (fk >= k).all():
            return int((mat == MISSING).sum())
        # one sweep over the violating records, highest risk (1/fk) first, counts not updated
        for i in [i for i in np.argsort(fk, kind="stable") if fk[i] < k]:
            row = mat[i]
            dist = ((mat != row) & (mat != MISSING) & (row != MISSING)).sum(axis=1)
            positive = dist[dist > 0]
            nearest = np.flatnonzero(dist == (min(p, positive.min()) if positive.size else p))
            for j in least_important_first:
                if nearest.size == 1 and nearest[0] == i:
                    differs = mat[nearest, j] != MISSING
                else:
                    differs = (row[j] != MISSING) & (mat[nearest, j] != row[j])
                    differs &= mat[nearest, j] != MISSING
                if differs.any():
                    mat[i, j] = MISSING
                    break


def _data(name: str) -> pd.DataFrame:
    path = DATA / name
    if not path.exists():
        pytest.skip(f"reference data not found: {path}")
    return pd.read_csv(path)


def test_the_port_reproduces_sdcmicros_published_figure() -> None:
    assert sdcmicro_kanon_cells(_data("testdata2.csv"), KEYS, 2) == 97


@pytest.mark.parametrize(("name", "k"), [("testdata.csv", 3), ("testdata.csv", 2),
                                          ("testdata2.csv", 2)])  # fmt: skip
def test_k_anonymous_with_no_more_cells_than_sdcmicro(name: str, k: int) -> None:
    frame = _data(name)
    codes = key_codes(frame, KEYS)
    start = time.perf_counter()
    result = suppress_to_k(codes, k)
    seconds = time.perf_counter() - start
    assert _matches(result.codes).min() >= k  # 0 records in classes < k
    theirs = sdcmicro_kanon_cells(frame, KEYS, k)
    print(f"{name} k={k}: privgw {result.cells} cells in {seconds:.3f} s, sdcMicro {theirs}")
    assert result.cells <= theirs
    assert seconds < 1.0
    kept = ~result.suppressed
    assert (result.codes[kept] == codes[kept]).all()  # nothing but suppression


@settings(max_examples=80, deadline=None)
@given(
    st.integers(2, 4),
    st.integers(1, 4).flatmap(
        lambda p: st.lists(st.tuples(*[st.integers(0, 3)] * p), min_size=4, max_size=30)
    ),
)
def test_every_record_matches_k_records_afterwards(k: int, rows) -> None:
    codes = np.array(rows, dtype=np.int64)
    if len(codes) < k:
        return
    result = suppress_to_k(codes, k)
    assert _matches(result.codes).min() >= k
    np.testing.assert_array_equal(_matches(result.codes), result.fk)
    assert ((result.codes == codes) | result.suppressed).all()


def test_importance_keeps_the_important_key(tmp_path: Path) -> None:
    frame = _data("testdata.csv")
    codes = key_codes(frame, KEYS)
    # relat most important, urbrur least: relat is suppressed no more than by default
    imp = [7, 2, 3, 4, 5, 1, 6]
    ranked = suppress_to_k(codes, 3, imp)
    default = suppress_to_k(codes, 3)
    assert ranked.per_key(KEYS)["relat"] < default.per_key(KEYS)["relat"]
    assert _matches(ranked.codes).min() >= 3


def test_kanon_command_writes_empty_cells_and_counts(tmp_path: Path, capsys) -> None:
    src, out = DATA / "testdata.csv", tmp_path / "k3.csv"
    _data("testdata.csv")
    assert main(["kanon", str(src), "--keys", ",".join(KEYS), "--k", "3", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    frame, published = pd.read_csv(src), pd.read_csv(out)
    assert list(published.columns) == list(frame.columns)
    missing = published[KEYS].isna()
    assert f"{int(missing.to_numpy().sum())} cells suppressed" in text
    for name in KEYS:
        assert f"{name} (importance" in text and f"{int(missing[name].sum())} suppressed" in text
    others = [c for c in frame.columns if c not in KEYS]
    pd.testing.assert_frame_equal(published[others], frame[others])
    assert main(["kanon", str(src), "--keys", "urbrur,sex", "--k", "3", "--importance",
                 "1,1", "-o", str(out)]) == 2  # fmt: skip
    assert "--importance must rank" in capsys.readouterr().err
