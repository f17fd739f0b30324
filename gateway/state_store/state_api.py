"""The state interface the engine needs; backends live in the top-level ``state`` package.

A store is a durable map from a respondent key (HMAC digest of the respondent id, 32 bytes)
to an opaque value (the engine's encoded ``RespondentState``). Backends know nothing of its
content, so none of them can leak a raw id or value: the engine only ever hands them digests
and published (already protected) values.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gateway.errors import PrivgwError


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


# -- the key fingerprint a state was written with ------------------------------------------
# Every stored value and keyed draw depends on the deployment secret: a state reused with
# another secret republishes each respondent's values differently, the averaging attack sticky
# values exist to stop. So a state records ``Keyring.fingerprint()`` and is not used with
# another one unless the operator says the secret was rotated on purpose.


@runtime_checkable
class KeyFingerprintStore(Protocol):
    def key_fingerprints(self) -> list[str | None]:
        """The key fingerprint each part of the state (file, shard, partition) holds; None for
        a part that holds none yet."""
        ...

    def set_key_fingerprint(self, fingerprint: str) -> None:
        """Record ``fingerprint`` in every part, replacing what is there; durable when it
        returns."""
        ...


class KeyFingerprintCheck(enum.Enum):
    NEW = "new"  # no fingerprint was stored (a new state): recorded
    SAME = "same"
    ROTATED = "rotated"  # another one was stored and the rotation accepted: replaced


@dataclass(frozen=True, slots=True)
class KeyFingerprintResult:
    outcome: KeyFingerprintCheck
    previous: tuple[str, ...] = ()  # the other fingerprints the state held (ROTATED)
    dropped: int = 0  # entries dropped with the old secret (ROTATED; they were unreachable)


class SecretMismatchError(PrivgwError):
    """The state was written with another secret. Names fingerprints, never the secret."""


def check_key_fingerprint(
    store: KeyFingerprintStore,
    fingerprint: str,
    *,
    rotate: bool,
    where: str,
    rotation: str = "accept the new one with --rotate-secret (env PRIVGW_ROTATE_SECRET=1)",
) -> KeyFingerprintResult:
    """Compare the state's fingerprints with ``fingerprint``; record it where it is missing,
    and where another one is stored if ``rotate``; else raise ``SecretMismatchError`` (whose
    other way out is ``rotation``, the calling command's). Nothing is written when it
    raises."""
    held = store.key_fingerprints()
    other = sorted({f for f in held if f is not None and f != fingerprint})
    if other and not rotate:
        raise SecretMismatchError(
            f"the state in {where} was written with key fingerprint {', '.join(other)}, but "
            f"the secret in force (PRIVGW_SECRET / PRIVGW_SECRET_FILE) has fingerprint "
            f"{fingerprint}: with another secret every respondent's stored values and keyed "
            "draws change and are republished differently. Use the secret the state was "
            f"written with, or {rotation}"
        )
    if other:
        drop = getattr(store, "rotate_key_fingerprint", None)
        if callable(drop):  # entries keyed by the old secret are unreachable: dropped
            dropped = int(drop(fingerprint))
        else:
            store.set_key_fingerprint(fingerprint)
            dropped = 0
        return KeyFingerprintResult(KeyFingerprintCheck.ROTATED, tuple(other), dropped)
    if None in held:
        store.set_key_fingerprint(fingerprint)
        return KeyFingerprintResult(KeyFingerprintCheck.NEW)
    return KeyFingerprintResult(KeyFingerprintCheck.SAME)
