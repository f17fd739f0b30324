"""Each published randomized value names the mechanism it was drawn under.

A sticky draw is republished unchanged for as long as its true value holds, also after the
policy's matrix for that attribute changed (a fresh draw would hand an averaging intruder a
second one): a record published under the new policy version can carry a value drawn under the
old matrix. Reconstruction must then count each value against the matrix it was drawn under,
not against its record's policy version, so a stateful engine publishes, next to every
randomized attribute, the ``matrix_version`` (as in the metadata topic) of each value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SUFFIX = "_matrix_version"


def stamp_column(attribute: str) -> str:
    """The output column that names the matrix of ``attribute``'s published values."""
    return attribute + SUFFIX


def stamped_version(row: Mapping[str, Any], attribute: str) -> str | None:
    """The matrix version a row's ``attribute`` value was drawn under (None: not stamped)."""
    value = row.get(attribute + SUFFIX)
    return value if isinstance(value, str) else None
