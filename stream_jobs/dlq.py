"""Dead-letter records: the raw bytes as consumed, plus headers saying why and from where.

Headers (all UTF-8 text): ``reason`` (a :class:`gateway.validation.DLQReason`),
``error_class``, ``field`` (a policy attribute name, only when one is concerned),
``source_topic``, ``source_partition``, ``source_offset``, ``source_timestamp`` (ms) and
``policy_version``. The payload is never logged or copied anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.validation import Rejection


@dataclass(frozen=True, slots=True)
class DeadLetter:
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    partition: int  # source partition: the DLQ keeps the input's partitioning
    timestamp_ms: int | None


def dead_letter(
    rejection: Rejection,
    *,
    raw: bytes | None,
    key: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    policy_version: str,
) -> DeadLetter:
    headers = [
        ("reason", rejection.reason.value.encode()),
        ("error_class", rejection.error_class.encode()),
    ]
    if rejection.field is not None:
        headers.append(("field", rejection.field.encode()))
    headers += [
        ("source_topic", topic.encode()),
        ("source_partition", str(partition).encode()),
        ("source_offset", str(offset).encode()),
        ("source_timestamp", str(timestamp_ms if timestamp_ms is not None else -1).encode()),
        ("policy_version", policy_version.encode()),
    ]
    # Kafka needs a key or a value: an empty value stands for a null (tombstone) message
    return DeadLetter(
        key=key,
        value=raw if raw is not None else b"",
        headers=headers,
        partition=partition,
        timestamp_ms=timestamp_ms if timestamp_ms is not None and timestamp_ms >= 0 else None,
    )


def headers_dict(
    headers: list[tuple[str, bytes]] | tuple[tuple[str, bytes], ...],
) -> dict[str, str]:
    """Decoded DLQ headers (for tests and tools)."""
    return {k: v.decode() for k, v in headers}
