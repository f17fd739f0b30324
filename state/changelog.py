"""The changelog a partitioned store writes through, so a partition can move between workers.

The Kafka implementation (a compacted changelog topic per state table, one Kafka partition per
input partition) lives in ``stream_jobs``; here is only the interface ``RocksStore`` needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

# the key fingerprint's changelog record (a respondent key is a partition prefix + a digest)
FINGERPRINT_ENTRY = b"\x00privgw/key_fingerprint"
# other facts about a partition's state (``RocksStore.set_meta``), one record per name
META_ENTRY_PREFIX = b"\x00privgw/meta/"


@runtime_checkable
class ChangelogWriter(Protocol):
    def write(self, entries: Mapping[bytes, bytes]) -> None:
        """Append the entries; return only once the changelog has acknowledged all of them.

        Raise if any entry may not have been acknowledged. The caller then treats the whole
        batch as not written (it produces no output and will replay it). Entries that did reach
        the changelog before the failure are harmless only if the replay rewrites the same keys;
        an implementation that can make the batch atomic (e.g. one Kafka record per batch, or
        a transactional producer) should.
        """
        ...
