"""Topics whose records wait uncommitted: a panel keeps a wave's records read but unpublished
until the wave closes (up to republication.max_wave_seconds, a week by default), and a restart
reads them again from the input topic. A topic that deletes them sooner loses them: the start
refuses it, warns below twice the wait, and privgw creates the topics it owns keeping them long
enough. The metadata topic and the state changelog are read back whole: compacted, never
deleted by age. Against the real broker, which reports what a topic was created with."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from streamkit import regroup_policy_path, settings_for

from gateway.policy import LongestWait, load_policy, policy_from_yaml
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.kafka import ensure_topics
from stream_jobs.topic_configs import TopicConfigError, check_topic_configs, topic_configs

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
PANEL = load_policy(ROOT / "deploy" / "policies" / "adult.yaml")
WEEK_MS = 7 * 86_400_000


def _topic(broker: EmbeddedBroker, name: str, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(name, 1, 1, config=config)]).values():
        future.result(30)


def _check(broker: EmbeddedBroker, name: str, tmp_path: Path, wait: LongestWait) -> None:
    settings = settings_for(broker.bootstrap, name, tmp_path / "state")
    asyncio.run(check_topic_configs(settings, settings.topics(PANEL), wait))


def test_the_longest_wait_is_the_panel_wave_or_the_hold() -> None:
    wait = PANEL.longest_wait
    assert (wait.seconds, wait.setting) == (604_800.0, "republication.max_wave_seconds")
    assert wait.retention_ms == 2 * WEEK_MS  # twice the wait: an outage as long tolerated
    text = (ROOT / "deploy" / "policies" / "adult.yaml").read_text()
    old = "max_wave_seconds: 604800"
    assert old in text, "the Adult policy's panel settings changed: update this test"
    short = policy_from_yaml(text.replace(old, "max_wave_seconds: 3600"))
    assert short.longest_wait.seconds == 3600
    assert short.longest_wait.retention_ms == WEEK_MS  # Kafka's default, at least
    regroup = load_policy(regroup_policy_path())
    held = regroup.longest_wait
    assert held.seconds == max(regroup.window.max_hold_seconds, regroup.window.max_seconds)
    assert held.setting.startswith("window.")


@pytest.mark.parametrize("days", [0.5, 6.99])
def test_a_topic_deleting_records_before_a_wave_may_close_is_refused(
    broker: EmbeddedBroker, unique_name: str, tmp_path: Path, days: float
) -> None:
    topic = f"{unique_name}.in"
    retention = int(days * 86_400_000)
    _topic(broker, topic, **{"retention.ms": str(retention)})
    with pytest.raises(TopicConfigError) as refused:
        _check(broker, unique_name, tmp_path, PANEL.longest_wait)
    text = str(refused.value)
    for needle in (topic, f"retention.ms {retention}", "republication.max_wave_seconds"):
        assert needle in text, text
    assert f"retention.ms to {2 * WEEK_MS} or more" in text, text


@pytest.mark.parametrize(
    ("config", "warned"),
    [
        ({"retention.ms": str(WEEK_MS)}, "less than twice"),  # Kafka's default: the wait, once
        ({"retention.ms": str(2 * WEEK_MS - 1)}, "less than twice"),
        ({"retention.ms": str(2 * WEEK_MS)}, None),
        ({"retention.ms": "-1"}, None),  # kept for good
        ({}, None),  # this broker reports only what was set: nothing to check
        ({"retention.bytes": "1073741824"}, "deletes records by size"),
        # a panel wave's maximum counts from the records' own timestamps: the producer's clock
        ({"retention.ms": "-1", "message.timestamp.type": "CreateTime"}, "producer's clock"),
        ({"retention.ms": "-1", "message.timestamp.type": "LogAppendTime"}, None),
    ],
)
def test_a_topic_keeping_records_once_the_wait_starts_but_warns(
    broker: EmbeddedBroker,
    unique_name: str,
    tmp_path: Path,
    *,
    caplog: pytest.LogCaptureFixture,
    config: dict[str, str],
    warned: str | None,
) -> None:
    _topic(broker, f"{unique_name}.in", **config)
    with caplog.at_level(logging.WARNING, logger="stream_jobs.topic_configs"):
        _check(broker, unique_name, tmp_path, PANEL.longest_wait)
    lines = [r.getMessage() for r in caplog.records if r.name == "stream_jobs.topic_configs"]
    if warned is None:
        assert lines == []
    else:
        assert len(lines) == 1 and warned in lines[0], lines
        assert f"{unique_name}.in" in lines[0]


def test_the_topics_privgw_creates_keep_waiting_records_twice_the_wait(
    broker: EmbeddedBroker, unique_name: str, tmp_path: Path
) -> None:
    """The repartition topic (and the development input) hold records read but unpublished,
    like the input: created with retention.ms twice the policy's wait; the others as the
    cluster keeps them."""
    text = (ROOT / "deploy" / "policies" / "adult.yaml").read_text()
    old = "  respondent_id: respondent_id"
    assert old in text, "the Adult policy's input section changed: update this test"
    policy = policy_from_yaml(text.replace(old, "  key_field: respondent_id\n" + old, 1))
    settings = settings_for(broker.bootstrap, unique_name, tmp_path / "state")
    topics = settings.topics(policy)
    assert topics.repartition is not None
    asyncio.run(ensure_topics(settings, topics, input_too=True, wait=policy.longest_wait))
    names = [topics.input, topics.repartition, topics.output, topics.dlq]
    kept = asyncio.run(topic_configs(settings, names))
    assert kept[topics.input] == kept[topics.repartition] == {"retention.ms": str(2 * WEEK_MS)}
    assert kept[topics.output] == kept[topics.dlq] == {}
    # and the independent client reads the same setting
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource("topic", topics.repartition)
    entries = admin.describe_configs([resource])[resource].result(30)
    assert entries["retention.ms"].value == str(2 * WEEK_MS)
    asyncio.run(check_topic_configs(settings, topics, policy.longest_wait))  # accepted, no raise


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        ({"cleanup.policy": "delete"}, "deletes its records by age"),
        ({"cleanup.policy": "compact,delete", "retention.ms": str(WEEK_MS)}, "beside compacting"),
        ({"cleanup.policy": "compact,delete", "retention.bytes": "1000000"}, "beside compacting"),
        ({"cleanup.policy": "compact"}, None),
        ({"cleanup.policy": "compact,delete", "retention.ms": "-1"}, None),
        ({}, None),  # this broker reports only what was set: nothing to check
    ],
)
@pytest.mark.parametrize("role", ["meta", "changelog"])
def test_the_topics_read_back_whole_must_be_compacted(
    broker: EmbeddedBroker,
    unique_name: str,
    tmp_path: Path,
    *,
    role: str,
    config: dict[str, str],
    refused: str | None,
) -> None:
    """The metadata topic holds the secret's announcement (a wrong secret is refused against
    it) and the matrices analysts need; the changelog, every respondent's state for a restore.
    Deleted by age, a later start would pass a wrong secret, and a restore would give the
    respondents whose state went fresh draws: the start refuses both."""
    settings = settings_for(
        broker.bootstrap, unique_name, tmp_path / "state", state_backend="partitioned"
    )
    name = settings.topics(PANEL).meta if role == "meta" else settings.changelog_topic
    _topic(broker, name, **config)
    wait = PANEL.longest_wait
    if refused is None:
        asyncio.run(check_topic_configs(settings, settings.topics(PANEL), wait))
        return
    with pytest.raises(TopicConfigError) as error:
        asyncio.run(check_topic_configs(settings, settings.topics(PANEL), wait))
    text = str(error.value)
    assert name in text and refused in text and "set its cleanup.policy to compact" in text
    # the sqlite backend has no changelog: not its concern
    if role == "changelog":
        plain = settings_for(broker.bootstrap, unique_name, tmp_path / "state")
        asyncio.run(check_topic_configs(plain, plain.topics(PANEL), wait))
