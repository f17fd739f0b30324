"""aiokafka clients from the settings: security options, the consumer, the producer, topics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code
from aiokafka.helpers import create_ssl_context

from gateway.engine.routing import murmur2_many, partitions_for_keys
from gateway.errors import PrivgwError
from gateway.policy import LongestWait
from stream_jobs.settings import Topics, WorkerSettings

log = logging.getLogger(__name__)

__all__ = ["murmur2_many", "partitions_for_keys"]  # the hash lives in gateway.engine.routing


class MissingTopicError(PrivgwError):
    """A topic the worker reads does not exist (it never creates the input topic)."""


def security_kwargs(settings: WorkerSettings) -> dict[str, Any]:
    """aiokafka keyword arguments for TLS and SASL (secrets only in the returned dict)."""
    kw: dict[str, Any] = {"security_protocol": settings.security_protocol}
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        ctx = create_ssl_context(
            cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None,
            certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
            keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
            password=(
                settings.ssl_key_password.get_secret_value() if settings.ssl_key_password else None
            ),
        )
        ctx.check_hostname = settings.ssl_check_hostname
        kw["ssl_context"] = ctx
    creds = settings.sasl_credentials()
    if creds is not None:
        kw["sasl_mechanism"] = settings.sasl_mechanism
        kw["sasl_plain_username"], kw["sasl_plain_password"] = creds
    return kw


async def check_bootstrap(settings: WorkerSettings, *, setting: str = "--bootstrap") -> None:
    """Fail fast, in one line, when ``settings.bootstrap`` is not a Kafka broker this client
    can talk to: nothing listening, an unknown host, or a port that is not Kafka (an HTTP
    server, a silent one, TLS settings that do not match). The clients would otherwise retry
    for their request timeout (30 s) and end in an error without a reason."""
    where = f"{setting} {settings.bootstrap} (PRIVGW_BOOTSTRAP)"
    timeout = settings.probe_timeout_s
    problems: list[str] = []
    servers = [s.strip() for s in settings.bootstrap.split(",") if s.strip()]
    if not servers:
        raise PrivgwError(f"{where}: no server given; name one as host:port, e.g. 127.0.0.1:9092")
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise PrivgwError(f"{where}: '{server}' is not host:port, e.g. 127.0.0.1:9092")
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host.strip("[]"), int(port)), timeout
            )
        except ConnectionRefusedError:
            problems.append(f"connection refused at {server} (nothing listens there)")
        except socket.gaierror:
            problems.append(f"unknown host in {server}")
        except (TimeoutError, OSError) as err:
            problems.append(f"cannot connect to {server} ({err.__class__.__name__})")
        else:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            break  # one reachable server is enough to bootstrap
    else:
        raise PrivgwError(f"{where}: {'; '.join(problems)}; start Kafka there or fix the address")
    client = AIOKafkaClient(
        bootstrap_servers=settings.bootstrap,
        client_id=f"{settings.client_id}-probe",
        request_timeout_ms=int(timeout * 1000),
        **security_kwargs(settings),
    )
    try:
        await asyncio.wait_for(client.bootstrap(), timeout)
    except (TimeoutError, KafkaError, OSError) as err:
        why = (
            f"no Kafka answer within {timeout:g} s (PRIVGW_PROBE_TIMEOUT_S)"
            if isinstance(err, TimeoutError)
            else f"the server did not answer as a Kafka broker ({err.__class__.__name__})"
        )
        raise PrivgwError(
            f"{where}: {why}; is it a Kafka listener (not HTTP or another service), with the "
            "TLS/SASL settings it expects (PRIVGW_SECURITY_PROTOCOL)?"
        ) from None
    finally:
        await client.close()


def make_consumer(
    settings: WorkerSettings,
    *topics: str,
    group_id: str | None = None,
    co_partitioned: bool = False,
) -> Any:
    """``co_partitioned``: the range assignor, which gives one member partition ``p`` of every
    subscribed topic with the same partition count (the partitioned state backend needs input
    ``p`` and repartition ``p`` together)."""
    extra: dict[str, Any] = {}
    if co_partitioned:
        extra["partition_assignment_strategy"] = (RangePartitionAssignor,)
    return AIOKafkaConsumer(
        *topics,
        **extra,
        bootstrap_servers=settings.bootstrap,
        client_id=settings.client_id,
        group_id=group_id if group_id is not None else settings.group_id,
        enable_auto_commit=False,
        auto_offset_reset=settings.auto_offset_reset,
        session_timeout_ms=settings.session_timeout_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        max_poll_interval_ms=settings.max_poll_interval_ms,
        max_poll_records=settings.max_poll_records,
        fetch_max_bytes=settings.fetch_max_bytes,
        max_partition_fetch_bytes=settings.max_partition_fetch_bytes,
        request_timeout_ms=settings.request_timeout_ms,
        **security_kwargs(settings),
    )


def make_producer(settings: WorkerSettings) -> Any:
    # acks=all, no idempotence: the development broker refuses InitProducerId, and ordering
    # plus deterministic record ids give effectively-once output without it (DESIGN §6).
    return AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap,
        client_id=settings.client_id,
        acks="all",
        enable_idempotence=False,
        linger_ms=settings.linger_ms,
        max_batch_size=settings.max_batch_bytes,
        max_request_size=max(settings.max_batch_bytes, settings.max_message_bytes + 65536),
        request_timeout_ms=settings.request_timeout_ms,
        **security_kwargs(settings),
    )


async def topic_partitions(settings: WorkerSettings, topic: str) -> int | None:
    """How many partitions ``topic`` has (None: it does not exist). Listed first: describing
    a missing topic creates it on a broker that auto-creates topics (Kafka's default), and a
    mistyped ``privgw wave close --input-topic`` then closed a wave on a new, empty topic."""
    admin = admin_client(settings)
    await admin.start()
    try:
        if topic not in set(await admin.list_topics()):
            return None
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    for t in described:
        if t.get("topic") == topic and t.get("error_code", 0) == 0 and t.get("partitions"):
            return len(t["partitions"])
    return None


async def ensure_topics(
    settings: WorkerSettings,
    topics: Topics,
    *,
    input_too: bool = False,
    wait: LongestWait | None = None,
) -> None:
    """Create the worker's output topics if missing; the metadata topic is compacted.

    The input topic only with ``input_too`` — for a development broker that starts empty (the
    demo, ``--embedded-broker``, tests): a worker never creates it, because a misspelt input
    topic would then be created and the worker would wait on it forever. With the policy's
    ``wait``, the topics whose records wait uncommitted (the input, the repartition topic) keep
    them for ``wait.retention_ms``."""
    rf = settings.replication_factor
    held = {} if wait is None else {"retention.ms": str(wait.retention_ms)}
    wanted = [
        NewTopic(t, settings.partitions, rf, topic_configs=held if t == topics.input else {})
        for t in (topics.input if input_too else None, topics.output, topics.dlq)
        if t is not None
    ]
    if topics.repartition is not None and settings.create_topics:
        # as many partitions as the input (Kafka Streams does the same): a record whose key
        # picks the partition it arrived on is then protected there, without the extra hop
        if input_too:
            await create_missing_topics(settings, wanted[:1])
        n_input = await topic_partitions(settings, topics.input)
        n_repartition = n_input or settings.partitions
        wanted.append(NewTopic(topics.repartition, n_repartition, rf, topic_configs=held))
    await create_missing_topics(
        settings,
        [*wanted, NewTopic(topics.meta, 1, rf, topic_configs={"cleanup.policy": "compact"})],
    )


def admin_client(settings: WorkerSettings) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap,
        client_id=f"{settings.client_id}-admin",
        request_timeout_ms=settings.request_timeout_ms,
        **security_kwargs(settings),
    )


async def existing_topics(settings: WorkerSettings) -> set[str]:
    """The names of the cluster's topics."""
    admin = admin_client(settings)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def check_input_topic(settings: WorkerSettings, topics: Topics) -> None:
    """Raise :class:`MissingTopicError`, naming the setting to fix, if the input is missing
    (or, with topic creation off, any topic the worker writes)."""
    existing = await existing_topics(settings)
    if topics.input not in existing:
        where = (
            " (overridden by --input-topic / PRIVGW_INPUT_TOPIC)" if settings.input_topic else ""
        )
        raise MissingTopicError(
            f"input topic {topics.input} does not exist on {settings.bootstrap}: check the "
            f"policy key input.topic{where}; the worker never creates its input topic, so "
            "create it with your Kafka tooling first"
        )
    outputs = [topics.output, topics.dlq, topics.meta, topics.repartition]
    missing = [t for t in outputs if t is not None and t not in existing]
    if missing and not settings.create_topics:
        raise MissingTopicError(
            f"topics {', '.join(missing)} do not exist on {settings.bootstrap} and "
            "PRIVGW_CREATE_TOPICS (--create-topics) is false: create them, or let the worker "
            "create them"
        )


_warned_replication: set[tuple[str, int]] = set()  # (bootstrap, brokers): warn once each


async def create_missing_topics(settings: WorkerSettings, topics: Sequence[NewTopic]) -> None:
    """Create those of ``topics`` that do not exist yet (a concurrent creator may win), with
    the replication factor capped at the cluster's broker count."""
    if not settings.create_topics:
        return
    admin = admin_client(settings)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [t for t in topics if t.name not in existing]
        if not wanted:
            return
        brokers = len((await admin.describe_cluster())["brokers"])
        if brokers and any(t.replication_factor > brokers for t in wanted):
            if (settings.bootstrap, brokers) not in _warned_replication:
                _warned_replication.add((settings.bootstrap, brokers))
                log.warning(
                    "PRIVGW_REPLICATION_FACTOR is %d but the cluster has %d broker(s): topics "
                    "are created with replication factor %d (no copy survives a lost broker)",
                    settings.replication_factor,
                    brokers,
                    brokers,
                )
            wanted = [
                NewTopic(
                    t.name,
                    t.num_partitions,
                    min(t.replication_factor, brokers),
                    topic_configs=t.topic_configs,
                )
                for t in wanted
            ]
        response = await admin.create_topics(wanted)
        for name, code, *_ in response.topic_errors:
            if code == TopicAlreadyExistsError.errno:  # a concurrent creator won the race
                continue
            if code:
                raise for_code(code)(f"cannot create topic {name}")
            log.info("created topic %s", name)
    finally:
        await admin.close()


BatchItem = tuple[bytes | None, bytes, int | None, list[Any]]  # key, value, timestamp, headers


async def send_batches(
    producer: Any, topic: str, by_partition: Mapping[int, Sequence[BatchItem]]
) -> list[Awaitable[Any]]:
    """Send records as few producer batches per partition as fit; a record larger than a batch
    goes alone. Returns the futures of the broker's acknowledgements."""
    futures: list[Awaitable[Any]] = []
    for partition, items in by_partition.items():
        batch = producer.create_batch()
        for key, value, ts, headers in items:
            if batch.append(key=key, value=value, timestamp=ts, headers=headers) is not None:
                continue
            if batch.record_count():  # the batch is full: send it, start another
                futures.append(await producer.send_batch(batch, topic, partition=partition))
                batch = producer.create_batch()
                if batch.append(key=key, value=value, timestamp=ts, headers=headers) is not None:
                    continue
            # larger than a batch: send it alone
            futures.append(
                await producer.send(
                    topic,
                    value=value,
                    key=key,
                    partition=partition,
                    timestamp_ms=ts,
                    headers=headers,
                )
            )
        if batch.record_count():
            futures.append(await producer.send_batch(batch, topic, partition=partition))
    return futures
