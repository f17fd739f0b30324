"""What the topics the worker depends on keep, checked before it starts.

A record stays uncommitted until it is published (a panel wave's until the wave closes, up to
``republication.max_wave_seconds``), and a restart reads it again from the input (or the
repartition topic): one that deleted it meanwhile has lost it, since the consumer moves on to the
oldest record left. The metadata topic and the state changelog are read back whole (the
secret's announcement, the analysts' matrices, every respondent's state on a restore): they must
be compacted, never deleted by age or size."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from gateway.errors import PrivgwError
from gateway.policy import LongestWait, duration_text
from stream_jobs.kafka import admin_client
from stream_jobs.settings import Topics, WorkerSettings

log = logging.getLogger(__name__)

CHECKED = ("retention.ms", "retention.bytes", "cleanup.policy", "message.timestamp.type")


_STAMPS = "message.timestamp.type"


class TopicConfigError(PrivgwError):
    """A topic the worker depends on deletes what it must read again."""


async def topic_configs(
    settings: WorkerSettings, names: Sequence[str]
) -> dict[str, dict[str, str]]:
    """The settings of :data:`CHECKED` the broker reports for the topics ``names``. A topic
    whose configuration cannot be read (absent, say) has no entry; a broker that reports only
    what a topic was created with (the development broker) gives only those."""
    admin = admin_client(settings)
    await admin.start()
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        )
    finally:
        await admin.close()
    found: dict[str, dict[str, str]] = {}
    for response in responses:
        for resource in response.to_object()["resources"]:
            if resource["error_code"] == 0:
                found[resource["resource_name"]] = {
                    e["config_names"]: e["config_value"]
                    for e in resource["config_entries"]
                    if e["config_names"] in CHECKED and e["config_value"] is not None
                }
    return found


async def check_topic_configs(settings: WorkerSettings, topics: Topics, wait: LongestWait) -> None:
    """Refuse (:class:`TopicConfigError`) a topic that deletes what the worker reads again: the
    input or the repartition topic keeping records less than ``wait``, the metadata topic or
    the partitioned backend's changelog not compacted, or compacted and deleted by age too.
    Warn when a waiting record is kept less than twice ``wait`` (the margin is the outage
    around its decision the topic tolerates), or by size. A broker that denies
    DescribeConfigs: a warning, and the start goes on."""
    waiting = [t for t in (topics.input, topics.repartition) if t is not None]
    kept_whole = {topics.meta: "the metadata topic (secret announcements, policies, matrices)"}
    if settings.state_backend == "partitioned":
        kept_whole[settings.changelog_topic] = "the state changelog (every respondent's state)"
    try:
        found = await topic_configs(settings, [*waiting, *kept_whole])
    except KafkaError as err:
        names = ", ".join([*waiting, *kept_whole])
        log.warning("cannot read the configuration of %s (%s): not checked", names, err)
        return
    for name in waiting:
        _check_waiting(name, found.get(name, {}), wait)
    for name, what in kept_whole.items():
        _check_kept_whole(name, what, found.get(name, {}))


def _number(config: dict[str, str], key: str) -> int:
    value = config.get(key, "-1")
    return int(value) if value.lstrip("-").isdigit() else -1


def _check_waiting(name: str, config: dict[str, str], wait: LongestWait) -> None:
    ms, size = _number(config, "retention.ms"), _number(config, "retention.bytes")
    need_ms, wanted = math.ceil(wait.seconds * 1000), wait.retention_ms
    waits = f"{duration_text(wait.seconds)} ({wait.setting})"
    keeps = f"{duration_text(ms / 1000)} (retention.ms {ms})"
    if 0 <= ms < need_ms:
        raise TopicConfigError(
            f"topic {name} deletes records after {keeps} but the policy may keep one waiting "
            f"{waits} before it is published: a restart would find it deleted. Raise the "
            f"topic's retention.ms to {wanted} or more, or lower {wait.setting}"
        )
    if 0 <= ms < 2 * need_ms:
        log.warning(
            "topic %s keeps records %s, less than twice the %s a record may wait: a worker "
            "outage around a wave's close can find its records deleted; set retention.ms to "
            "%d or more",
            name,
            keeps,
            waits,
            wanted,
        )
    if size >= 0:
        log.warning(
            "topic %s deletes records by size (retention.bytes %d): records waiting up to %s "
            "can be deleted before they are published; set retention.bytes to -1",
            name,
            size,
            waits,
        )
    if wait.setting.endswith("max_wave_seconds") and config.get(_STAMPS) == "CreateTime":
        # a probe's five records stamped in 1970 decided an open wave at once, half of it
        # published with its quasi-identifiers suppressed
        log.warning(
            "topic %s stamps records with the producer's clock (%s CreateTime): a panel "
            "wave's maximum counts from its records' own timestamps, so k records stamped far "
            "in the past decide the open wave at once; set %s to LogAppendTime",
            name,
            _STAMPS,
            _STAMPS,
        )


def _check_kept_whole(name: str, what: str, config: dict[str, str]) -> None:
    cleanup = config.get("cleanup.policy")
    if cleanup is None:
        return
    policies = {p.strip() for p in cleanup.split(",")}
    ms, size = _number(config, "retention.ms"), _number(config, "retention.bytes")
    if "compact" not in policies:
        why = "deletes its records by age"
    elif "delete" in policies and (ms >= 0 or size >= 0):
        why = "deletes its older records by age or size beside compacting them"
    else:
        return
    raise TopicConfigError(
        f"topic {name} is {what}, read back whole, but it {why} (cleanup.policy {cleanup}): "
        "set its cleanup.policy to compact"
    )
