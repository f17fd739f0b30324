"""Deterministic and noise-based masking of single attributes (column functions, vectorised)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from enum import Enum

import numpy as np
from numpy.typing import NDArray

from gateway.policy import CodingSpec, HierarchySpec, NoiseSpec, TimeUnit


def noise_sd(values: NDArray[np.float64], spec: NoiseSpec) -> float:
    """Noise standard deviation: the larger of the policy's absolute ``sd`` and √ratio·S, S
    the sample standard deviation of the finite values (0 with fewer than two)."""
    ratio, floor = spec.ratio, spec.sd or 0.0
    finite = values[np.isfinite(values)]
    relative = 0.0
    if ratio is not None and finite.size >= 2:
        relative = float(np.sqrt(ratio) * np.std(finite, ddof=1))
    return max(float(floor), relative if math.isfinite(relative) else 0.0)


def parse_timestamp(text: str) -> datetime | None:
    """An ISO 8601 timestamp (``datetime.fromisoformat``) whose instant is representable in UTC,
    or None if it is not one."""
    try:
        ts = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return None if _beyond_utc(ts) else ts


class TimestampFault(Enum):
    """Why a text is not a timestamp the gateway accepts (names no value)."""

    NOT_ISO_8601 = "not ISO 8601"
    OUT_OF_RANGE = "outside the representable range (years 1 to 9999 in UTC)"


def timestamp_fault(text: str) -> TimestampFault | None:
    """None for an accepted timestamp: ISO 8601 text whose instant exists in UTC. A valid local
    time on the first or last representable day can fall outside it once its offset is applied
    (``9999-12-31T23:00:00-01:00``): coarsening to a minute or an hour converts to UTC."""
    try:
        ts = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return TimestampFault.NOT_ISO_8601
    return TimestampFault.OUT_OF_RANGE if _beyond_utc(ts) else None


def _beyond_utc(ts: datetime) -> bool:
    # an offset is under 24 h, so only the first and last representable day can overflow
    if ts.tzinfo is None or 1 < ts.year < 9999:
        return False
    try:
        ts.astimezone(UTC)
    except OverflowError:
        return True
    return False


def coarsen(values: Sequence[str | None], unit: TimeUnit) -> list[str | None]:
    """ISO 8601 timestamps truncated to the start of their ``unit`` (a week starts on Monday).
    Minute and hour publish a zoned timestamp in UTC: its offset as given may carry seconds and
    microseconds (``+05:30:17.424242``), finer than the unit. Day, week and month publish the
    local date, without an offset. Unparseable text, and a timestamp with no UTC instant (which
    validation dead-letters first), become None: never passed through."""
    if unit in _LOCAL_DATE_UNITS and (dated := _local_dates(values, unit)) is not None:
        return dated
    return coarsen_each(values, unit)


def coarsen_each(values: Sequence[str | None], unit: TimeUnit) -> list[str | None]:
    """:func:`coarsen` a timestamp at a time, each parsed (what the columnar path must equal)."""
    start = _UNIT_START[unit]
    to_utc = unit in {TimeUnit.MINUTE, TimeUnit.HOUR}
    out: list[str | None] = []
    append = out.append
    for v in values:
        ts = parse_timestamp(v) if v is not None else None
        if ts is None:
            append(None)
            continue
        if to_utc and ts.tzinfo is not None:
            ts = ts.astimezone(UTC)
        append(start(ts))
    return out


_LOCAL_DATE_UNITS = frozenset({TimeUnit.DAY, TimeUnit.WEEK, TimeUnit.MONTH})
_DASH, _ZERO = ord("-"), ord("0")
_DIGITS = np.array([0, 1, 2, 3, 5, 6, 8, 9])  # positions of YYYY-MM-DD's digits
_YEAR = np.array([1000, 100, 10, 1])


def _local_dates(values: Sequence[str | None], unit: TimeUnit) -> list[str | None] | None:
    """:func:`coarsen` under a unit that publishes the local date, taken from the text: a
    timestamp ``fromisoformat`` accepts whose text starts ``YYYY-MM-DD`` has that local date
    (the parser reads the date from those ten characters). None when a value needs the full
    path: text in another form, or a year (1, 9999) whose instant may leave UTC."""
    at = None if None not in values else [i for i, v in enumerate(values) if v is not None]
    texts = values if at is None else [values[i] for i in at]
    try:  # every text parses, or the full path says which do not
        deque(map(datetime.fromisoformat, texts), maxlen=0)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    heads = np.array(texts, dtype="<U10")  # the first ten characters; shorter pad with NUL
    points = heads.view(np.uint32).reshape(len(texts), 10)
    digits = points[:, _DIGITS]
    year = (points[:, :4].astype(np.int64) - _ZERO) @ _YEAR
    if not (
        (points[:, [4, 7]] == _DASH).all()
        and ((digits >= _ZERO) & (digits <= _ZERO + 9)).all()
        and ((year > 1) & (year < 9999)).all()
    ):
        return None
    if unit is TimeUnit.MONTH:
        dated = heads.astype("<U7")
    elif unit is TimeUnit.WEEK:
        days = heads.astype("datetime64[D]")
        weekday = (days.astype(np.int64) + 3) % 7  # 1970-01-01 was a Thursday
        monday: NDArray[np.datetime64] = days - weekday.astype("timedelta64[D]")
        dated = np.datetime_as_string(monday, unit="D")
    else:
        dated = heads
    published: list[str | None] = dated.tolist()
    if at is None:
        return published
    out: list[str | None] = [None] * len(values)
    for i, d in zip(at, published, strict=True):
        out[i] = d
    return out


_UNIT_START: dict[TimeUnit, Callable[[datetime], str]] = {
    TimeUnit.MINUTE: lambda ts: ts.replace(second=0, microsecond=0).isoformat(timespec="minutes"),
    TimeUnit.HOUR: lambda ts: ts.replace(minute=0, second=0, microsecond=0).isoformat(
        timespec="hours"
    ),
    TimeUnit.DAY: lambda ts: ts.date().isoformat(),
    TimeUnit.WEEK: lambda ts: (ts.date() - timedelta(days=ts.weekday())).isoformat(),
    TimeUnit.MONTH: lambda ts: f"{ts.year:04d}-{ts.month:02d}",
}


def add_noise(
    values: NDArray[np.float64], sd: float, normals: NDArray[np.float64]
) -> NDArray[np.float64]:
    """x + sd·z with standard normals z supplied by the caller (seeded or keyed)."""
    return values + sd * normals


def round_to(values: NDArray[np.float64], step: float) -> NDArray[np.float64]:
    """Each value rounded to the nearest multiple of ``step`` (halves to even), printed as
    short as the step allows (0.1 gives 0.3, not 0.30000000000000004). Deterministic and
    idempotent: a rounded value rounds to itself, so a stored publication republishes as is.
    Zero is never negative; NaN stays NaN."""
    multiples = np.round(values / step) * step
    decimals = _decimals(step)
    if decimals is not None:
        multiples = np.round(multiples, decimals)
    return multiples + 0.0  # -0.0 (a small negative rounded) is published as 0.0


def _decimals(step: float) -> int | None:
    """Decimal places that write ``step`` exactly (None: more than 12)."""
    return next((d for d in range(13) if round(step, d) == step), None)


def top_bottom_code(values: NDArray[np.float64], spec: CodingSpec) -> NDArray[np.float64]:
    """Values above ``top`` become ``top``; values below ``bottom`` become ``bottom``."""
    lo = -np.inf if spec.bottom is None else spec.bottom
    hi = np.inf if spec.top is None else spec.top
    return np.clip(values, lo, hi)


def generalize(values: Sequence[str | None], spec: HierarchySpec) -> list[str | None]:
    """Climb ``spec.level`` levels of the hierarchy; a value without a parent is an error."""
    out: list[str | None] = list(values)
    for level in spec.levels[: spec.level]:
        climbed: list[str | None] = []
        for v in out:
            if v is None:
                climbed.append(None)
                continue
            parent = level.get(v)
            if parent is None:
                raise KeyError("value has no parent in the generalization hierarchy")
            climbed.append(parent)
        out = climbed
    return out
