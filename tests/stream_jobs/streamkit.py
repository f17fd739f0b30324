"""Test helpers for the streaming tests: run a worker in-process, produce and read topics with
confluent-kafka (librdkafka, the independent client: kcat cannot parse the development
broker's version reply, DESIGN §8)."""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from gateway.engine.records import SourceRef, ValidRecord, WindowResult
from gateway.keyed.keyed import Keyring
from gateway.policy import Policy, load_policy
from gateway.validation import Validator
from stream_jobs.app import serve
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.kafka import ensure_topics
from stream_jobs.settings import WorkerSettings
from stream_jobs.windows.window_lifecycle import InThread
from stream_jobs.worker import GatewayWorker
from stream_jobs.worker_build import build_worker


@dataclass(frozen=True, slots=True)
class Sent:
    """Where the broker put one produced record."""

    key: bytes | None
    value: bytes | None
    partition: int
    offset: int


@dataclass(slots=True)
class Message:
    key: bytes | None
    value: bytes | None
    partition: int
    offset: int
    headers: dict[str, bytes] = field(default_factory=dict)


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    **config: Any,
) -> list[Sent]:
    """Produce (key, value) pairs with acks=all; returns their coordinates in send order.
    ``config``: extra librdkafka settings (dots written as underscores). Keys are placed as
    Kafka's Java client and aiokafka place them (murmur2), unless ``partitioner`` says
    otherwise (librdkafka's own default is ``consistent_random``, a CRC32)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "partitioner": "murmur2_random",
            **{k.replace("_", "."): v for k, v in config.items()},
        }
    )
    sent: list[Sent | None] = []
    errors: list[str] = []

    def report(index: int) -> Callable[[Any, Any], None]:
        def done(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                sent[index] = Sent(msg.key(), msg.value(), msg.partition(), msg.offset())

        return done

    for key, value in records:
        sent.append(None)
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=report(len(sent) - 1))
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(30) == 0, "records still undelivered after 30 s"
    assert not errors, errors[:3]
    assert all(s is not None for s in sent)
    return [s for s in sent if s is not None]


def consume_all(
    bootstrap: str, topic: str, *, expected: int | None = None, timeout: float = 30.0
) -> list[Message]:
    """Every record of ``topic`` (all partitions, from the beginning).

    Reads until ``expected`` records arrived, or, without ``expected``, until nothing new came
    for a second (the development broker's high watermark can lag the newest batch)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        deadline = time.monotonic() + timeout
        while True:  # the topic may not exist yet
            meta = consumer.list_topics(topic, timeout=10)
            parts = sorted(meta.topics[topic].partitions) if topic in meta.topics else []
            if parts or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Message] = []
        last_new = time.monotonic()
        while time.monotonic() < deadline:
            if expected is not None and len(out) >= expected:
                break
            if expected is None and time.monotonic() - last_new > 1.0:
                break
            for m in consumer.consume(num_messages=10_000, timeout=0.2):
                if m.error() is not None:
                    continue
                last_new = time.monotonic()
                out.append(
                    Message(
                        m.key(),
                        m.value(),
                        m.partition(),
                        m.offset(),
                        {k: v for k, v in (m.headers() or [])},
                    )
                )
        return out
    finally:
        consumer.close()


def settings_for(bootstrap: str, name: str, state_dir: Path, **extra: Any) -> WorkerSettings:
    """Worker settings for a test: its own topics and group, short group timeouts, no exporter."""
    values: dict[str, Any] = {
        "bootstrap": bootstrap,
        "group_id": f"{name}-g",
        "input_topic": f"{name}.in",
        "output_topic": f"{name}.out",
        "partitions": 3,
        "session_timeout_ms": 3000,
        "heartbeat_interval_ms": 500,
        "state_dir": state_dir,
        "metrics_port": 0,
    }
    values.update(extra)
    return WorkerSettings(**values)


def make_worker(policy: Policy, settings: WorkerSettings, secret: str) -> GatewayWorker:
    """The worker ``privgw run`` builds: SQLite state, the engine where ``settings.engine``
    puts it (by default in a child process)."""
    worker: GatewayWorker = build_worker(policy, settings, Keyring(secret.encode()))
    return worker


def create_topics(policy: Policy, settings: WorkerSettings) -> None:
    asyncio.run(ensure_topics(settings, settings.topics(policy), input_too=True))


async def run_until(
    worker: GatewayWorker,
    done: Callable[[GatewayWorker], bool],
    *,
    timeout: float = 60.0,
    during: Callable[[], Any] | None = None,
) -> int:
    """Serve ``worker`` until ``done(worker)`` holds (then stop it cleanly); returns the exit
    code. ``during`` runs in a thread once the worker has its partitions (e.g. a producer)."""
    stop = asyncio.Event()

    async def watch() -> None:
        await asyncio.wait_for(worker.ready.wait(), timeout)
        if during is not None:
            await asyncio.to_thread(during)
        deadline = time.monotonic() + timeout
        while not done(worker):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        stop.set()

    watcher = asyncio.create_task(watch())
    code = await serve(worker, stop=stop, install_signals=False)
    await watcher
    return code


def accounted(worker: GatewayWorker, total: int) -> bool:
    """Every consumed record is published, dead-lettered, held or re-keyed, and all were
    consumed."""
    st = worker.stats
    return st.consumed >= total and st.consumed == st.accounted


def produce_waves(
    bootstrap: str,
    topic: str,
    waves: Iterable[Sequence[tuple[bytes | None, bytes | None]]],
    worker: GatewayWorker,
    sent: list[Sent],
    *,
    seconds: float,
) -> None:
    """Produce wave after wave, each only once the worker has accounted for every record sent
    before it (within ``seconds``), so that no record of a wave arrives after the next one;
    what was produced is appended to ``sent``."""
    for wave in waves:
        sent.extend(produce(bootstrap, topic, wave))
        deadline = time.monotonic() + seconds
        while not accounted(worker, len(sent)):
            assert time.monotonic() < deadline, f"a wave was not accounted for in {seconds:g} s"
            time.sleep(0.05)


def k_claim(policy: Path | None = None) -> tuple[str, ...]:
    """The quasi-identifiers the k claim of ``policy`` covers (default: the Adult policy):
    every published tuple of them must be shared by at least k respondents."""
    root = Path(__file__).resolve().parents[2]
    return tuple(load_policy(policy or root / "deploy" / "policies" / "adult.yaml").k_claim)


def published_qi_groups(
    rows: Sequence[dict[str, Any]], owners: Sequence[str], qis: Sequence[str]
) -> dict[tuple[Any, ...], set[str]]:
    """Published QI tuple -> distinct respondents published with it. ``qis``: the policy's
    whole k claim (``Policy.k_claim``). Fully suppressed rows (every QI null) are left out; a
    partly null tuple is a class of its own, exactly as published."""
    groups: dict[tuple[Any, ...], set[str]] = {}
    for row, owner in zip(rows, owners, strict=True):
        key = tuple(row[q] for q in qis)
        if all(v is None for v in key):
            continue
        groups.setdefault(key, set()).add(owner)
    return groups


def start_worker(
    bootstrap: str, name: str, policy: Path, state: Path, log: Path, *extra: str
) -> Any:
    """`privgw run` as a real process (PRIVGW_SECRET from the environment), log to ``log``.
    Its input topic ``<name>.in`` is created first if missing, as an operator would: the
    worker never creates it."""
    create_input_topic(bootstrap, f"{name}.in", partitions=3)
    env = dict(
        os.environ,
        PRIVGW_SESSION_TIMEOUT_MS="3000",
        PRIVGW_HEARTBEAT_INTERVAL_MS="500",
        PRIVGW_LOG_LEVEL="DEBUG",  # the leakage check below reads every level
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "run",
                "--policy",
                str(policy),
                "--bootstrap",
                bootstrap,
                "--group-id",
                f"{name}-g",
                "--input-topic",
                f"{name}.in",
                "--output-topic",
                f"{name}.out",
                "--partitions",
                "3",
                "--state-dir",
                str(state),
                "--metrics-port",
                "0",
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
        )


def create_input_topic(bootstrap: str, topic: str, *, partitions: int) -> None:
    """Create ``topic`` with the independent client unless it exists."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic in admin.list_topics(timeout=10).topics:
        return
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        try:
            future.result(30)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def high_watermarks(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"hw-{time.monotonic_ns()}"})
    try:
        meta = c.list_topics(topic, timeout=10)
        if topic not in meta.topics or meta.topics[topic].error is not None:
            return 0
        return sum(
            c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in meta.topics[topic].partitions
        )
    finally:
        c.close()


def assert_consistent_republication(
    published: Mapping[bytes, bytes],
    source: Mapping[bytes, Sent],
    *,
    rr: Sequence[str],
    qis: Sequence[str],
    k: int = 5,
    same_tuple: bool = False,
) -> int:
    """Between consecutive waves of each respondent, an unchanged true value was randomized
    the same (attributes ``rr``); every published quasi-identifier tuple (``qis``, all
    together) is shared by at least ``k`` respondents within its wave (a release) and over the
    whole history. ``same_tuple``: also an unchanged respondent republished its tuple unchanged
    (the deferred republication mode's promise). ``published``: record id -> first published
    copy; ``source``: record id -> the produced input. Returns how many checks were made."""
    history: dict[str, list[tuple[int, dict[str, Any], dict[str, Any]]]] = {}
    per_wave: dict[tuple[int, tuple[Any, ...]], set[str]] = {}
    ever: dict[tuple[Any, ...], set[str]] = {}
    for rid, value in published.items():
        truth = orjson.loads(source[rid].value or b"")
        row = orjson.loads(value)
        respondent, wave = str(truth["respondent_id"]), int(truth["wave"])
        history.setdefault(respondent, []).append((wave, truth, row))
        t = tuple(row[q] for q in qis)
        if any(v is not None for v in t):
            per_wave.setdefault((wave, t), set()).add(respondent)
            ever.setdefault(t, set()).add(respondent)
    checked = 0
    for (wave, _), members in per_wave.items():
        assert len(members) >= k, f"a tuple of wave {wave} published by {len(members)} < {k}"
        checked += 1
    assert all(len(members) >= k for members in ever.values())
    for waves in history.values():
        waves.sort(key=lambda w: w[0])
        for (_, t0, p0), (_, t1, p1) in itertools.pairwise(waves):
            for attr in rr:
                if t0[attr] == t1[attr]:
                    assert p0[attr] == p1[attr], f"{attr} republished differently"
                    checked += 1
            if same_tuple and all(t0[q] == t1[q] for q in qis) and p0[qis[0]] is not None:
                assert [p0[q] for q in qis] == [p1[q] for q in qis], "centroid changed"
                checked += 1
    return checked


def small_window_policy(
    tmp: Path,
    max_records: int,
    max_hold_seconds: int = 3,
    pool: str = "release",
    mode: str = "regroup",
) -> Path:
    """deploy/policies/adult.yaml with windows of ``max_records`` records closed every second
    (not earlier: a quiet input does not close them), so that kills and restarts land between
    windows, and a wave decided ``max_hold_seconds`` after its first record arrived (the
    policy's 30 s would make every test wait for it); ``pool: window`` groups in every window,
    publishing as records come; ``mode``: the republication mode; written to ``tmp``."""
    root = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((root / "deploy" / "policies" / "adult.yaml").read_text())
    assert data["republication"]["pool"] == "release", "the Adult policy changed: update this"
    data["window"].update(max_records=max_records, max_seconds=1, max_hold_seconds=max_hold_seconds)
    data["window"].pop("max_idle_seconds", None)
    data["republication"].update(pool=pool, mode=mode)
    path = tmp / "policy.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@functools.cache
def regroup_policy_path() -> Path:
    """:func:`regroup_adult` written once per test process: for the tests of mechanics that do
    not depend on the republication mode (metrics, keys, failures), written when the shipped
    policy was regroup, and run so still; the panel mode has tests of its own."""
    return regroup_adult(Path(tempfile.mkdtemp(prefix="privgw-regroup-")))


def regroup_adult(tmp: Path) -> Path:
    """deploy/policies/adult.yaml as it shipped before the panel mode (regroup, one pool per
    wave), for the tests of what that mode keeps (replay entries, strata, l-diversity)."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "deploy" / "policies" / "adult.yaml").read_text()
    # the text as shipped (its comments too, which some tests edit by), but for the mode
    regroup = "republication: {mode: regroup, wave_attribute: wave, pool: release}\n"
    text, n = re.subn(r"^republication: \{mode: panel.*?\}\n", regroup, text, flags=re.M | re.S)
    assert n == 1, "the Adult policy's republication line changed: update regroup_adult"
    path = tmp / "adult_regroup.yaml"
    path.write_text(text)
    return path


def validated_panel(n: int, *, seed: int = 5) -> list[ValidRecord]:
    """``n`` records of a 3-wave simulated panel, validated against the Adult policy, with
    source coordinates on 3 partitions: what the worker hands the engine."""
    root = Path(__file__).resolve().parents[2]
    validator = Validator(load_policy(root / "deploy" / "policies" / "adult.yaml"))
    survey = PanelSurvey(respondents=max(1, n // 3), waves=3, seed=seed, rows=load_rows())
    out = []
    for offset, (key, value) in enumerate([encode(r) for r in survey.records()][:n]):
        rid, values = validator.decode_and_validate(value, key)  # type: ignore[misc]
        out.append(ValidRecord(rid, values, SourceRef("in", offset % 3, offset, 1000), 0.5))
    return out


class EngineHook(InThread):
    """The engine in the worker's process, with ``before`` run on each window ahead of it, on
    the engine's thread (a test engine that waits, counts or fails)."""

    def before(self, records: Sequence[ValidRecord]) -> None:
        """What happens before the engine protects ``records`` (nothing here)."""

    def prepare(self, records: Sequence[ValidRecord], **options: Any) -> Callable[[], WindowResult]:
        protect = super().prepare(records, **options)

        def call() -> WindowResult:
            self.before(records)
            return protect()

        return call
