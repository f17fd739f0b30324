"""What a release is, and when one is closed.

With ``republication.wave_attribute`` a release is a wave: the records carrying the same wave
number, over as many windows as they take to arrive, and per-release k is counted over all of
them. Without it (or for a record that carries no wave) every output window is a release of its
own. A wave is *closed* once a record of a later wave has been seen (a watermark on the wave
number): records still waiting for their group's quorum in it stop waiting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def release_keys(waves: Sequence[object] | None, window: str) -> list[str]:
    """Each record's release key: its wave number as text, else ``w`` + the window's id."""
    fallback = "w" + window
    if waves is None:
        return []
    out: list[str] = []
    for v in waves:
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out.append(str(int(v)))
        else:
            out.append(fallback)
    return out


@dataclass(slots=True)
class ReleaseClock:
    """The newest wave an engine has seen (kept in memory: after a restart, hold time bounds the
    wait until a later wave is seen again)."""

    newest: int | None = None

    def see(self, keys: Sequence[str]) -> None:
        waves = [int(key) for key in set(keys) if key.lstrip("-").isdigit()]
        if waves and (self.newest is None or max(waves) > self.newest):
            self.newest = max(waves)

    def closed(self, key: str) -> bool:
        """Whether release ``key`` is a wave older than the newest one seen."""
        return self.newest is not None and key.lstrip("-").isdigit() and int(key) < self.newest
