"""Errors of the state backends. Messages name the store and the fix, never a key or value."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gateway.errors import PrivgwError


class StateStoreError(PrivgwError):
    """A state store cannot be opened or used (locked by another process, wrong path...)."""


def check_entries(entries: Mapping[bytes, bytes]) -> None:
    """Raise ``TypeError`` unless every key and value is ``bytes`` (no str, no bytearray)."""
    for key, value in entries.items():
        check_entry(key, value)


def check_entry(key: object, value: object) -> None:
    if type(key) is not bytes or type(value) is not bytes:
        raise TypeError(
            "state store keys and values must be bytes "
            f"(got key {type(key).__name__}, value {type(value).__name__})"
        )


def check_keys(keys: Iterable[object]) -> None:
    for key in keys:
        if type(key) is not bytes:
            raise TypeError(f"state store keys must be bytes (got {type(key).__name__})")
