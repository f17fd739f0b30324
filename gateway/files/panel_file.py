"""`privgw protect --state-dir`: a panel file's waves published as successive releases, on a
state a later file continues: the stream's engine, one wave at a time.

Without a state a file is one release (:mod:`gateway.files.protect`): protecting each wave's
rows on its own would draw every randomized answer afresh per wave, which an intruder holding
the releases averages away. Here each wave is decided as the stream decides it when the wave
closes — under the ``panel`` mode fixed cohorts, every member published in every wave (an
absent one imputed), analysis weights raked — and the keyed draws stay in the state with the
cohorts, so next month's file of wave 4 continues the panel. The secret comes from
PRIVGW_SECRET_FILE or PRIVGW_SECRET. A wave the state decided already is published again as
it was (the same rows give the same bytes: an output lost after the state was written is
recovered), as long as the state keeps its outcome (the newest four); an older one is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from gateway.engine.engine import Engine
from gateway.engine.records import InputMarks, ValidRecord
from gateway.errors import InputDataError, PrivgwError
from gateway.files.fileio import read_table, records_from_frame, write_table
from gateway.files.protect import meta_path
from gateway.grouping.scope import stream_refusal
from gateway.keyed.keyed import Keyring, load_secret
from gateway.panel.roster import (
    OUTCOMES_KEPT,
    Roster,
    Sealer,
    read_roster,
    roster_key,
)
from gateway.panel.step import CARRY_SALT
from gateway.policy import Method, Policy, RepublicationMode
from gateway.state_store.state_api import check_key_fingerprint

OpenState = Callable[[Path, Policy, str | None], Any]  # state.file_state.open_file_state


def check_waved(policy: Policy, seed: int | None) -> str:
    """The wave attribute of a policy a file's waves can be protected under (else why not)."""
    wave = policy.republication.wave_attribute
    if wave is None or policy.attributes[wave].method is Method.DROP:
        raise PrivgwError(
            "--state-dir protects a file's waves as successive releases: set "
            "republication.wave_attribute to the column numbering them (and publish it)"
        )
    if policy.input.respondent_id is None:
        raise PrivgwError(
            "--state-dir follows respondents from wave to wave: set input.respondent_id"
        )
    refusal = stream_refusal(policy)
    if refusal is not None:
        raise PrivgwError(f"--state-dir protects as the stream does, which refuses: {refusal}")
    if seed is not None:
        raise PrivgwError(
            "--seed and --state-dir exclude each other: with a state every draw is keyed by "
            "the secret (PRIVGW_SECRET_FILE), so a run is reproduced by the secret and the state"
        )
    return wave


def protect_waves(
    src: str | Path,
    policy: Policy,
    out: str | Path,
    state_dir: Path,
    open_state: OpenState,
    *,
    accept: str | None = None,
) -> dict[str, Any]:
    """Protect ``src``'s waves in order on the state in ``state_dir``; writes OUT (every wave's
    release, in wave order) and OUT.meta.json. Everything is checked before the state is
    written: the file's rows, the secret, the policy the state records (``accept``: the
    version of a changed policy accepted as its upgrade, `--policy-upgrade`), its waves."""
    wave = check_waved(policy, None)
    df = read_table(src, as_text=True)
    records = records_from_frame(df, policy, src)
    waves = _by_wave(records, wave, src)
    keyring = Keyring(load_secret(os.environ))
    store = open_state(state_dir, policy, accept)  # a StateStore and a KeyFingerprintStore
    try:
        check_key_fingerprint(
            store,
            keyring.fingerprint(),
            rotate=False,
            where=str(state_dir),
            rotation="start the panel afresh on a new --state-dir",
        )
        # only a panel keeps a roster (the waves it decided): read once, here
        roster = (
            read_roster(
                store.get_many, roster_key(None), Sealer(keyring.hkdf(CARRY_SALT, b"aes-256-gcm"))
            )
            if policy.republication.mode is RepublicationMode.PANEL
            else Roster()
        )
        last = roster.last_wave
        first = next(iter(waves))
        if last is not None and first <= last - OUTCOMES_KEPT:
            raise InputDataError(
                f"{src}: wave {first} was decided in {state_dir} too long ago to be "
                f"published again (its newest wave is {last}, and a state keeps the "
                f"outcomes of its newest {OUTCOMES_KEPT}): protect the waves after {last}, "
                "or give a new --state-dir"
            )
        keys = {
            w: keyring.respondent_keys([str(r.respondent_id) for r in rows])
            for w, rows in waves.items()
        }
        check_decided(keys, roster, src)
        check_new_waves(waves, last, policy.microaggregation.k, src)
        engine = Engine(policy, keyring=keyring, store=store)
        published: list[dict[str, Any]] = []  # the records' values, decoded once
        per_wave = {}
        for w, window in waves.items():  # (the engine decides a wave in keyed respondent order)
            result = engine.protect_window(
                window, now=float(w), flush_all=True, marks=InputMarks(closed_through=w)
            )
            assert not result.held, "a closed wave holds no record"
            values = [orjson.loads(p.value) for p in result.published]
            published.extend(values)
            report = result.report
            per_wave[w] = {
                "again": last is not None and w <= last,  # decided before: its release again
                "answered": len(window),
                "published": len(result.published),
                "imputed": report.imputed,
                "suppressed": report.suppressed,
                "weight_total": _weight_total(values, policy),
                "noise_sd_applied": dict(report.noise_sd),
            }
        # the counts per wave, as the stream's metrics give them (no value, no id)
        meta = {**engine.metadata(policy), "waves": {str(w): c for w, c in per_wave.items()}}
    finally:
        store.close()
    write_table(_frame(published, policy), out)
    meta_path(out).write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    return {"records": len(records), "waves": per_wave, "meta": str(meta_path(out))}


def check_decided(keys: dict[int, list[bytes]], roster: Roster, src: str | Path) -> None:
    """A wave the state decided can only be published again, from the rows it was decided
    with: a wave is decided whole, its absent members imputed. Rows of such a wave from a
    respondent it imputed, or did not know, would be answers it never had (republishing the
    imputed record would tell which records were imputed), and a wave before the newest
    decided one that was never decided cannot be decided any more. ``keys``: each wave's
    respondent keys, row by row."""
    last = roster.last_wave
    for w, wave_keys in keys.items():
        if last is None or w > last:
            continue
        outcome = roster.outcome_of(w)
        if outcome is None:
            raise InputDataError(
                f"{src}: wave {w} comes before wave {last}, the newest the state decided, "
                "and was never decided: a panel's waves are decided in order. Give its rows "
                "before the later waves', on a new --state-dir"
            )
        at = roster.rows_of(sorted(set(wave_keys)))
        imputed = set(outcome.imputed_members)
        late = sum(1 for row in at if row is None or row in imputed)
        if late:
            raise InputDataError(
                f"{src}: wave {w} was decided by an earlier run without the answers of {late} "
                "respondent(s) in this file (a wave is decided whole, its absent members "
                "imputed): give each wave's rows in one file. A decided wave can only be "
                "published again, from the rows it was decided with"
            )


def check_new_waves(
    waves: dict[int, list[ValidRecord]], last: int | None, k: int, src: str | Path
) -> None:
    """A wave to decide has k respondents or more: fewer is most likely a mistyped wave
    number, which would be decided with everyone else imputed and close every wave before it
    (the stream, likewise, counts a wave only once k respondents have answered it)."""
    for w, rows in waves.items():
        n = len({r.respondent_id for r in rows})
        if (last is None or w > last) and n < k:
            raise InputDataError(
                f"{src}: wave {w} has {n} respondent(s), fewer than k = {k}: a wave is "
                "decided once, with every member it lacks imputed, and closes the waves "
                "before it. Check the wave column, or hold the wave back until it is complete"
            )


def _weight_total(published: Sequence[dict[str, Any]], policy: Policy) -> float:
    """The release's analysis weights summed (0.0 without a weight field)."""
    name = policy.republication.weight_name
    weights = (row.get(name) for row in published)
    return round(float(sum(w for w in weights if isinstance(w, int | float))), 6)


def _by_wave(
    records: Sequence[ValidRecord], wave: str, src: str | Path
) -> dict[int, list[ValidRecord]]:
    """The records of each wave, in wave order (every record has one)."""
    if not records:
        raise InputDataError(f"{src}: no data rows")
    values = [r.values.get(wave) for r in records]
    missing = [i for i, v in enumerate(values) if v is None]
    if missing:
        raise InputDataError(
            f"{src}: {len(missing)} row(s) without a wave ('{wave}'), first at data row "
            f"{missing[0] + 1}: every row of a panel file belongs to a wave"
        )
    nobody = [i for i, r in enumerate(records) if not r.respondent_id]
    if nobody:
        raise InputDataError(
            f"{src}: {len(nobody)} row(s) without a respondent id, first at data row "
            f"{nobody[0] + 1}: a panel follows every row's respondent from wave to wave"
        )
    out: dict[int, list[ValidRecord]] = {}
    for value, record in zip(values, records, strict=True):
        out.setdefault(int(value), []).append(record)  # type: ignore[call-overload]
    return dict(sorted(out.items()))


def _frame(rows: Sequence[dict[str, Any]], policy: Policy) -> pd.DataFrame:
    """The releases' records (their values) as a table: the policy's published attributes in
    its order, then what the engine adds (the analysis weight)."""
    columns = [n for n, a in policy.attributes.items() if a.method is not Method.DROP]
    extra = [c for c in dict.fromkeys(c for row in rows for c in row) if c not in columns]
    return pd.DataFrame(rows, columns=[*columns, *extra])
