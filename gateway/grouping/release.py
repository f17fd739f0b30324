"""What a release is, and when one is closed.

With ``republication.wave_attribute`` a release is a wave: the records carrying the same wave
number, over as many windows as they take to arrive, and per-release k is counted over all of
them. Without it (or for a record that carries no wave) every output window is a release of its
own. A wave is *closed* once a record of a later wave has been seen (a watermark on the wave
number): records still waiting for their group's quorum in it stop waiting.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.grouping.registry import is_wave


def release_keys(waves: Sequence[object], window: Callable[[], str]) -> list[str]:
    """Each record's release key: its wave number as text, else ``w`` + the window's id
    (``window`` gives it; asked only when a record has no wave)."""
    memo: dict[object, str] = {}  # a window repeats a few wave numbers
    missing = ""
    out: list[str] = []
    for v in waves:
        if v in memo:
            out.append(memo[v])
            continue
        finite = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        key = memo[v] = str(int(v)) if finite else missing  # type: ignore[call-overload]
        out.append(key)
    if missing in memo.values():
        fallback = "w" + window()
        return [key or fallback for key in out]
    return out


@dataclass(slots=True)
class ReleaseClock:
    """The newest wave an engine has seen (kept in memory: after a restart, hold time bounds the
    wait until a later wave is seen again)."""

    newest: int | None = None

    def see(self, keys: Sequence[str]) -> None:
        waves = [int(key) for key in set(keys) if is_wave(key)]
        if waves and (self.newest is None or max(waves) > self.newest):
            self.newest = max(waves)

    def closed(self, key: str) -> bool:
        """Whether release ``key`` is a wave older than the newest one seen."""
        return self.newest is not None and key.lstrip("-").isdigit() and int(key) < self.newest


def release_order(release: str) -> tuple[int, int]:
    """Waves by number first, window releases after them."""
    if is_wave(release):
        return (0, int(release))
    return (1, 0)


def pool_order(
    item: tuple[tuple[int | None, str, str], list[int]],
) -> tuple[int, int, str, int, int]:
    """A pool's place among a window's pools: scoped ones by scope, then by stratum, then
    oldest release first."""
    (scope, stratum, release), _ = item
    return (scope is None, scope or 0, stratum, *release_order(release))
