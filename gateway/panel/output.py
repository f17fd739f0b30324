"""A panel window's published columns: ids, weights, the pseudonyms imputed members carry, and
the last wave's imputed records re-sent as stored, all in wave order."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.engine.columns import Output
from gateway.engine.records import ValidRecord, take_at

PSEUDONYM = "\x00pseudonym"  # the carried pseudonym of a member (output.pseudonym: hmac)


def wave_of(value: Any) -> int | None:
    """A wave number as published (None: none, or not a finite number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if math.isfinite(value) else None


def waves_of(values: Sequence[Any]) -> list[int | None]:
    """:func:`wave_of` of each value (a plain int, the common case, taken as it is)."""
    return [v if type(v) is int else wave_of(v) for v in values]


def assembled(
    out: Output,
    pub_idx: list[int],
    *,
    respondents: list[bytes | None],
    suppressed: set[int],
    replayed: list[tuple[list[str], list[list[Any]], list[str]]],
    wave_name: str,
) -> tuple[
    list[str],
    list[list[Any]],
    list[str],
    list[bool],
    list[bytes | None],
    list[bytes | None],
]:
    """The window's published columns (in :func:`in_release_order`) and the last wave's imputed
    records re-sent as stored, all in that order: names, columns, record ids, suppressed flags,
    respondents, keys."""
    names, cols = out.names, out.columns
    pub_rids = list(cols[0])
    flags = [i in suppressed for i in pub_idx]
    for r_names, r_rows, r_rids in replayed:
        for row, rid in zip(r_rows, r_rids, strict=True):
            by_name = dict(zip(r_names, row, strict=True))
            for name, col in zip(names, cols, strict=True):
                col.append(by_name.get(name))
            pub_rids.append(rid)
            flags.append(False)
            respondents.append(None)
    keys = keys_of(out.keys, len(pub_rids))
    n = len(pub_rids)
    if not replayed:  # the window's own records are in release order already
        return names, cols, pub_rids, flags, respondents, keys
    if wave_name in names:
        waves = [-1 if w is None else w for w in waves_of(cols[names.index(wave_name)])]
        order = sorted(range(n), key=list(zip(waves, pub_rids, strict=True)).__getitem__)
    else:
        order = sorted(range(n), key=pub_rids.__getitem__)
    if order == list(range(n)):
        return names, cols, pub_rids, flags, respondents, keys
    take = take_at(order)  # in C, once per column
    return (
        names,
        [list(take(col)) for col in cols],
        list(take(pub_rids)),
        list(take(flags)),
        list(take(respondents)),
        list(take(keys)),
    )


def in_release_order(
    out: Output, positions: list[int], ids: Mapping[int, str], waves: Sequence[int | None]
) -> list[int]:
    """Put the window's published records (``out``, built at the increasing ``positions``) in
    release order, oldest wave first (a backlog decided in one window is published wave by wave;
    no wave first) and by record id within a wave; returns the positions in that order.

    The ids are keyed digests, so their order is one an outsider cannot tie to anything. Any
    order the engine builds would tell: present records come in arrival order and imputed ones
    in roster order after them, so an intruder reading offsets would see which record of a
    class is imputed, and with who took part, whose it is."""
    by_wave: dict[int, list[int]] = {}
    for at, i in enumerate(positions):
        wave = waves[i]
        by_wave.setdefault(-1 if wave is None else wave, []).append(at)
    order: list[int] = []
    rid_at = [ids[i] for i in positions]
    for wave in sorted(by_wave):
        order.extend(sorted(by_wave[wave], key=rid_at.__getitem__))
    take = take_at(order)  # in C, once per column
    out.columns = [list(take(col)) for col in out.columns]
    out.keys = list(take(out.keys))
    return list(take(positions))


def pseudonyms(out: Output, records: Sequence[ValidRecord], pub_idx: list[int], n_in: int) -> None:
    """An imputed record's pseudonym (output.pseudonym hmac): the one its member carries."""
    if "pseudonym" in out.names:
        col = out.columns[out.names.index("pseudonym")]
        for at, i in enumerate(pub_idx):
            if i >= n_in:
                col[at] = records[i].values.get(PSEUDONYM)


def keys_of(keys: list[bytes | None], n: int) -> list[bytes | None]:
    return [*keys, *([None] * (n - len(keys)))]


def rounded(weight: float | None) -> float | None:
    """A published weight, to 6 significant digits (every record of a class has the same)."""
    return None if weight is None else float(f"{weight:.6g}")


def rounded_weights(weights: list[float | None]) -> list[float | None]:
    """:func:`rounded` of each weight. A class's weight is one object for all its records, so
    each object is rounded once and found by its identity (the objects are alive in
    ``weights``, which keeps equal but distinct floats, -0.0 or NaN, apart)."""
    once = {key: rounded(w) for key, w in dict(zip(map(id, weights), weights, strict=True)).items()}
    return list(map(once.__getitem__, map(id, weights)))


def panel_record_id(key: bytes, wave: int) -> str:
    """A published record's id: a digest of the respondent's keyed state key and the wave, so
    the same for a replay and unlinkable across waves without the secret (a member has one
    record a wave: its repeats are not published)."""
    return panel_record_ids([key], wave)[0]


def panel_record_ids(keys: Sequence[bytes], wave: int) -> list[str]:
    """:func:`panel_record_id` of each key in ``wave``."""
    tail, head, sha = b"\x00" + str(wave).encode(), f"{wave}-", hashlib.sha256
    return [head + sha(key + tail).hexdigest()[:24] for key in keys]


def unfollowed_record_id(rid: str) -> str:
    """The published id of a record no panel member stands behind (no respondent id, or no
    wave): a digest of its input position, so the same on a replay."""
    return "x-" + hashlib.sha256(rid.encode()).hexdigest()[:24]
