"""The state interface the engine needs; backends live in the top-level ``state`` package.

A store is a durable map from a respondent key (HMAC digest of the respondent id, 32 bytes)
to an opaque value (the engine's encoded ``RespondentState``). Backends know nothing of its
content, so none of them can leak a raw id or value: the engine only ever hands them digests
and published (already protected) values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class StateStore(Protocol):
    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """Values of the keys present; absent keys are left out."""
        ...

    def put_many(self, entries: Mapping[bytes, bytes]) -> None:
        """Insert or replace, atomically for the batch; durable when it returns."""
        ...

    def count(self) -> int:
        """Number of respondents stored."""
        ...

    def close(self) -> None: ...
