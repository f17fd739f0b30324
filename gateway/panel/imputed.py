"""Imputed members as records of the window: each one's carried values (its answers and the
``other`` attributes published beside them, aged; its sampling weight), a donor's values of the
``other`` attributes it does not carry (a present respondent of the same wave, drawn by keyed
uniform: a state written before they were carried), and its wave; with its state key, the key
its draws are bound to and its values' keyed digests, so that it goes through exactly the
protections a present record goes through."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway.engine.keyed_inputs import KeyedInputs, WindowKeys
from gateway.engine.records import ValidRecord
from gateway.keyed.randomness import UniformSource
from gateway.panel.roster import Roster


@dataclass(frozen=True, slots=True)
class PanelWindow:
    """The window's records and what the engine derived from them."""

    records: Sequence[ValidRecord]
    rids: list[str]
    columns: Mapping[str, Sequence[Any]]  # read only: the panel step extends a copy
    rkeys: list[bytes | None]
    dkeys: list[bytes | None]
    keys: WindowKeys
    scopes: Sequence[int] | None


class Imputed(NamedTuple):
    """An absent member to publish: its roster, wave and row, its class's tuple and weight."""

    scope: int | None
    wave: int
    row: int
    tuple_: list[Any]
    weight: float
    rid: str
    # its carried values as the wave found them: a backlog decides several waves in a window,
    # and a later wave's answers, carried once it is decided, are not this wave's
    carried: dict[str, Any]


def extended(
    pw: PanelWindow,
    imputed: Sequence[Imputed],
    rosters: Mapping[int | None, Roster],
    waves: list[int | None],
    *,
    rand: UniformSource,
    inputs: KeyedInputs,
    others: Sequence[str],
    wave_name: str,
) -> tuple[
    list[ValidRecord],
    list[bytes | None],
    list[bytes | None],
    dict[str, list[tuple[bytes, str]]],
]:
    """The window's records followed by one built per imputed member, with their keys."""
    donors = _donors(pw, waves) if imputed else {}  # (a window deciding no wave imputes none)
    synth: list[ValidRecord] = []
    skeys: list[bytes] = []
    by_wave: dict[int, list[int]] = {}
    for j, entry in enumerate(imputed):
        by_wave.setdefault(entry.wave, []).append(j)
    picks: dict[int, int | None] = {}
    for wave, js in by_wave.items():
        pool = donors.get(wave, [])
        keys = [rosters[imputed[j][0]].keys[imputed[j][2]] for j in js]
        draws = rand.uniform(f"panel/donor/{wave}", len(keys), keys).tolist() if keys else []
        for j, u in zip(js, draws, strict=True):
            picks[j] = pool[min(int(u * len(pool)), len(pool) - 1)] if pool else None
    for j, entry in enumerate(imputed):
        carried, wave = dict(entry.carried), entry.wave
        donor = picks[j]
        for name in others:
            col = pw.columns.get(name)
            if col is not None and name not in carried:  # (a published one is carried, aged)
                carried[name] = None if donor is None else col[donor]
        carried[wave_name] = wave
        synth.append(ValidRecord(None, carried, None, 0.0))
        skeys.append(rosters[entry.scope].keys[entry.row])
    records = [*pw.records, *synth]
    rkeys: list[bytes | None] = [*pw.rkeys, *skeys]
    dkeys: list[bytes | None] = [*pw.dkeys, *(key[-32:] for key in skeys)]
    values = {name: list(v) for name, v in pw.keys.values.items()}
    if synth:
        extra = inputs.of(
            synth,
            rids=[e[5] for e in imputed],
            by_attribute=columns_of(synth, list(pw.columns)),
            claim=False,
        )
        for name, v in extra.values.items():
            values.setdefault(name, []).extend(v)
    return records, rkeys, dkeys, values


def keep_imputed(
    imputed: Sequence[Imputed],
    rosters: Mapping[int | None, Roster],
    *,
    names: list[str],
    cols: list[list[Any]],
    pub_idx: list[int],
    n_in: int,
) -> None:
    """Store the imputed records of each wave decided here, as published, for a replay."""
    if not imputed:
        return  # no outcome of this window has an imputed record to keep
    at_of = {i: at for at, i in enumerate(pub_idx)}
    for scope, roster in rosters.items():
        for outcome in roster.outcomes:
            entries = [
                (j, e) for j, e in enumerate(imputed) if e[0] == scope and e[1] == outcome.wave
            ]
            if not entries:
                continue
            outcome.imputed_names = list(names)
            outcome.imputed_rids = [e[5] for _, e in entries]
            outcome.imputed_members = [e[2] for _, e in entries]
            outcome.imputed_rows = [[col[at_of[n_in + j]] for col in cols] for j, _ in entries]


def _donors(pw: PanelWindow, waves: list[int | None]) -> dict[int, list[int]]:
    """Each wave's present records, by respondent key: the donor a keyed draw picks depends on
    who answered, not on the order the records arrived in (which differs between runs, and
    between one worker and several)."""
    out: dict[int, list[int]] = {}
    for i, wave in enumerate(waves):
        if wave is not None and pw.rkeys[i] is not None:
            out.setdefault(wave, []).append(i)
    rkeys = pw.rkeys
    for pool in out.values():
        pool.sort(key=lambda i: (rkeys[i], i))
    return out


def columns_of(records: Sequence[ValidRecord], names: list[str]) -> dict[str, list[Any]]:
    """The records' values of ``names``, as columns."""
    return {name: [r.values.get(name) for r in records] for name in names}
