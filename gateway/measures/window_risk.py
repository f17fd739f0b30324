"""What the engine measures of a window's microaggregated records: utility (SSE/SST, IL1s,
DLD) and interval-disclosure risk, on their true and masked numeric values."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from gateway.measures import quality


def window_measures(
    x: NDArray[np.float64], masked: NDArray[np.float64], p_pct: float
) -> dict[str, float]:
    """Utility and risk of the records microaggregated in a window (true and masked rows)."""
    if x.shape[0] < 2:
        return {}
    return {
        "sse_sst_pct": quality.sse_sst_pct(x, masked),
        "il1s": quality.il1s(x, masked),
        "dld": quality.dld(x, masked),
        "interval_disclosure": quality.interval_disclosure(x, masked, p_pct),
    }
