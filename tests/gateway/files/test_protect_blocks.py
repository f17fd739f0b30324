"""``privgw protect`` beyond its memory budget: the file protected block by block over a
partition of its key space, the output assembled in the input's order, and the file's figures
merged from the blocks' (real files, the shipped Adult policy)."""

from __future__ import annotations

import functools
import io
from pathlib import Path

import clikit
import numpy as np
import orjson
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InputDataError
from gateway.files.block_figures import SquareSums, merge_figures
from gateway.files.protect_blocks import interleave, protect_blocks
from gateway.grouping.key_blocks import BlockBounds
from gateway.measures import quality
from gateway.policy import load_policy

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT.parent / "shared" / "data"
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"
NUMERIC = ["age", "education_num", "hours_per_week"]
KEY = [*NUMERIC, "sex", "race", "marital_status", "relationship", "workclass", "native_country"]


privgw = functools.partial(clikit.privgw, check=True)  # a failed command fails the test


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("adult") / "adult.csv"
    adult = pd.read_csv(DATA / "adult.csv", dtype=str, keep_default_na=False)
    adult.head(6000).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def runs(sample: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sample protected as one window and in blocks of at most 2,000 rows."""
    out = tmp_path_factory.mktemp("out")
    privgw("protect", sample, "--policy", POLICY, "-o", out / "whole.csv", "--seed", "1")
    blocked = privgw(
        "protect", sample, "--policy", POLICY, "-o", out / "blocks.csv", "--seed", "1",
        "--block-rows", "2000",
    )  # fmt: skip
    assert " blocks of " in blocked.stdout
    return {"whole": out / "whole.csv", "blocks": out / "blocks.csv"}


def test_blocked_output_has_the_unblocked_rows_and_columns_in_order(
    sample: Path, runs: dict[str, Path]
) -> None:
    orig = pd.read_csv(sample, dtype=str, keep_default_na=False)
    whole = pd.read_csv(runs["whole"], dtype=str, keep_default_na=False)
    blocks = pd.read_csv(runs["blocks"], dtype=str, keep_default_na=False)
    assert list(blocks.columns) == list(whole.columns)
    assert len(blocks) == len(whole) == len(orig)
    # row i is record i's: its categories its own as often as in the one-window run, its
    # published age near its own
    for name in ("sex", "race", "workclass"):
        kept = {run: (df[name] == orig[name]).mean() for run, df in (("w", whole), ("b", blocks))}
        assert kept["b"] >= kept["w"] - 0.05
    near = {
        run: ((df["age"].astype(float) - orig["age"].astype(float)).abs() <= 5).mean()
        for run, df in (("w", whole), ("b", blocks))
    }
    assert near["b"] >= near["w"] - 0.05 and near["b"] > 0.7  # shuffled rows: about 0.3
    assert Path(str(runs["blocks"]) + ".meta.json").exists()


def test_blocks_refine_their_groups_and_the_metadata_says_so(runs: dict[str, Path]) -> None:
    meta = {run: orjson.loads(Path(f"{path}.meta.json").read_bytes()) for run, path in runs.items()}
    assert meta["blocks"]["refine"] is True
    assert "refine" not in meta["whole"]  # the policy leaves it unset: plain MDAV
    # unset means refined blocks: the same policy, so analysts reconstruct with it
    assert meta["blocks"]["policy_version"] == meta["whole"]["policy_version"]
    # docs/files.md: a block's release metadata, whose matrices are the file's; the blocks
    # are in the summary only
    assert "blocks" not in meta["blocks"]
    assert meta["blocks"]["randomized_response"] == meta["whole"]["randomized_response"]
    out = privgw("reconstruct", runs["blocks"], "--policy", POLICY).stdout
    assert "occupation" in out


def test_blocked_output_has_no_class_below_k(runs: dict[str, Path]) -> None:
    blocks = pd.read_csv(runs["blocks"], dtype=str, keep_default_na=False)
    assert blocks.groupby(KEY)[KEY[0]].size().min() >= 5


def test_blocked_sse_sst_is_close_to_the_whole_file(sample: Path, runs: dict[str, Path]) -> None:
    x = pd.read_csv(sample)[NUMERIC].to_numpy(dtype=float)
    loss = {
        name: quality.sse_sst_pct(x, pd.read_csv(path)[NUMERIC].to_numpy(dtype=float))
        for name, path in runs.items()
    }
    # blocks of 500..2,000 rows: MDAV's groups nearly as tight as over 6,000 (at 260,488 rows
    # and blocks of ~39,000 the bench measures the ratio against the 1.10)
    assert loss["blocks"] <= 1.2 * loss["whole"]


def test_blocked_runs_with_a_seed_are_reproducible_and_errors_name_the_file_row(
    sample: Path, tmp_path: Path
) -> None:
    policy = load_policy(POLICY)
    bounds = BlockBounds(max_rows=1200, min_rows=300)
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    for out in (a, b):
        protect_blocks(sample, policy, out, seed=3, bounds=bounds, chunk_rows=700)
    assert a.read_bytes() == b.read_bytes()
    bad = pd.read_csv(sample, dtype=str, keep_default_na=False)
    bad.loc[4321, "age"] = "old"
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(InputDataError, match="first at data row 4322"):
        protect_blocks(tmp_path / "bad.csv", policy, tmp_path / "c.csv", seed=3, bounds=bounds)


def test_blocked_jsonl_output_keeps_the_input_order(sample: Path, tmp_path: Path) -> None:
    policy = load_policy(POLICY)
    out = tmp_path / "out.jsonl"
    s = protect_blocks(sample, policy, out, seed=1, bounds=BlockBounds(2000, 500), chunk_rows=1000)
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    orig = pd.read_csv(sample, dtype=str, keep_default_na=False)
    assert len(rows) == len(orig) == s["records"] == s["published"]
    assert np.mean([r["sex"] == o for r, o in zip(rows, orig["sex"], strict=True)]) > 0.9
    assert s["blocks"]["blocks"] >= 3 and s["min_group_size"] >= 5


@pytest.mark.parametrize(
    ("flag", "value", "setting"),
    [("--block-rows", "20", "--block-rows"), ("--memory-budget", "100", "--memory-budget")],
)
def test_a_budget_too_small_names_the_setting_and_the_fix(
    sample: Path, tmp_path: Path, flag: str, value: str, setting: str
) -> None:
    proc = privgw(
        "protect", sample, "--policy", POLICY, "-o", tmp_path / "o.csv", flag, value,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert setting in proc.stderr and "raise" in proc.stderr


def test_the_output_is_written_a_chunk_at_a_time() -> None:
    """Interleaving reads each block's lines only as far as the chunk being written needs."""
    rng = np.random.default_rng(5)
    blocks = rng.integers(0, 4, 1000)
    sources = [
        io.BytesIO(b"".join(f"{i}\n".encode() for i in np.flatnonzero(blocks == b)))
        for b in range(4)
    ]
    pieces = interleave(blocks, sources, 100)
    first = next(pieces)
    assert first.splitlines() == [str(i).encode() for i in range(100)]
    assert sum(s.tell() for s in sources) == len(first)  # nothing read beyond the chunk
    rest = b"".join(pieces).splitlines()
    assert rest == [str(i).encode() for i in range(100, 1000)]


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.integers(2, 60), min_size=1, max_size=6))
def test_sse_sst_from_block_sums_is_the_whole_file_figure(seed: int, sizes: list[int]) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(sum(sizes), 3)) * [1.0, 10.0, 100.0] + [0.0, 50.0, -3.0]
    masked = x + rng.normal(size=x.shape)
    masked[rng.random(len(x)) < 0.1, 1] = np.nan  # suppressed cells are left out
    sums = SquareSums()
    for part in np.split(np.arange(len(x)), np.cumsum(sizes)[:-1]):
        sums.add(x[part], masked[part])
    expected = quality.sse_sst_pct(x, masked)  # NaN below 2 complete rows, alike
    # SST from sums (Σx² - (Σx)²/n) cancels digits the direct form keeps: with two rows far
    # from zero the two differ by ~1e-9 relative (seed 340632), so 1e-6 leaves room, not slack
    assert sums.sse_sst_pct() == pytest.approx(expected, rel=1e-6, nan_ok=True)


def test_block_figures_merge_by_what_they_count() -> None:
    a = {"records": 10, "smallest_class": 5, "share_below_k": 0.0, "standard_error": 0.3}
    b = {"records": 30, "smallest_class": 7, "share_below_k": 0.4, "standard_error": 0.1}
    merged = merge_figures([(10, {"m": a, "k": 5}), (30, {"m": b, "k": 5})])
    assert merged["k"] == 5
    assert merged["m"]["records"] == 40 and merged["m"]["smallest_class"] == 5
    assert merged["m"]["share_below_k"] == pytest.approx(0.3)
    assert merged["m"]["standard_error"] == pytest.approx(np.hypot(3.0, 3.0) / 40)
