"""The analyst's and the adversary's side on published files: reconstruction of the
randomized attributes (``privgw reconstruct``) and the attacks on a publication history
(``privgw attack``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gateway.errors import InputDataError
from gateway.files.fileio import (
    read_table,
)
from gateway.files.protect import meta_path, read_meta
from gateway.measures.attack import averaging_attack, intersection_attack, sticky_chain_linkage
from gateway.measures.gross_change import estimate_change
from gateway.measures.published import (
    mechanisms_from_meta,
    reconstruct_rows,
)
from gateway.mechanisms.randomized_response import RRMechanism
from gateway.mechanisms.rr_constructions import from_spec
from gateway.policy import (
    Policy,
    RepublicationMode,
    RRMode,
)

PSEUDONYM = "pseudonym"  # the published pseudonym's column (output.pseudonym)


def reconstruct_file(
    protected: str | Path, policy: Policy, *, wave: int | None = None
) -> dict[str, Any]:
    """The randomized attributes' distributions from a protected file; ``wave``: only that
    release's rows (the policy's wave attribute)."""
    df = read_table(protected, policy=policy)
    field = policy.republication.wave_attribute
    if wave is not None:
        if field is None or field not in df.columns:
            raise InputDataError(
                f"--wave {wave}: {protected} has no wave column "
                f"({'the policy names no wave_attribute' if field is None else field}); "
                "reconstruct all its rows without --wave"
            )
        numbers = pd.to_numeric(df[field], errors="coerce")
        mine = numbers == wave
        if not mine.any():
            present = sorted({int(w) for w in numbers.dropna() if float(w).is_integer()})
            raise InputDataError(
                f"--wave {wave}: {protected} has no row of wave {wave} (its waves: "
                f"{', '.join(map(str, present[:20])) or 'none'})"
            )
        df = df[mine]
    mechanisms = file_mechanisms(protected, policy)
    rep = policy.republication
    weight = rep.weight_name if rep.mode is RepublicationMode.PANEL else None
    result = reconstruct_rows(
        frame_rows(df),
        mechanisms,
        weight if weight in df.columns else None,
        wave=field if field in df.columns else None,
    )
    if not result:  # as a topic with none: said, not an empty success
        raise InputDataError(
            f"{protected}: no randomized value to reconstruct from ({len(df)} rows; randomized "
            f"attributes: {', '.join(mechanisms) or 'none'})"
        )
    return result


def file_mechanisms(protected: str | Path, policy: Policy) -> dict[str, RRMechanism]:
    """The randomized attributes' mechanisms a protected file was published with: from its
    OUT.meta.json, else (a matrix the policy fixes) from the policy."""
    mp = meta_path(protected)
    meta = read_meta(protected)
    if meta is not None:
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
            mechanisms[name] = from_spec(attr, name=name)
    return mechanisms


def change_file(protected: str | Path, policy: Policy, waves: tuple[int, int]) -> dict[str, Any]:
    """Gross change of each randomized attribute between two waves of a panel file, its
    records linked by pseudonym (:mod:`gateway.measures.gross_change`), weighted by the later
    wave's analysis weights."""
    df = read_table(protected, policy=policy)
    field = policy.republication.wave_attribute
    if field is None or field not in df.columns or PSEUDONYM not in df.columns:
        raise InputDataError(
            f"--change links each respondent's records of two waves by its pseudonym: "
            f"{protected} needs a wave column and a '{PSEUDONYM}' column (a policy with "
            "output.pseudonym: hmac publishes one; record ids are keyed per wave and link "
            "nothing)"
        )
    numbers = pd.to_numeric(df[field], errors="coerce")
    first, second = (df[numbers == w].drop_duplicates(PSEUDONYM) for w in waves)
    pairs = first.merge(second, on=PSEUDONYM, suffixes=("@1", "@2"))
    weight = f"{policy.republication.weight_name}@2"
    weights = pairs[weight].to_numpy(float) if weight in pairs.columns else None
    out: dict[str, Any] = {}
    for name, mech in file_mechanisms(protected, policy).items():
        if f"{name}@1" not in pairs.columns:
            continue
        index = {c: i for i, c in enumerate(mech.categories)}
        codes = [pairs[f"{name}@{j}"].map(index).fillna(-1).to_numpy(np.int64) for j in (1, 2)]
        out[name] = estimate_change(mech, codes[0], codes[1], weights).to_dict()
    if not out:
        raise InputDataError(f"{protected}: no randomized attribute to estimate a change of")
    return out


def frame_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts with None for missing cells."""
    clean = df.astype(object).where(df.notna(), None)
    return [{str(k): v for k, v in row.items()} for row in clean.to_dict(orient="records")]


def history_meta(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The release metadata `protect` wrote beside a history file (OUT.meta.json: its k and
    microaggregated columns, `attack`'s defaults), the first file's that has one; {} if none."""
    for path in paths:
        meta = read_meta(path)
        if meta is not None:
            return meta
    return {}


def read_jsonl_rows(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows.extend(frame_rows(read_table(path)))
    return rows


def attack_k(given: int | None, meta: Mapping[str, Any]) -> int:
    """``privgw attack --k``, else the metadata's k, else 2."""
    k = given if given is not None else int(meta.get("k", 0)) or 2
    if k < 2:
        raise InputDataError(f"--k must be ≥ 2, got {k}")
    return k


def attack_qi(
    given: str | None, meta: Mapping[str, Any], *, sticky: bool, averaging: bool
) -> list[str]:
    """``privgw attack --qi``, else the metadata's microaggregated columns. The sticky-value
    and intersection intruders need them: without, only the averaging adversary can run."""
    qi = [c for c in (given or "").split(",") if c] or list(meta.get("microaggregated", []))
    if not qi and (sticky or not averaging):
        raise InputDataError(
            "the history names no quasi-identifier columns (no OUT.meta.json beside its first "
            "file): give --qi COL[,COL], the published columns the intruder knows"
        )
    return qi


def release_counts(text: str) -> list[int]:
    """``privgw attack --t``: numbers of releases, whole numbers ≥ 1, comma-separated."""
    try:
        ts = [int(t) for t in text.split(",")]
    except ValueError:
        raise InputDataError(
            f"--t must be whole numbers ≥ 1 separated by commas, got {text!r}"
        ) from None
    if not ts or min(ts) < 1:
        raise InputDataError(f"--t: every number of releases must be ≥ 1, got {text!r}")
    return ts


def check_history(
    history: Sequence[Mapping[str, Any]],
    truth: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
) -> None:
    """What the adversaries read is there: every history row a record_id (with ``truth``),
    every truth row a record_id and a respondent_id, the named ``columns`` in the history with
    single values, and waves that can be ordered (numbers, or text)."""
    needs = (
        ("the history", history, ("record_id",) if truth else ()),
        ("--truth", truth, ("record_id", "respondent_id")),
    )
    for label, rows, fields in needs:
        for i, row in enumerate(rows):
            missing = [f for f in fields if row.get(f) is None]
            if missing:
                raise InputDataError(f"{label}: row {i + 1} has no {missing[0]}")
    seen = set().union(*(row.keys() for row in history)) if history else set()
    for name in columns:
        if name not in seen:
            raise InputDataError(f"no column {name!r} in the history; fix the name")
    for label, rows, names in (
        ("the history's", history, (*columns, "wave", "record_id")),
        ("--truth's", truth, ("record_id", "respondent_id")),
    ):
        for name in names:
            for i, row in enumerate(rows):
                if isinstance(row.get(name), dict | list):
                    raise InputDataError(
                        f"{label} column {name!r} holds a JSON object or array at row {i + 1};"
                        " a cell is a single value"
                    )
    kinds = {isinstance(r.get("wave"), str) for r in history if r.get("wave") is not None}
    if len(kinds) > 1:
        raise InputDataError(
            "the history's waves mix numbers and text; give every wave the same type"
        )


def last_copies(
    history: Sequence[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], int]:
    """One row for each record_id, its last copy (a consumer of the protected topic keeps
    the last copy of each record id: docs/operating.md; a replayed copy is byte-identical),
    in the order of the rows kept; a row without a record_id is kept. And how many rows were
    dropped."""
    last: dict[str, int] = {}
    for i, row in enumerate(history):
        if row.get("record_id") is not None:
            last[str(row["record_id"])] = i
    kept = [
        row
        for i, row in enumerate(history)
        if row.get("record_id") is None or last[str(row["record_id"])] == i
    ]
    return kept, len(history) - len(kept)


def category(value: Any) -> Any:
    """A category as text, however a file codes it: a CSV reads the code 4 as a number, a
    truth file may give it as "4" (compared as they came, they never matched, and the averaging
    adversary scored 0)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    return str(value)


def published_tuple(row: Mapping[str, Any], qi: Sequence[str]) -> tuple[Any, ...] | None:
    """The quasi-identifier tuple an intruder reads in ``row``, None when the record was
    suppressed: the engine publishes a suppressed record with every quasi-identifier null.
    A null among values is a published value: a missing value published as a category of its
    own (``missing: category``) or one cell suppressed by ``recode_suppress``, which the exact
    tuple invariant counts as a value (docs/policy.md)."""
    tup = tuple(row.get(c) for c in qi)
    return None if all(v is None for v in tup) else tup


def attack_history(
    history: Sequence[Mapping[str, Any]],
    truth: Sequence[Mapping[str, Any]],
    *,
    attribute: str | None,
    qi_columns: Sequence[str],
    k: int,
    ts: Sequence[int],
    sticky: Sequence[str] = (),
) -> dict[str, Any]:
    """Run the adversaries on a publication history (rows with record_id and wave).

    ``truth`` rows carry record_id, respondent_id and the true values: the simulator's
    ground truth, linking each published record to its respondent (the averaging and
    intersection adversaries need it). ``sticky``: published sensitive columns the
    participation-aware intruder follows respondents by (:func:`sticky_chain_linkage`, no
    ground truth needed).

    A record published again under its record_id is one record (:func:`last_copies`;
    ``duplicates_dropped``); a null in a quasi-identifier tuple is a published value, and only
    a suppressed record is in no class (:func:`published_tuple`).
    """
    history, dropped = last_copies(history)
    respondent_of = {str(t["record_id"]): str(t["respondent_id"]) for t in truth}
    waves: dict[Any, list[Mapping[str, Any]]] = {}
    for row in history:
        waves.setdefault(row.get("wave"), []).append(row)
    order = sorted(waves, key=lambda w: (w is None, w))
    result: dict[str, Any] = {"releases": len(order), "records": len(history)}
    if dropped:
        result["duplicates_dropped"] = dropped
    if attribute is not None and truth:
        # the adversary averages toward one true value: a respondent whose answer changed has
        # none (its published value changes with it), so it is left out and counted
        answers: dict[str, set[Any]] = {}
        for t in truth:
            answers.setdefault(str(t["respondent_id"]), set()).add(category(t.get(attribute)))
        true_value = {r: next(iter(v)) for r, v in answers.items() if len(v) == 1}
        result["averaging_changed_excluded"] = len(answers) - len(true_value)
        releases = [
            {
                respondent_of[str(r["record_id"])]: category(r.get(attribute))
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
    if qi_columns and sticky:
        chains = sticky_chain_linkage([waves[w] for w in order], sticky, qi_columns, k)
        result["sticky_linkage"] = {
            "k": k,
            "sticky": list(sticky),
            "chains": chains.chains,
            "below_k": chains.below_k,
            "isolated": chains.isolated,
            "smallest_candidate_sets": chains.smallest,
        }
    if qi_columns and truth:
        qi_releases = [
            {
                respondent_of[str(r["record_id"])]: published_tuple(r, qi_columns)
                for r in waves[w]
                if str(r["record_id"]) in respondent_of
            }
            for w in order
        ]
        result["intersection"] = _intersection(qi_releases, k)
    return result


def _intersection(releases: Sequence[Mapping[str, Any]], k: int) -> dict[str, Any]:
    """The intersection adversary's figures (:func:`intersection_attack`)."""
    inter = intersection_attack(releases, k)
    dist = inter.distribution(k)
    return {
        "k": k,
        "respondents": inter.respondents,
        "below_k": inter.below_k,
        "share_below_k": dist["share_below_k"],
        "singled_out": int(dist["singled_out"]),
        "median": dist["median"],
        "smallest_candidate_sets": inter.smallest,
    }
