"""A window the engine fails on is read again, never skipped: the failing worker stops without
protecting or committing what it fetched after that window, and the next worker in the group
publishes every record."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from streamkit import (
    EngineHook,
    consume_all,
    create_topics,
    make_worker,
    produce,
    run_until,
    settings_for,
    small_window_policy,
)

from gateway.engine.engine import Engine
from gateway.engine.records import NO_MARKS, InputMarks, ValidRecord, WindowResult
from gateway.keyed.keyed import Keyring
from gateway.policy import Policy, load_policy
from state.sqlite_store import SQLiteStore
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.engine_process.engine_process import EngineProcess, EngineShards, PackedRecords
from stream_jobs.settings import WorkerSettings
from stream_jobs.worker import GatewayWorker

pytestmark = pytest.mark.broker

CHUNKS, CHUNK = 6, 40


class FailsOnWindow(EngineHook):
    """The engine, failing on its ``n``-th window after taking a while (so the worker has
    fetched and buffered the next records by then)."""

    def __init__(self, engine: Engine, n: int) -> None:
        super().__init__(engine)
        self._n, self.calls = n, 0

    def before(self, records: Sequence[ValidRecord]) -> None:
        self.calls += 1
        if self.calls == self._n:
            time.sleep(2.0)
            raise RuntimeError("injected engine failure")


def test_records_of_a_failed_window_are_read_again_not_skipped(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    policy = load_policy(small_window_policy(tmp_path, CHUNK))
    settings = settings_for(
        broker.bootstrap, unique_name, tmp_path / "state", flush_held_on_shutdown=True
    )
    create_topics(policy, settings)
    inputs, sent, feed = _feeder(broker, settings.topics(policy).input)
    store = SQLiteStore(Path(settings.state_dir) / "state.db")
    failing = FailsOnWindow(Engine(policy, keyring=Keyring(secret_env.encode()), store=store), 2)
    first = GatewayWorker(policy, settings, failing)
    first.closers.append(store.close)
    code = asyncio.run(run_until(first, lambda w: w._stopped.is_set(), during=feed, timeout=30))
    assert code == 1 and failing.calls >= 2
    assert len(sent) == len(inputs)

    _next_worker_publishes_everything(broker, policy, settings, secret_env, sent)


class PackingFailsOnWindow:
    """A real engine process whose window packing fails at the ``n``-th hand-over (on the
    worker's event loop, before anything reaches the child)."""

    def __init__(self, engine: EngineProcess, n: int) -> None:
        self._engine, self._n, self.calls = engine, n, 0
        self.tails: list[bool] = []  # whether each window came with records packed ahead
        self.version = engine.version
        self.pack = engine.pack
        self.protect_window = engine.protect_window

    def metadata(self) -> dict[str, object]:
        return self._engine.metadata()

    def prepare(
        self,
        records: Sequence[ValidRecord],
        *,
        now: float,
        flush_all: bool = False,
        tail: PackedRecords | None = None,
        marks: InputMarks = NO_MARKS,
    ) -> Callable[[], WindowResult]:
        self.calls += 1
        self.tails.append(tail is not None)
        if self.calls == self._n:
            raise ValueError("injected packing failure")
        return self._engine.prepare(
            records,
            now=now,
            flush_all=flush_all,
            tail=tail,
            marks=marks,
        )


def test_a_window_that_fails_to_pack_is_read_again_not_skipped(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    policy = load_policy(small_window_policy(tmp_path, CHUNK))
    settings = settings_for(
        broker.bootstrap,
        unique_name,
        tmp_path / "state",
        flush_held_on_shutdown=True,
        engine="process",
    )
    create_topics(policy, settings)
    inputs, sent, feed = _feeder(broker, settings.topics(policy).input)
    real = make_worker(policy, settings, secret_env)
    assert isinstance(real.engine, EngineProcess)
    failing = PackingFailsOnWindow(real.engine, 2)
    first = GatewayWorker(policy, settings, failing)
    first.closers.append(real.engine.close)
    code = asyncio.run(run_until(first, lambda w: w._stopped.is_set(), during=feed, timeout=30))
    assert code == 1 and failing.calls == 2  # nothing handed over after the failure
    assert any(failing.tails)  # records were packed as they arrived
    assert len(sent) == len(inputs)
    _next_worker_publishes_everything(broker, policy, settings, secret_env, sent)


def test_a_shard_killed_mid_stream_loses_nothing(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    """One of two engine shards dies mid-stream (the other may have stored its part of the
    window): the worker stops, and the next one publishes every record, the same bytes. Groups
    form in every window, so that windows are published while records keep coming."""
    policy = load_policy(small_window_policy(tmp_path, 2 * CHUNK, pool="window"))
    settings = settings_for(
        broker.bootstrap,
        unique_name,
        tmp_path / "state",
        flush_held_on_shutdown=True,
        engine="process",
        engine_shards=2,
    )
    create_topics(policy, settings)
    inputs, sent, feed = _feeder(broker, settings.topics(policy).input)
    first = make_worker(policy, settings, secret_env)
    assert isinstance(first.engine, EngineShards)
    victim = first.engine.pids[1]

    feeder = threading.Thread(target=feed)

    def feed_and_kill() -> None:  # killed once a window is out, while records keep coming
        feeder.start()
        deadline = time.monotonic() + 20
        while not first.stats.published and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(victim, signal.SIGKILL)

    code = asyncio.run(
        run_until(first, lambda w: w._stopped.is_set(), during=feed_and_kill, timeout=30)
    )
    assert code == 1
    feeder.join(timeout=30)
    assert len(sent) == len(inputs)
    _next_worker_publishes_everything(broker, policy, settings, secret_env, sent)


def _feeder(broker: EmbeddedBroker, topic: str) -> tuple[list[Any], list[Any], Any]:
    survey = PanelSurvey(respondents=CHUNKS * CHUNK, waves=1, seed=3, rows=load_rows())
    inputs = [encode(r) for r in survey.records()][: CHUNKS * CHUNK]
    sent: list[Any] = []

    def feed() -> None:  # a window's worth at a time, so the failure lands mid-stream
        for start in range(0, len(inputs), CHUNK):
            sent.extend(produce(broker.bootstrap, topic, inputs[start : start + CHUNK]))
            time.sleep(0.4)

    return inputs, sent, feed


def _next_worker_publishes_everything(
    broker: EmbeddedBroker,
    policy: Policy,
    settings: WorkerSettings,
    secret_env: str,
    sent: list[Any],
) -> None:
    """The next worker of the group (state kept) takes over from the last commit: every
    record is published, and any copy is byte-identical."""
    topics = settings.topics(policy)
    second = make_worker(policy, settings, secret_env)

    def caught_up(w: GatewayWorker) -> bool:
        st = w.stats
        return st.consumed > 0 and st.consumed == st.accounted and not any(st.lag.values())

    assert asyncio.run(run_until(second, caught_up, timeout=60)) == 0
    out = consume_all(broker.bootstrap, topics.output)
    copies: dict[str, set[bytes]] = {}
    for m in out:
        assert m.value is not None
        copies.setdefault(orjson.loads(m.value)["record_id"], set()).add(m.value)
    expected = {f"{topics.input}/{s.partition}/{s.offset}" for s in sent}
    assert expected <= copies.keys(), f"{len(expected - copies.keys())} records never published"
    assert all(len(v) == 1 for v in copies.values()), "a record published twice, differently"
