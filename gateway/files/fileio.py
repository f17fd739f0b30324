"""Reading and writing microdata files (CSV, JSON Lines) with errors that name the column and
the row, never the value."""

from __future__ import annotations

import csv
import io
import os
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from gateway.engine.records import ValidRecord
from gateway.errors import InputDataError
from gateway.measures.numeric_input import MAX_ABS
from gateway.mechanisms import masking
from gateway.policy import AttrType, ExtraFields, Policy
from gateway.validation import has_duplicate_key

JSONL_SUFFIXES = {".jsonl", ".ndjson", ".json"}


def is_jsonl(path: str | Path) -> bool:
    return Path(path).suffix.lower() in JSONL_SUFFIXES


def read_table(
    path: str | Path, *, as_text: bool = False, policy: Policy | None = None
) -> pd.DataFrame:
    """Read CSV (comma-separated, header row) or JSON Lines. ``as_text`` keeps every cell as
    a string (the policy decides types); otherwise pandas infers numeric columns, except a
    CSV's columns that ``policy`` makes categorical, kept as text (an empty cell missing):
    categories coded 1..9 with one cell missing would read as 3.0."""
    p = _existing(path)
    try:
        if is_jsonl(p):
            df = pd.DataFrame(list(_jsonl_objects(p)))
            if as_text:
                df = df.astype(object).where(df.notna(), None)
            return df
        _check_csv_shape(p)
        if as_text:
            return pd.read_csv(p, dtype=str, keep_default_na=False, na_filter=False)
        return pd.read_csv(p, dtype=dict.fromkeys(_text_columns(policy), str))
    except InputDataError:
        raise
    except UnicodeDecodeError:
        raise InputDataError(f"{p}: not UTF-8 text") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, csv.Error) as err:
        raise _csv_error(p, err) from None


def _text_columns(policy: Policy | None) -> list[str]:
    """The attributes whose values are labels, not numbers (categories and timestamps)."""
    attributes = policy.attributes.items() if policy is not None else ()
    return [n for n, a in attributes if a.type is not AttrType.NUMERIC]


def _jsonl_objects(p: Path) -> Iterator[dict[str, Any]]:
    """The objects of a JSON Lines file, one a line (blank lines skipped), each checked."""
    with p.open("rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                raise InputDataError(
                    f"{p}: line {lineno} is not valid JSON (one object per line expected)"
                ) from None
            if not isinstance(obj, dict):
                raise InputDataError(f"{p}: line {lineno} is not a JSON object")
            if has_duplicate_key(line, obj):  # orjson would keep the last silently
                raise InputDataError(
                    f"{p}: line {lineno} names a field twice; give each field once"
                )
            yield obj


def _csv_error(p: Path, err: Exception) -> InputDataError:
    """What was wrong with a CSV, said without quoting the parser's message (which may hold a
    cell's value): the two common cases by name, else the parser's error class."""
    if isinstance(err, pd.errors.EmptyDataError):
        return InputDataError(f"{p}: empty (no header row)")
    if "field larger than field limit" in str(err):
        return InputDataError(
            f"{p}: a field is longer than {csv.field_size_limit():,} characters; "
            "is it the right file, with the right quoting?"
        )
    return InputDataError(f"{p}: cannot parse as CSV ({err.__class__.__name__})")


def count_rows(path: str | Path) -> int:
    """The data rows of a table, its shape checked as :func:`read_table` does, without
    holding it: a CSV's rows, a JSON Lines file's non-blank lines."""
    p = _existing(path)
    try:
        if is_jsonl(p):
            with p.open("rb") as fh:
                return sum(1 for line in fh if line.strip())
        return _check_csv_shape(p)
    except UnicodeDecodeError:
        raise InputDataError(f"{p}: not UTF-8 text") from None
    except csv.Error as err:
        raise _csv_error(p, err) from None


def iter_table(path: str | Path, policy: Policy, rows: int) -> Iterator[tuple[int, pd.DataFrame]]:
    """The table in chunks of ``rows`` rows as text (as ``read_table(as_text=True)``), with
    only the policy's columns, each with the number of data rows before it. The columns are
    checked against the policy first (:func:`check_columns`)."""
    p = _existing(path)
    keep = set(policy.attributes) | {policy.input.respondent_id}
    try:
        if is_jsonl(p):
            done = 0
            batch: list[dict[str, Any]] = []
            for obj in _jsonl_objects(p):
                batch.append(obj)
                if len(batch) == rows:
                    yield done, _text_chunk(batch, policy, p, keep)
                    done += len(batch)
                    batch = []
            if batch:
                yield done, _text_chunk(batch, policy, p, keep)
            return
        header = pd.read_csv(p, dtype=str, nrows=0)
        check_columns(header, policy, p)
        done = 0
        with pd.read_csv(  # closed when the caller stops early (an error in a chunk)
            p,
            dtype=str,
            keep_default_na=False,
            na_filter=False,
            chunksize=rows,
            usecols=[c for c in header.columns if c in keep],
        ) as reader:
            for chunk in reader:
                yield done, chunk.reset_index(drop=True)
                done += len(chunk)
    except UnicodeDecodeError:
        raise InputDataError(f"{p}: not UTF-8 text") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, csv.Error) as err:
        raise _csv_error(p, err) from None


def _text_chunk(
    objs: list[dict[str, Any]], policy: Policy, p: Path, keep: set[str | None]
) -> pd.DataFrame:
    df = pd.DataFrame(objs)
    check_columns(df, policy, p)
    df = df[[c for c in df.columns if c in keep]]
    return df.astype(object).where(df.notna(), None)


def _existing(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise InputDataError(f"input file not found: {p}")
    if p.is_dir():
        raise InputDataError(f"input is a directory, not a file: {p}")
    return p


TABLE_SUFFIXES = frozenset({".csv", *JSONL_SUFFIXES})
PICTURE_SUFFIXES = frozenset({".png", ".svg", ".pdf"})


def check_output(
    out: str | Path,
    *,
    suffixes: frozenset[str] = TABLE_SUFFIXES,
    inputs: tuple[str | Path, ...] = (),
    setting: str = "-o",
    companions: tuple[str | Path, ...] = (),
) -> Path:
    """Refuse, before any work, an output the command cannot write or must not write: a
    suffix it does not produce, a directory, a place without write access, or an input file
    (also under another name: a symlink, a relative path, ``missing/../input.csv``), which
    would be overwritten. ``companions``: the other files the command writes beside it
    (``OUT.meta.json``), checked against the inputs alike."""
    p = Path(out)
    kinds = ", ".join(sorted(suffixes))
    if p.suffix.lower() not in suffixes:
        raise InputDataError(f"{setting} {p}: the file name must end in one of {kinds}")
    if p.is_dir():
        raise InputDataError(f"{setting} {p} is a directory; give a file name ending in {kinds}")
    check_not_an_input((p, *map(Path, companions)), inputs, setting=setting)
    parent = p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        blocker = next((a for a in (parent, *parent.parents) if a.exists()), None)
        why = (
            f"{blocker} is a file, not a directory"
            if blocker is not None and not blocker.is_dir()
            else f"cannot create its directory ({err.__class__.__name__})"
        )
        raise InputDataError(f"{setting} {p}: {why}; choose a writable place") from None
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise InputDataError(
            f"{setting} {p}: no permission to write there; choose a writable place"
        )
    return p


def check_not_an_input(
    outputs: tuple[Path, ...], inputs: tuple[str | Path, ...], *, setting: str = "-o"
) -> None:
    """Refuse outputs that are an input file or one another: the same path once every symlink
    and ``..`` is resolved (also through directories that do not exist yet), or the same file
    by device and inode (a hard link, a bind mount: ``os.path.samefile``)."""
    real_inputs: dict[_FileKey, str] = {}
    for src in inputs:
        real_inputs.update(dict.fromkeys(_file_keys(src), str(src)))
    seen: dict[_FileKey, Path] = {}
    for target in outputs:
        keys = _file_keys(target)
        if (hit := next((k for k in keys if k in real_inputs), None)) is not None:
            raise InputDataError(
                f"{setting} {outputs[0]}: {target} is the input file {real_inputs[hit]} "
                "(resolved, symlinks and hard links followed): it would be overwritten; write "
                "the output to another file"
            )
        if (hit := next((k for k in keys if k in seen), None)) is not None:
            raise InputDataError(
                f"{setting} {outputs[0]}: {target} and {seen[hit]} are the same file; choose "
                "another output name"
            )
        seen.update(dict.fromkeys(keys, target))


_FileKey = str | tuple[int, int]


def _file_keys(path: str | Path) -> tuple[_FileKey, ...]:
    """What identifies a file: its resolved path, and its (device, inode) when it exists."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return (real,)
    return (real, (st.st_dev, st.st_ino))


def _check_csv_shape(p: Path) -> int:
    """Refuse a header naming a column twice (pandas would rename it ``age.1``) and rows with
    fewer or more cells than the header (pandas fills short rows with empty cells); return
    the number of data rows."""
    with p.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            return 0  # empty file: pandas says so
        twice = sorted(c for c, n in Counter(header).items() if n > 1)
        if twice:
            raise InputDataError(
                f"{p}: the header names column(s) twice: {', '.join(twice)}; give each column once"
            )
        width = len(header)
        rows = 0
        for row in reader:
            rows += bool(row)
            if row and len(row) != width:
                what = "fewer" if len(row) < width else "more"
                raise InputDataError(
                    f"{p}: line {reader.line_num} has {what} cells ({len(row)}) than the header "
                    f"({width}); fix that row (quote cells that contain commas)"
                )
    return rows


def write_table(df: pd.DataFrame, path: str | Path) -> None:
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if is_jsonl(p):
            with p.open("wb") as fh:
                for row in df.to_dict(orient="records"):
                    clean = {k: _json_value(v) for k, v in row.items()}
                    fh.write(orjson.dumps(clean) + b"\n")
        else:
            df.to_csv(p, index=False)
    except OSError as err:  # a full disk, a vanished directory: after the checks up front
        raise InputDataError(
            f"-o {p}: cannot write it ({err.__class__.__name__}); check the place and free space"
        ) from None


def _json_value(v: Any) -> Any:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v


def _delimiter_hint(columns: list[str]) -> str:
    if len(columns) == 1 and any(sep in columns[0] for sep in (";", "\t", "|")):
        return " The header has one column: is the file separated by something else than ','?"
    return ""


def check_columns(df: pd.DataFrame, policy: Policy, path: str | Path) -> None:
    cols = [str(c) for c in df.columns]
    missing = [n for n, a in policy.attributes.items() if a.required and n not in df.columns]
    if missing:
        raise InputDataError(
            f"{path}: the policy names column(s) the file lacks: {', '.join(missing)}."
            + _delimiter_hint(cols)
        )
    known = set(policy.attributes) | {policy.input.respondent_id}
    extra = [c for c in cols if c not in known]
    if extra and policy.input.extra_fields is ExtraFields.ERROR:
        raise InputDataError(
            f"{path}: column(s) not in the policy: {', '.join(extra)}; add them to the "
            "policy's attributes or set input.extra_fields: ignore"
        )


def records_from_frame(
    df: pd.DataFrame, policy: Policy, path: str | Path, *, first_row: int = 0
) -> list[ValidRecord]:
    """Typed, validated records. Errors name the column, the problem and the first row
    (``first_row``: the data rows before ``df`` in the file, when it is a chunk)."""
    check_columns(df, policy, path)
    missing_tokens = set(policy.input.missing_tokens)
    n = len(df)
    columns: dict[str, list[object]] = {}
    for name, attr in policy.attributes.items():
        if name not in df.columns:
            continue
        raw = ["" if v is None else str(v) for v in df[name].tolist()]
        is_missing = [v in missing_tokens for v in raw]
        if attr.type is AttrType.NUMERIC:
            nums = pd.to_numeric(
                pd.Series(raw, dtype=object).where(~pd.Series(is_missing)), errors="coerce"
            )
            missing = np.array(is_missing, dtype=bool)
            bad = np.flatnonzero(~missing & nums.isna().to_numpy()).tolist()  # not per-row iloc
            if bad:
                raise InputDataError(
                    f"{path}: column '{name}' is numeric in the policy but has {len(bad)} "
                    f"non-numeric value(s), first at data row {first_row + bad[0] + 1}"
                )
            arr = nums.to_numpy(dtype=float)
            check_magnitude(arr, name, path, first_row)
            lo, hi = policy.numeric_range(name)
            if lo is not None and hi is not None:
                out = np.flatnonzero((arr < lo) | (arr > hi))
                if out.size:
                    raise InputDataError(
                        f"{path}: column '{name}' has {out.size} value(s) outside the policy's "
                        f"range [{lo:.15g}, {hi:.15g}], first at data row "
                        f"{first_row + int(out[0]) + 1}"
                    )
            if policy.whole_number(name):
                out = np.flatnonzero(~missing & (arr != np.floor(arr)))
                if out.size:
                    raise InputDataError(
                        f"{path}: column '{name}' is the wave number but has {out.size} "
                        "value(s) that are not whole numbers, first at data row "
                        f"{first_row + int(out[0]) + 1}"
                    )
            columns[name] = [
                None if is_missing[i] else _int_if_whole(float(arr[i])) for i in range(n)
            ]
        else:
            if attr.categories is not None:
                allowed = set(attr.categories)
                bad = [i for i in range(n) if not is_missing[i] and raw[i] not in allowed]
                if bad:
                    raise InputDataError(
                        f"{path}: column '{name}' has {len(bad)} value(s) outside the policy's "
                        f"categories, first at data row {first_row + bad[0] + 1}; add the "
                        "category or fix the data"
                    )
            if attr.type is AttrType.TIMESTAMP:
                _check_timestamps(path, name, raw, is_missing, first_row)
            columns[name] = [None if is_missing[i] else raw[i] for i in range(n)]
    rid = policy.input.respondent_id
    ids = (
        [str(v) for v in df[rid].tolist()] if rid is not None and rid in df.columns else [None] * n
    )
    names = list(columns)
    return [
        ValidRecord(
            respondent_id=ids[i],
            values={name: columns[name][i] for name in names},
            source=None,
            arrived_at=0.0,
        )
        for i in range(n)
    ]


def _check_timestamps(
    path: str | Path, name: str, raw: list[str], is_missing: list[bool], first_row: int = 0
) -> None:
    """Every present value of timestamp column ``name`` is one the gateway accepts; else the
    first fault, with its count and first data row (never the value)."""
    faults = [
        (i, fault)
        for i, text in enumerate(raw)
        if not is_missing[i] and (fault := masking.timestamp_fault(text)) is not None
    ]
    for kind in masking.TimestampFault:
        rows = [i for i, fault in faults if fault is kind]
        if rows:
            raise InputDataError(
                f"{path}: column '{name}' is a timestamp in the policy but has {len(rows)} "
                f"value(s) {kind.value}, first at data row {first_row + rows[0] + 1}"
            )


def _int_if_whole(v: float) -> int | float:
    return int(v) if v.is_integer() and abs(v) < 2**53 else v


class Progress:
    """A one-line progress bar on stderr, shown only for large inputs on a terminal."""

    def __init__(self, total: int, label: str, *, threshold: int = 100_000) -> None:
        self.total = total
        self.label = label
        self.enabled = total >= threshold
        self._out: io.TextIOBase | Any = sys.stderr

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        width = 30
        filled = int(width * done / max(self.total, 1))
        self._out.write(
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total}"
        )
        self._out.flush()

    def close(self) -> None:
        if self.enabled:
            self._out.write("\n")
            self._out.flush()


def chunks(n: int, size: int) -> Iterator[tuple[int, int]]:
    for start in range(0, n, size):
        yield start, min(n, start + size)


def numeric_matrix(df: pd.DataFrame, columns: Sequence[str], path: str | Path) -> np.ndarray:
    """The named columns as floats; a missing column or a non-numeric cell is an error naming
    the column."""
    out = np.empty((len(df), len(columns)))
    for j, c in enumerate(columns):
        if c not in df.columns:
            raise InputDataError(f"{path}: no column '{c}'")
        col = numbers_of(df[c])
        bad = int((col.isna() & df[c].notna()).sum())
        if bad:
            raise InputDataError(f"{path}: column '{c}' has {bad} non-numeric value(s)")
        out[:, j] = col.to_numpy(dtype=float)
        check_magnitude(out[:, j], c, path)
    return out


def is_number_column(column: pd.Series) -> bool:
    """Numbers by type (JSON's true and false are not)."""
    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def numbers_of(column: pd.Series) -> pd.Series:
    """A column's numbers; NaN where missing or not a number (JSON's true/false are not)."""
    if pd.api.types.is_bool_dtype(column):
        return pd.Series(np.nan, index=column.index)
    out = pd.to_numeric(column, errors="coerce")
    if column.dtype == object:
        out[column.map(type).isin((bool, np.bool_)).to_numpy()] = np.nan
    return out


def check_magnitude(values: np.ndarray, name: str, path: str | Path, first_row: int = 0) -> None:
    """±inf, and magnitudes whose squares overflow, are errors naming the column and the first
    row (NaN, a missing value, passes)."""
    checks = (
        (np.isinf(values), "infinite value(s)", "drop them"),
        (np.abs(values) > MAX_ABS, f"value(s) beyond ±{MAX_ABS:g}", "rescale the attribute"),
    )
    for bad, what, fix in checks:
        rows = np.flatnonzero(bad)  # NaN (missing) compares False
        if rows.size:
            raise InputDataError(
                f"{path}: column '{name}' has {rows.size} {what}, first at data row "
                f"{first_row + int(rows[0]) + 1}; {fix}"
            )
