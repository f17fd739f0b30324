"""Where a respondent's state lives: the partition its key picks.

The partitioned state backend keeps each respondent's state in one partition of the changelog,
and that partition must not depend on how a record reached the gateway (a producer with another
partitioner, the repartition topic, a topic with another partition count): it is derived from
the respondent's key alone, with Kafka's default partitioner (murmur2, what the Java client and
aiokafka use), over the state's partition count. The gateway's wiring routes every record to
the worker that owns that partition; the engine names it in every state key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.engine.records import ValidRecord

_MURMUR_SEED = 0x9747B28C
_MURMUR_M = np.uint32(0x5BD1E995)


def murmur2_many(keys: Sequence[bytes]) -> np.ndarray[Any, np.dtype[np.uint32]]:
    """Kafka's murmur2 of each key (``aiokafka.partitioner.murmur2``, the Java client's hash),
    for a window's keys at once: numpy over the keys of each length, ~0.25 µs a key where
    aiokafka's pure-Python hash costs 7-11 µs (43- and 64-byte keys) on the worker's thread."""
    out = np.empty(len(keys), dtype=np.uint32)
    by_length: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        by_length.setdefault(len(key), []).append(i)
    m = _MURMUR_M
    for length, idx in by_length.items():
        data = np.frombuffer(b"".join(keys[i] for i in idx), dtype=np.uint8).reshape(
            len(idx), length
        )
        h = np.full(len(idx), (_MURMUR_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
        words = length // 4
        if words:  # little-endian 4-byte words, as the hash reads them
            w = np.ascontiguousarray(data[:, : words * 4]).view("<u4").astype(np.uint32)
            for j in range(words):
                k = w[:, j] * m
                k ^= k >> 24
                k *= m
                h *= m
                h ^= k
        tail, extra = length & ~3, length % 4
        if extra >= 3:
            h ^= data[:, tail + 2].astype(np.uint32) << 16
        if extra >= 2:
            h ^= data[:, tail + 1].astype(np.uint32) << 8
        if extra >= 1:
            h ^= data[:, tail].astype(np.uint32)
            h *= m
        h ^= h >> 13
        h *= m
        h ^= h >> 15
        out[idx] = h
    return out


def partitions_for_keys(keys: Sequence[bytes], partitions: Sequence[int]) -> list[int]:
    """The partition aiokafka's ``DefaultPartitioner`` (and the Java client) picks for each
    key: murmur2 made positive, modulo the partition count, of ``partitions`` sorted."""
    if not partitions:
        raise ValueError("no partitions to place keys on: the topic has none")
    positions = (murmur2_many(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(len(partitions))
    return [partitions[i] for i in positions.tolist()]


KeyOf = Callable[[str | None, Mapping[str, object]], bytes | None]


@dataclass(frozen=True, slots=True)
class StatePartitions:
    """The state partition of each record: its respondent key's partition among ``count``
    (``key_of``: the record's Kafka key from its respondent id and values,
    ``gateway.validation.Validator.expected_key``)."""

    count: int
    key_of: KeyOf

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"state partitions must be >= 1, got {self.count}")

    def of_keys(self, keys: Sequence[bytes | None], fallback: Sequence[int]) -> list[int]:
        """Each key's partition; ``fallback[i]`` where a record has no key (it has no state)."""
        known = [(i, k) for i, k in enumerate(keys) if k is not None]
        out = [f % self.count for f in fallback]
        if known:
            placed = partitions_for_keys([k for _, k in known], range(self.count))
            for (i, _), p in zip(known, placed, strict=True):
                out[i] = p
        return out


def state_partitions(
    records: Sequence[ValidRecord], partitions: StatePartitions | None
) -> list[int]:
    """Each record's state partition: its respondent key's (``partitions``), else the input
    partition it came from."""
    fallback = [r.source.partition if r.source is not None else 0 for r in records]
    if partitions is None:
        return fallback
    keys = [partitions.key_of(r.respondent_id, r.values) for r in records]
    return partitions.of_keys(keys, fallback)
