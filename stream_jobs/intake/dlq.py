"""Dead-letter records: the raw bytes as consumed, plus headers saying why and from where.

Headers (all UTF-8 text): ``reason`` (a :class:`gateway.validation.DLQReason`),
``error_class``, ``field`` (a policy attribute name, only when one is concerned),
``source_topic``, ``source_partition``, ``source_offset``, ``source_timestamp`` (ms) and
``policy_version``. The payload is never logged or copied anywhere else.

A record larger than the worker accepts (``max_message_bytes``, reason ``too_large``) keeps only
its first ``TRUNCATED_PREFIX_BYTES`` in the dead-letter topic, with ``truncated``,
``original_size`` and ``original_sha256`` headers; the whole record stays in the input topic at
its source coordinates. Copied whole, 1,000 such records were 1.1 GB of dead letters (a third of
the valid records' throughput, bench/poison_throughput.py), and on a broker with Kafka's default
``max.message.bytes`` (1 MiB) they could not be produced to the DLQ at all.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gateway.validation import Rejection

TRUNCATED_PREFIX_BYTES = 64 * 1024


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
    max_value_bytes: int | None = None,
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
    value = raw if raw is not None else b""
    if max_value_bytes is not None and len(value) > max_value_bytes:
        headers += [
            ("truncated", b"1"),
            ("original_size", str(len(value)).encode()),
            ("original_sha256", hashlib.sha256(value).hexdigest().encode()),
        ]
        value = value[:TRUNCATED_PREFIX_BYTES]
    # Kafka needs a key or a value: an empty value stands for a null (tombstone) message
    return DeadLetter(
        key=key,
        value=value,
        headers=headers,
        partition=partition,
        timestamp_ms=timestamp_ms if timestamp_ms is not None and timestamp_ms >= 0 else None,
    )


def headers_dict(
    headers: list[tuple[str, bytes]] | tuple[tuple[str, bytes], ...],
) -> dict[str, str]:
    """Decoded DLQ headers (for tests and tools)."""
    return {k: v.decode() for k, v in headers}
