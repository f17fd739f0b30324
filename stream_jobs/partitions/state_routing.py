"""Which worker protects a record, with the partitioned state backend.

A respondent's state lives in one partition of the changelog: the partition its key picks among
the state's partitions (``gateway.engine.routing``), whatever topic or partition the record came
from. The state partitions are the partitions of the *routing topic* — the repartition topic when
the policy re-keys (``input.key_field``), else the input topic — so the worker that owns routing
partition ``p`` owns state partition ``p``:

- a record on the routing topic is protected where it is if its key picks that partition; if not
  (a producer with another partitioner than Kafka's default), it cannot be moved: with a
  repartition topic it is forwarded there, else it is dead-lettered (``wrong_partition``),
  never protected under another respondent's partition (its state would split);
- a record on the input topic of a re-keying policy is protected where it is only when the input
  has as many partitions as the repartition topic (the consumer's range assignor then gives a
  worker input ``p`` and repartition ``p`` together) and its key picks ``p``; every other record
  is forwarded to the repartition topic, whose partition is its state partition.

The changelog must have exactly as many partitions as the routing topic: a mismatch (the topic
was given more partitions, or another policy wrote the changelog) is refused at start, naming
both counts — the states already written would otherwise be looked for in the wrong partitions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.engine.routing import partitions_for_keys
from gateway.errors import PrivgwError
from stream_jobs.kafka import existing_topics
from stream_jobs.settings import Topics, WorkerSettings


class PartitionCountError(PrivgwError):
    """The changelog and the routing topic disagree on their partition count."""


@dataclass(frozen=True, slots=True)
class StateRouting:
    topic: str  # the routing topic: its partition p holds the state of state partition p
    count: int  # its partitions (= the changelog's)
    input_topic: str
    direct: bool  # input records may be protected where they arrive (same partition count)

    @property
    def rekeys(self) -> bool:
        return self.topic != self.input_topic

    def state_partitions(self, keys: list[bytes]) -> list[int]:
        return partitions_for_keys(keys, range(self.count))

    def stays(self, topic: str, partition: int, state_partition: int) -> bool:
        """Whether a record of ``topic``/``partition`` whose key picks ``state_partition`` is
        protected where it arrived (else it is forwarded or dead-lettered)."""
        if topic == self.topic:
            return partition == state_partition
        return self.direct and partition == state_partition


async def wire_routing(
    settings: WorkerSettings, topics: Topics, producer: Any, *, create: bool
) -> StateRouting:
    """The routing of this worker's records; creates the changelog (as many partitions as the
    routing topic) if missing, and refuses one with another partition count."""
    from stream_jobs.partitions.changelog import ensure_changelog_topic  # noqa: PLC0415 (rocksdb extra)

    routing_topic = topics.repartition or topics.input
    count = len(await producer.partitions_for(routing_topic))
    n_input = len(await producer.partitions_for(topics.input))
    changelog = settings.changelog_topic
    if changelog in await existing_topics(settings):
        have = len(await producer.partitions_for(changelog))
        if have != count:
            role = "repartition" if topics.repartition else "input"
            raise PartitionCountError(
                f"changelog topic {changelog} has {have} partitions but the {role} topic "
                f"{routing_topic} has {count}: a respondent's state is found by its key's "
                f"partition among {have}, so it would be looked for in the wrong partition; give "
                f"{routing_topic} {have} partitions again, or start over with a new --group-id "
                "(an empty state)"
            )
    elif create:
        await ensure_changelog_topic(settings, count)
    return StateRouting(
        topic=routing_topic,
        count=count,
        input_topic=topics.input,
        direct=topics.repartition is not None and n_input == count,
    )
