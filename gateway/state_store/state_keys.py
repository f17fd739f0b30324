"""Which entry of a state store holds what: the engine's state keys.

* A respondent's entry: its 32-byte keyed digest (``Keyring.respondent_key``), or, for an engine
  with ``partition_scope``, its input partition (2 bytes, big-endian) in front of the digest.
* A group's registry entry: :data:`GROUP_KEY_PREFIX` + the group id (``<partition>.<id>`` in
  partition scope); its value is read and written by :mod:`gateway.state_store.state_codec`.

The state stores, the changelog and the policy migration read keys through these functions, so
that the layout is defined here once.
"""

from __future__ import annotations

GROUP_KEY_PREFIX = b"group:"  # registry entries; respondent keys are 32-byte digests
PARTITION_BYTES = 2  # partition-scoped respondent keys: partition (big-endian) + digest
DIGEST_BYTES = 32


def group_key(group_id: str) -> bytes:
    """The registry key of a group."""
    return GROUP_KEY_PREFIX + group_id.encode()


def group_id(key: bytes) -> str:
    """The group id of a registry key (the inverse of :func:`group_key`)."""
    return key[len(GROUP_KEY_PREFIX) :].decode()


def is_group_key(key: bytes) -> bool:
    return key.startswith(GROUP_KEY_PREFIX)


PANEL_ROSTER = "panel"  # a panel's roster: group id ``panel`` or ``<partition>.panel``
ROSTER_PART = "~"  # a part of a roster written in parts: ``<roster id>~<slot>-<part>``


def roster_group_id(scope: int | None) -> str:
    """The group id of a scope's panel roster (gateway.panel.roster)."""
    return PANEL_ROSTER if scope is None else f"{scope}.{PANEL_ROSTER}"


def roster_part_key(roster: bytes, slot: int, part: int) -> bytes:
    """The entry of part ``part`` of a roster written in ``slot`` (0 or 1): after the roster's
    own key, so that partitioned state routes it with the roster."""
    return roster + f"{ROSTER_PART}{slot}-{part}".encode()


def is_roster_head(key: bytes) -> bool:
    """Whether a key holds a panel roster (whole, or the head of its parts)."""
    return is_group_key(key) and group_id(key).rsplit(".", 1)[-1] == PANEL_ROSTER


def is_roster_key(key: bytes) -> bool:
    """Whether a registry key holds a panel roster or one of its parts, not one group (its
    ``live`` and ``size`` count members; migrations and live-count audits leave it alone)."""
    if not is_group_key(key):
        return False
    last = group_id(key).rsplit(".", 1)[-1]
    return last == PANEL_ROSTER or last.startswith(PANEL_ROSTER + ROSTER_PART)


def scoped_key(partition: int, key: bytes) -> bytes:
    """A respondent key in partition scope: the partition it belongs to, then its digest."""
    return partition.to_bytes(PARTITION_BYTES, "big") + key


def state_key_partition(key: bytes) -> int | None:
    """The input partition a state key belongs to, for an engine with ``partition_scope``:
    respondent keys carry it in front of the digest, group ids as ``<partition>.<id>``.
    None for keys of an engine without partition scope."""
    if key.startswith(GROUP_KEY_PREFIX):
        head, dot, _ = key[len(GROUP_KEY_PREFIX) :].partition(b".")
        return int(head) if dot and head.isdigit() else None
    if len(key) == PARTITION_BYTES + DIGEST_BYTES:
        return int.from_bytes(key[:PARTITION_BYTES], "big")
    return None
