"""The key-space partition protect runs whole-key MDAV in beyond its memory budget: every row
in exactly one block, every block within its bounds, rows of one key in one block, and
categorical strata kept whole where they are large enough to be blocks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InputDataError
from gateway.grouping.key_blocks import BlockBounds, key_blocks


@st.composite
def keyed_rows(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, BlockBounds]:
    n = draw(st.integers(1, 3000))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n_cat = draw(st.integers(0, 3))
    n_num = draw(st.integers(0, 3))
    levels = [draw(st.integers(1, 8)) for _ in range(n_cat)]
    # skewed categories (a rare value or two) and numbers with ties and missing values
    codes = np.column_stack(
        [rng.zipf(1.6, n) % m for m in levels] or [np.zeros((n, 0), dtype=np.int64)]
    ).reshape(n, n_cat)
    x = np.round(rng.normal(size=(n, n_num)) * draw(st.sampled_from([1, 3, 50])))
    x[rng.random((n, n_num)) < draw(st.sampled_from([0.0, 0.05]))] = np.nan
    max_rows = draw(st.integers(16, 1200))
    min_rows = draw(st.integers(1, max_rows // 2))
    return codes, x, BlockBounds(max_rows=max_rows, min_rows=min_rows)


def _key_of(codes: np.ndarray, x: np.ndarray, i: int) -> tuple[object, ...]:
    return (*codes[i].tolist(), *(np.nan_to_num(x[i], nan=-1e300)).tolist())


@settings(max_examples=80, deadline=None)
@given(keyed_rows())
def test_blocks_partition_the_rows_within_their_bounds(
    case: tuple[np.ndarray, np.ndarray, BlockBounds],
) -> None:
    codes, x, bounds = case
    blocks = key_blocks(codes, x, bounds)
    n = codes.shape[0]
    assert blocks.shape == (n,)  # every row in exactly one block
    sizes = np.bincount(blocks)
    assert (sizes > 0).all()  # blocks numbered 0.. without gaps
    assert sizes.max() <= bounds.max_rows
    if n >= bounds.min_rows:
        assert sizes.min() >= bounds.min_rows


@settings(max_examples=60, deadline=None)
@given(keyed_rows())
def test_rows_of_one_key_share_a_block_unless_the_key_alone_overflows(
    case: tuple[np.ndarray, np.ndarray, BlockBounds],
) -> None:
    codes, x, bounds = case
    blocks = key_blocks(codes, x, bounds)
    seen: dict[tuple[object, ...], set[int]] = {}
    counts: dict[tuple[object, ...], int] = {}
    for i in range(codes.shape[0]):
        key = _key_of(codes, x, i)
        seen.setdefault(key, set()).add(int(blocks[i]))
        counts[key] = counts.get(key, 0) + 1
    for key, where in seen.items():
        # a key is cut only when its rows alone leave no cut between keys within the bounds
        assert len(where) == 1 or counts[key] > bounds.max_rows - 2 * bounds.min_rows


def test_large_categorical_strata_are_blocks_of_their_own() -> None:
    rng = np.random.default_rng(1)
    codes = np.repeat([0, 1, 2], [900, 700, 40])[:, None]  # two large strata and a rare one
    x = rng.normal(size=(codes.shape[0], 2))
    blocks = key_blocks(codes, x, BlockBounds(max_rows=1000, min_rows=200))
    first = set(blocks[codes[:, 0] == 0].tolist())
    rest = set(blocks[codes[:, 0] != 0].tolist())
    assert len(first) == 1 and len(rest) == 1 and first != rest
    # the rare value is pooled with the smallest large stratum, not left as a tiny block
    assert sorted(np.bincount(blocks).tolist()) == [740, 900]


def test_numeric_splits_cut_the_widest_standardized_column() -> None:
    rng = np.random.default_rng(2)
    x = np.column_stack([rng.normal(size=4000), 100 * rng.uniform(size=4000)])
    blocks = key_blocks(np.zeros((4000, 0), dtype=np.int32), x, BlockBounds(2500, 500))
    assert np.bincount(blocks).tolist() == [2000, 2000]
    # standardized, the normal column spans ~7 of its sds, the uniform one √12 ≈ 3.5: the
    # split is on the normal column, at its median
    low = x[blocks == blocks[np.argmin(x[:, 0])], 0]
    assert low.max() <= np.median(x[:, 0])


def test_ties_in_every_column_cut_between_keys() -> None:
    # neither median cut leaves 100 rows a side in either column: the rows go in key order
    a = np.repeat([1.0, 2.0, 2.0, 2.0, 3.0], [50, 50, 1000, 50, 50])
    b = np.repeat([1.0, 0.0, 1.0, 2.0, 1.0], [50, 50, 1000, 50, 50])
    x = np.column_stack([a, b])
    blocks = key_blocks(np.zeros((1200, 0), dtype=np.int32), x, BlockBounds(1000, 100))
    assert sorted(np.bincount(blocks).tolist()) == [100, 100, 1000]
    keys = a * 10 + b
    assert all(len(set(blocks[keys == v].tolist())) == 1 for v in np.unique(keys))


def test_bounds_that_cannot_hold_are_refused_with_the_fix() -> None:
    with pytest.raises(InputDataError, match="raise the block size"):
        BlockBounds(max_rows=100, min_rows=60)
