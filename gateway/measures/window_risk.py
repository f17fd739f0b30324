"""What the engine measures of a window's microaggregated records: utility (SSE/SST, IL1s,
DLD) and interval-disclosure risk, on their true and masked numeric values."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from gateway.measures.disclosure_risk import check_p_pct, dld_of, interval_share
from gateway.measures.information_loss import il1s_of, sse_sst_of
from gateway.measures.numeric_input import NAN, prepare


def window_measures(
    x: NDArray[np.float64], masked: NDArray[np.float64], p_pct: float
) -> dict[str, float]:
    """Utility and risk of the records microaggregated in a window (true and masked rows): the
    figures ``quality.sse_sst_pct``, ``il1s``, ``dld`` and ``interval_disclosure`` give, on
    one validation and standardisation of the rows."""
    if x.shape[0] < 2:
        return {}
    check_p_pct(p_pct)
    prep = prepare(x, masked)
    return {
        "sse_sst_pct": sse_sst_of(prep),
        "il1s": il1s_of(prep),
        "dld": dld_of(prep, 1.0),
        "interval_disclosure": interval_share(prep, p_pct) if prep.ok else NAN,
    }
