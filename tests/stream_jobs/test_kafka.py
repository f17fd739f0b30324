"""The worker's own Kafka helpers: output partitions computed for a window at once, and input
batches in every compression codec Kafka defines."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka.partitioner import DefaultPartitioner, murmur2
from hypothesis import given, settings
from hypothesis import strategies as st
from streamkit import (
    consume_all,
    make_worker,
    produce,
    run_until,
    settings_for,
    small_window_policy,
)

from gateway.policy import load_policy
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.kafka import ensure_topics, murmur2_many, partitions_for_keys
from stream_jobs.worker import GatewayWorker


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.binary(max_size=80), max_size=40))
def test_murmur2_for_many_keys_is_kafkas_murmur2(keys: list[bytes]) -> None:
    assert murmur2_many(keys).tolist() == [murmur2(k) for k in keys]


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=40),
    partitions=st.lists(st.integers(0, 99), min_size=1, max_size=12, unique=True).map(sorted),
)
def test_keys_land_where_kafkas_default_partitioner_puts_them(
    keys: list[bytes], partitions: list[int]
) -> None:
    """Output records keyed by pseudonym, and forwarded or changelog records keyed by
    respondent, must land where any Kafka client would put the same key."""
    default = DefaultPartitioner()
    expected = [default(k, partitions, partitions) for k in keys]
    assert partitions_for_keys(keys, partitions) == expected


def test_no_partitions_is_an_error_not_a_division_by_zero() -> None:
    with pytest.raises(ValueError, match="no partitions"):
        partitions_for_keys([b"k"], [])


@pytest.mark.broker
def test_output_keyed_by_pseudonym_lands_where_kafka_puts_the_key(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    text = small_window_policy(tmp_path, 500).read_text()
    assert "  pseudonym: drop\n" in text, "the Adult policy's output changed: update this test"
    path = tmp_path / "pseudonym.yaml"
    path.write_text(text.replace("  pseudonym: drop\n", "  pseudonym: hmac\n"))
    policy = load_policy(path)
    settings = settings_for(broker.bootstrap, unique_name, tmp_path / "state")
    topics = settings.topics(policy)
    asyncio.run(ensure_topics(settings, topics, input_too=True))
    panel = PanelSurvey(respondents=500, waves=2, seed=4, new_share=0.0, rows=load_rows())
    sent = produce(broker.bootstrap, topics.input, [encode(r) for r in panel.records()])
    worker = make_worker(policy, settings, secret_env)

    def done(w: GatewayWorker) -> bool:
        return w.stats.consumed == len(sent) == w.stats.accounted

    assert asyncio.run(run_until(worker, done, timeout=60)) == 0
    out = consume_all(broker.bootstrap, topics.output, expected=worker.stats.published)
    assert len(out) == worker.stats.published > 0
    default, parts = DefaultPartitioner(), [0, 1, 2]
    assert all(m.key for m in out)
    assert [m.partition for m in out] == [default(m.key, parts, parts) for m in out]
    assert len({m.partition for m in out}) == 3


@pytest.mark.broker
def test_input_batches_in_every_kafka_codec_are_read_and_protected(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    # Producers choose the codec (Java's compression.type, often lz4 or zstd); aiokafka decodes
    # snappy, lz4 and zstd only with cramjam installed, and without it the worker failed on its
    # first fetch (UnsupportedCodecError), again on every restart.
    policy = load_policy(small_window_policy(tmp_path, 500))
    settings = settings_for(broker.bootstrap, unique_name, tmp_path / "state")
    topics = settings.topics(policy)
    asyncio.run(ensure_topics(settings, topics, input_too=True))
    records = [
        encode(r) for r in PanelSurvey(respondents=400, waves=1, seed=6, rows=load_rows()).records()
    ]
    codecs = ("gzip", "snappy", "lz4", "zstd")
    share = len(records) // len(codecs) + 1
    sent = []
    for i, codec in enumerate(codecs):
        part = records[i * share : (i + 1) * share]
        sent += produce(broker.bootstrap, topics.input, part, compression_type=codec)
    assert len(sent) == len(records)
    worker = make_worker(policy, settings, secret_env)

    def decided(w: GatewayWorker) -> bool:  # the wave is decided max_hold_seconds in
        return w.stats.consumed == len(sent) and w.stats.published + w.stats.dlq_total == len(sent)

    assert asyncio.run(run_until(worker, decided, timeout=60)) == 0
    assert worker.stats.consumed == len(records)
    assert worker.stats.dlq_total == 0, dict(worker.stats.dlq)
    assert worker.stats.published == len(records)
