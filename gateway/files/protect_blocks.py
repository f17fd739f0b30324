"""``privgw protect`` within a memory budget: a file larger than one block is read in chunks
(the policy's columns only), partitioned by its key into blocks
(:mod:`gateway.grouping.key_blocks`), spilled block by block to a temporary directory, and
protected block by block through the same engine as a whole file, with MDAV's groups refined
(:func:`block_policy`); each block's output is written as it is protected, and the blocks'
outputs are interleaved back into the input's row order in bounded chunks. Memory follows the
block, not the file (docs/files.md).

Each block is one window, as a whole file is: whole-key MDAV within it, randomized response
with the file's value frequencies (counted over every chunk), noise, recoding. With a seed
each block draws from its own stream derived from (seed, block), so a run is reproducible."""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson
import pandas as pd

from gateway.errors import InputDataError
from gateway.files.block_figures import SquareSums, merge_figures
from gateway.files.evaluate import claim_frame, whole_key_evaluation
from gateway.files.fileio import (
    JSONL_SUFFIXES,
    Progress,
    count_rows,
    iter_table,
    records_from_frame,
    write_table,
)
from gateway.files.protect import (
    meta_path,
    protect_file,
    run_engine,
    shares,
    value_counts,
)
from gateway.grouping.key_blocks import BlockBounds, key_blocks
from gateway.keyed.randomness import SeededSource
from gateway.measures import release_risk
from gateway.policy import AttrType, MicroaggAlgorithm, Policy

#: the default --memory-budget (MiB): a block's rows are what fits in it
DEFAULT_BUDGET_MIB = 1024
#: the interpreter, the engine's tables and the chunk buffers (MiB)
_BASE_MIB = 256
#: one window's protect holds ~14 KiB a record (issue 44); the rest is margin
_KIB_PER_ROW = 20
#: rows read (and written) at a time
CHUNK_ROWS = 50_000


@dataclass(frozen=True)
class Budget:
    """What ``privgw protect`` may hold: ``memory_mib`` (--memory-budget), or a block size
    given directly (--block-rows) that overrides it."""

    memory_mib: int = DEFAULT_BUDGET_MIB
    block_rows: int | None = None

    def bounds(self, k: int) -> BlockBounds:
        """The block sizes: at most the budget's rows, at least a quarter of them."""
        least = 8 * k  # a quarter of it is 2k: MDAV's groups still have neighbours
        if self.block_rows is not None:
            if self.block_rows < least:
                raise InputDataError(
                    f"--block-rows {self.block_rows}: below {least} (8·k, k = {k}), too few "
                    f"for MDAV in a block; raise --block-rows (or leave it out)"
                )
            rows = self.block_rows
        else:
            floor = _BASE_MIB + 64
            if self.memory_mib < floor:
                raise InputDataError(
                    f"--memory-budget {self.memory_mib}: below the {floor} MiB protect needs "
                    f"for the interpreter and a block; raise --memory-budget"
                )
            rows = max(least, (self.memory_mib - _BASE_MIB) * 1024 // _KIB_PER_ROW)
        return BlockBounds(max_rows=rows, min_rows=max(rows // 4, 1))


def protect_within(
    src: str | Path,
    policy: Policy,
    out: str | Path,
    *,
    seed: int | None = None,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """Protect ``src`` as one window when it fits one block (:func:`protect_file`), else
    block by block (:func:`protect_blocks`)."""
    bounds = (budget or Budget()).bounds(policy.microaggregation.k)
    if count_rows(src) <= bounds.max_rows:
        return protect_file(src, policy, out, seed=seed)
    return protect_blocks(src, policy, out, seed=seed, bounds=bounds)


@dataclass(frozen=True)
class Scan:
    """The first pass over a file: its rows, the value counts randomized response weighs
    with, and each row's block."""

    rows: int
    counts: dict[str, dict[str, float]]
    blocks: np.ndarray


def protect_blocks(
    src: str | Path,
    policy: Policy,
    out: str | Path,
    *,
    seed: int | None,
    bounds: BlockBounds,
    temp_dir: str | Path | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> dict[str, Any]:
    """Protect ``src`` block by block (see the module docstring); the summary has the keys of
    :func:`protect_file`'s, the file's figures merged from the blocks', and ``blocks``."""
    _refuse_file_grouping(policy, bounds)
    version = policy.version  # an unset refine means refined blocks: the same policy
    policy = block_policy(policy)
    scan = scan_file(src, policy, bounds, chunk_rows)
    count = int(scan.blocks.max()) + 1
    with tempfile.TemporaryDirectory(prefix="privgw-blocks-", dir=temp_dir) as tmp:
        spill = Path(tmp)
        route(src, policy, scan.blocks, spill, chunk_rows)
        jsonl = Path(out).suffix.lower() in JSONL_SUFFIXES
        frequencies = shares(scan.counts)
        sums = SquareSums()
        figures: list[tuple[int, dict[str, Any]]] = []
        block_sds: list[dict[str, float]] = []
        meta: dict[str, object] = {}
        columns: list[str] = []
        progress = Progress(scan.rows, "protecting blocks")
        done = 0
        for b in range(count):
            frame = pd.concat(list(_load(spill / f"{b}.pkl")), ignore_index=True)
            (spill / f"{b}.pkl").unlink()
            fig, meta, columns = _protect_block(
                frame, policy, src, rng=_block_seed(seed, b), frequencies=frequencies, sums=sums
            )
            _write_block(fig.pop("protected"), spill / f"{b}.out", jsonl=jsonl)
            block_sds.append({"rows": len(frame), **fig.pop("noise_sd_applied")})
            figures.append((len(frame), fig))
            done += len(frame)
            progress.update(done)
        progress.close()
        _assemble(out, columns, scan.blocks, spill, jsonl=jsonl, chunk_rows=chunk_rows)
    meta["policy_version"] = version
    # each block applies noise at the sd of its own values: a published distribution is a
    # mixture, the blocks' rows and sds its weights and scales
    meta["noise_sd_applied_by_block"] = block_sds
    meta_path(out).write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    summary = merge_figures(figures)
    summary["policy_version"] = version
    summary["measures"]["sse_sst_pct"] = sums.sse_sst_pct()
    sizes = np.bincount(scan.blocks)
    return {
        **summary,
        "records": scan.rows,
        "meta": str(meta_path(out)),
        "blocks": {
            "blocks": count,
            "smallest": int(sizes.min()),
            "largest": int(sizes.max()),
            "max_rows": bounds.max_rows,
            "min_rows": bounds.min_rows,
        },
    }


def block_policy(policy: Policy) -> Policy:
    """The policy a block is protected under: an unset ``microaggregation.refine`` is on,
    since a block's groups lack the neighbours beyond its bounds and the exchanges recover
    more than that costs (docs/files.md). That is what unset means, so the metadata keeps the
    policy's version (``privgw reconstruct`` checks it) and says ``"refine": true``."""
    spec = policy.microaggregation
    if spec.refine is not None or spec.algorithm is not MicroaggAlgorithm.MDAV:
        return policy
    return policy.model_copy(update={"microaggregation": spec.model_copy(update={"refine": True})})


def _refuse_file_grouping(policy: Policy, bounds: BlockBounds) -> None:
    """Recoding, strata and l-diversity group the whole file at once: refuse them beyond
    one block rather than group each block apart."""
    if policy.grouped_by_file or (
        policy.microaggregation.algorithm is MicroaggAlgorithm.RECODE_SUPPRESS
    ):
        raise InputDataError(
            f"the file has more rows than one block ({bounds.max_rows}), and the policy's "
            "microaggregation (recode_suppress, strata or l_diversity) groups a whole file "
            "at once; raise --memory-budget (or --block-rows) above the file's rows"
        )


def scan_file(
    src: str | Path, policy: Policy, bounds: BlockBounds, chunk_rows: int = CHUNK_ROWS
) -> Scan:
    """Read the file once in chunks: validate it (errors name the file's row), count the
    values randomized response weighs with, and keep only the k claim's columns (floats,
    category codes) to partition into blocks."""
    counts: dict[str, dict[str, float]] = {}
    numeric = [n for n in policy.k_claim if policy.attributes[n].type is AttrType.NUMERIC]
    nominal = [n for n in policy.k_claim if n not in numeric]
    labels: dict[str, dict[object, int]] = {n: {} for n in nominal}
    xs: list[np.ndarray] = []
    codes: list[np.ndarray] = []
    rows = 0
    for first, chunk in iter_table(src, policy, chunk_rows):
        records = records_from_frame(chunk, policy, src, first_row=first)
        for name, by_value in value_counts(records, policy).items():
            total = counts.setdefault(name, dict.fromkeys(by_value, 0.0))
            for value, n in by_value.items():
                total[value] += n
        del records
        rows += len(chunk)
        claim = claim_frame(chunk, policy, published=False)
        xs.append(claim[numeric].to_numpy(dtype=np.float32, na_value=np.nan))
        codes.append(
            np.column_stack([_codes(claim[n], labels[n]) for n in nominal])
            if nominal
            else np.zeros((len(chunk), 0), dtype=np.int32)
        )
    if not rows:
        raise InputDataError(f"{src}: no data rows")
    blocks = key_blocks(np.concatenate(codes), np.concatenate(xs), bounds)
    return Scan(rows=rows, counts=counts, blocks=blocks)


def _codes(values: pd.Series, labels: dict[object, int]) -> np.ndarray:
    """Each value's code, a new value taking the next one (missing is a value too)."""
    return np.fromiter(
        (labels.setdefault(v, len(labels)) for v in values), dtype=np.int32, count=len(values)
    )


def route(
    src: str | Path, policy: Policy, blocks: np.ndarray, spill: Path, chunk_rows: int
) -> None:
    """Read the file again and append each chunk's rows to their block's spill file (the
    rows of a block stay in the file's order)."""
    for first, chunk in iter_table(src, policy, chunk_rows):
        ids = blocks[first : first + len(chunk)]
        order = np.argsort(ids, kind="stable")
        present, starts = np.unique(ids[order], return_index=True)
        for b, rows in zip(present, np.split(order, starts[1:]), strict=True):
            with (spill / f"{int(b)}.pkl").open("ab") as fh:
                pickle.dump(chunk.iloc[rows], fh, protocol=pickle.HIGHEST_PROTOCOL)


def _load(path: Path) -> Iterator[pd.DataFrame]:
    """The frames appended to a spill file (written by :func:`route`, in this run)."""
    with path.open("rb") as fh:
        while True:
            try:
                yield pickle.load(fh)  # our own temporary file, written by route()
            except EOFError:
                return


def _block_seed(seed: int | None, block: int) -> np.random.Generator | None:
    if seed is None:
        return None
    return np.random.default_rng(np.random.SeedSequence([seed, block]))


def _protect_block(
    frame: pd.DataFrame,
    policy: Policy,
    src: str | Path,
    *,
    rng: np.random.Generator | None,
    frequencies: dict[str, dict[str, float]],
    sums: SquareSums,
) -> tuple[dict[str, Any], dict[str, object], list[str]]:
    """One block through the engine as one window; its figures, the release metadata and
    the published columns. Its numeric claim's squares are added to ``sums``."""
    records = records_from_frame(frame, policy, src)
    engine, result, protected = run_engine(records, frame, policy, SeededSource(rng), frequencies)
    if len(protected) != len(frame):
        raise InputDataError(f"{src}: a block published {len(protected)} of {len(frame)} rows")
    numeric = [n for n in policy.numeric_claim if n in protected.columns]
    if numeric:  # the file's SSE/SST from the blocks' sums (missing and suppressed left out)
        tokens = list(policy.input.missing_tokens)
        sums.add(
            np.column_stack([_numbers(frame[n], tokens) for n in numeric]),
            np.column_stack([_numbers(protected[n], tokens) for n in numeric]),
        )
    rep = result.report
    fig: dict[str, Any] = {
        "protected": protected,
        "whole_key": whole_key_evaluation(frame, protected, policy, src, "block")
        if policy.k_claim
        else {},
        "frequency_risk": release_risk.release_risk(frame, protected, policy),
        "published": rep.published,
        "groups": rep.groups,
        "min_group_size": rep.min_group_size,
        "suppressed": rep.suppressed,
        "measures": dict(rep.measures),
        "retention": dict(rep.retention),
        "noise_sd_applied": dict(rep.noise_sd),
        "policy_version": engine.version,
    }
    return fig, engine.metadata(), list(protected.columns)


def _numbers(values: pd.Series, tokens: list[str]) -> np.ndarray:
    """A column's numbers, NaN where missing (a missing token, None, empty)."""
    present = values.where(~values.isin(tokens))
    return pd.to_numeric(present, errors="coerce").to_numpy(dtype=np.float64)


def _write_block(protected: pd.DataFrame, path: Path, *, jsonl: bool) -> None:
    """A protected block, one record a line (no header), in the output's format."""
    if jsonl:
        write_table(protected, path.with_suffix(".jsonl"))
        path.with_suffix(".jsonl").rename(path)
    else:
        protected.to_csv(path, index=False, header=False, lineterminator="\n")
    with path.open("rb") as fh:
        lines = sum(1 for _ in fh)
    if lines != len(protected):  # a published cell holds a line break
        raise InputDataError(
            "a published value holds a line break, so blocks cannot be interleaved; "
            "raise --memory-budget (or --block-rows) above the file's rows"
        )


def interleave(blocks: np.ndarray, sources: Sequence[BinaryIO], chunk_rows: int) -> Iterator[bytes]:
    """The blocks' lines back in the input's order (row i is the next line of block
    ``blocks[i]``'s source), ``chunk_rows`` rows at a time."""
    for start in range(0, len(blocks), chunk_rows):
        ids = blocks[start : start + chunk_rows]
        order = np.argsort(ids, kind="stable")
        present, starts = np.unique(ids[order], return_index=True)
        lines = np.empty(len(ids), dtype=object)
        for b, rows in zip(present, np.split(order, starts[1:]), strict=True):
            src = sources[int(b)]
            lines[rows] = [src.readline() for _ in range(len(rows))]
        yield b"".join(lines)


def _assemble(
    out: str | Path,
    columns: list[str],
    blocks: np.ndarray,
    spill: Path,
    *,
    jsonl: bool,
    chunk_rows: int,
) -> None:
    """Write OUT: the header (CSV), then every block's lines in the input's order."""
    handles = [(spill / f"{b}.out").open("rb") for b in range(int(blocks.max()) + 1)]
    try:
        with Path(out).open("wb") as fh:
            if not jsonl:
                fh.write(pd.DataFrame(columns=columns).to_csv(index=False).encode())
            for piece in interleave(blocks, handles, chunk_rows):
                fh.write(piece)
    except OSError as err:
        raise InputDataError(
            f"-o {out}: cannot write it ({err.__class__.__name__}); check the place and free space"
        ) from None
    finally:
        for h in handles:
            h.close()
