"""A window's decision on the quasi-identifiers of the k claim: per record the published tuple
and its group, and which records are held or published with their quasi-identifiers
suppressed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gateway.policy import MISSING_LABEL


@dataclass(slots=True)
class QIDecision:
    """Per record index: published k-claim tuple, QI digest, group id; and the window's
    held and suppressed records, new groups (id, distinct members), sticky hits, measures."""

    # record index -> published values of the k claim's attributes, in claim order (one
    # tuple per record rather than one dict per attribute: a window sets ~n of them)
    tuples: dict[int, Sequence[Any]] = field(default_factory=dict)
    digests: dict[int, str] = field(default_factory=dict)
    current_digest: dict[int, str] = field(default_factory=dict)  # when a move was deferred
    # records whose respondent's current group and tuple are this record's: nothing to store
    unchanged: set[int] = field(default_factory=set)
    replayed: set[int] = field(default_factory=set)  # decided before a crash (deferred mode)
    # record index -> (claim digest, what it published): kept in its respondent's state until
    # its offset is committed, so that a replay publishes it again (gateway.grouping.replay)
    outcomes: dict[int, tuple[str, tuple[str, str] | None]] = field(default_factory=dict)
    group_of: dict[int, str] = field(default_factory=dict)
    held: list[int] = field(default_factory=list)
    suppressed: list[int] = field(default_factory=list)
    departed: list[int] = field(default_factory=list)  # left a group, published suppressed
    groups: list[tuple[str, int]] = field(default_factory=list)
    hits: int = 0
    deferred: int = 0
    measures: dict[str, float] = field(default_factory=dict)
    aggregated: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None
    sampled: bool = False


def published_column(values: list[Any], numeric: bool) -> list[Any]:
    """A partition's column as published: a numeric attribute's group means (finite floats,
    else None), or another's chosen categories (the missing category published as None)."""
    if numeric:
        isfinite = math.isfinite
        return [f if isfinite(f := float(v)) else None for v in values]
    missing = MISSING_LABEL
    return [None if v == missing else v for v in values]
