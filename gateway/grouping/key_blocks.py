"""A partition of a file's key space into blocks that each fit a memory budget, so whole-key
MDAV can run block by block (``privgw protect`` on files larger than the budget).

Exact categorical strata first: a set of rows too large for one block is split by the
categorical column whose values divide it most evenly (values too rare for a block of their
own pooled, a pool too small merged into the smallest part). A set no categorical column
divides is split at the median of its widest numeric column (standardized by the file's
spread), ``≤ median`` on one side, so rows with the same key always share a block. Every
block holds between ``min_rows`` and ``max_rows`` rows (a file smaller than ``min_rows`` is
one block): large enough that MDAV's groups inside it are as tight as over the whole file."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gateway.errors import InputDataError


@dataclass(frozen=True)
class BlockBounds:
    """The rows a block may hold: at most ``max_rows``; at least ``min_rows`` unless the
    whole file is smaller. ``min_rows`` ≤ ``max_rows`` / 2, so a median split can honour
    both."""

    max_rows: int
    min_rows: int

    def __post_init__(self) -> None:
        if self.min_rows < 1 or 2 * self.min_rows > self.max_rows:
            raise InputDataError(
                f"block bounds: min_rows {self.min_rows} must be ≥ 1 and ≤ half of max_rows "
                f"{self.max_rows}; raise the block size"
            )


def key_blocks(
    codes: NDArray[np.integer], x: NDArray[np.floating], bounds: BlockBounds
) -> NDArray[np.int32]:
    """Block number (0, 1, ...) of each row. ``codes``: n × c categorical codes (the
    categorical quasi-identifiers; missing as a code of its own); ``x``: n × d numeric
    quasi-identifiers (NaN for missing)."""
    n = codes.shape[0] if codes.ndim == 2 else x.shape[0]
    codes = codes.reshape(n, -1)
    x = np.asarray(x, dtype=np.float64).reshape(n, -1)
    scale = _spread(x)
    out = np.empty(n, dtype=np.int32)
    todo = [np.arange(n)]
    block = 0
    while todo:
        rows = todo.pop()
        if rows.size <= bounds.max_rows:
            out[rows] = block
            block += 1
            continue
        parts = _categorical_split(codes[rows], bounds.min_rows)
        if parts is None:
            parts = _numeric_split(x[rows], scale, bounds.min_rows)
        if parts is None:
            parts = _key_order_split(codes[rows], x[rows], bounds.min_rows)
        todo.extend(rows[p] for p in reversed(parts))
    return out


def _spread(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each column's standard deviation over its present values (1 where none or constant)."""
    present = ~np.isnan(x)
    n = present.sum(axis=0)
    filled = np.where(present, x, 0.0)
    mean = filled.sum(axis=0) / np.maximum(n, 1)
    var = (np.where(present, x - mean, 0.0) ** 2).sum(axis=0) / np.maximum(n, 1)
    sd = np.sqrt(var)
    return np.where(sd > 0, sd, 1.0)


def _categorical_split(codes: NDArray[np.integer], min_rows: int) -> list[NDArray[np.intp]] | None:
    """The most even split of the rows by one categorical column's values (rare values
    pooled): the one whose largest part is smallest; None if no column divides them."""
    best: list[NDArray[np.intp]] | None = None
    for j in range(codes.shape[1]):
        values, inverse, counts = np.unique(codes[:, j], return_inverse=True, return_counts=True)
        if values.size < 2:
            continue
        big = np.flatnonzero(counts >= min_rows)
        labels = np.full(values.size, -1)
        labels[big] = np.arange(big.size)
        pooled = int(counts[labels < 0].sum())
        parts_n = big.size
        if pooled >= min_rows:
            labels[labels < 0] = parts_n
            parts_n += 1
        elif pooled and big.size:  # too few for a block: into the smallest part
            labels[labels < 0] = int(np.argmin(counts[big]))
        if parts_n < 2:
            continue
        row_label = labels[inverse.reshape(-1)]
        parts = [np.flatnonzero(row_label == p) for p in range(parts_n)]
        if best is None or max(map(len, parts)) < max(map(len, best)):
            best = parts
    return best


def _numeric_split(
    x: NDArray[np.float64], scale: NDArray[np.float64], min_rows: int
) -> list[NDArray[np.intp]] | None:
    """Two halves at the median of the widest standardized column (``≤`` one side, ``<``
    if ties make that side too large); None if no column splits within the bounds."""
    n = x.shape[0]
    missing = np.isnan(x)
    filled = np.where(missing, -np.inf, x)  # missing values: with the low side
    hi, lo = (
        filled.max(axis=0, initial=-np.inf),
        np.where(missing, np.inf, x).min(axis=0, initial=np.inf),
    )
    width = np.where(hi > lo, (hi - lo) / scale, 0.0)
    for j in np.argsort(-width, kind="stable"):
        col = filled[:, j]
        med = np.median(col)
        for low in (col <= med, col < med):
            left = int(low.sum())
            if min(left, n - left) >= min_rows:
                return [np.flatnonzero(low), np.flatnonzero(~low)]
    return None


def _key_order_split(
    codes: NDArray[np.integer], x: NDArray[np.float64], min_rows: int
) -> list[NDArray[np.intp]]:
    """Ties in every column: the rows in key order, cut at the key boundary nearest the
    middle that leaves ``min_rows`` a side (in the middle if one key fills the range)."""
    n = codes.shape[0]
    filled = np.where(np.isnan(x), -np.inf, x)
    order = np.lexsort([*filled.T, *codes.T]) if codes.shape[1] + x.shape[1] else np.arange(n)
    keys = np.column_stack([codes[order].astype(np.float64), filled[order]])
    boundary = np.flatnonzero((keys[1:] != keys[:-1]).any(axis=1)) + 1  # first row of a key
    fits = boundary[(boundary >= min_rows) & (boundary <= n - min_rows)]
    cut = int(fits[np.argmin(np.abs(fits - n // 2))]) if fits.size else n // 2
    return [np.sort(order[:cut]), np.sort(order[cut:])]
