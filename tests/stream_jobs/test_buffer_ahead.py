"""While the engine protects a window, the worker goes on validating into the buffer, past the
window's count, where window sizes do not shape the groups (``republication.pool: release``),
up to ``buffer_ahead_records``; with ``pool: window`` a due window waits for the engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from streamkit import (
    EngineHook,
    accounted,
    create_topics,
    produce,
    run_until,
    settings_for,
    small_window_policy,
)

from gateway.engine.engine import Engine
from gateway.engine.records import ValidRecord
from gateway.keyed.keyed import Keyring
from gateway.policy import load_policy
from state.sqlite_store import SQLiteStore
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.worker import GatewayWorker

pytestmark = pytest.mark.broker

WINDOW, FETCH, AHEAD, RECORDS = 40, 10, 150, 300


class SlowEngine(EngineHook):
    """The engine, a while longer on every window (so the worker has records to fetch while it
    waits); counts the records each window brings that no earlier window did."""

    def __init__(self, engine: Engine, seconds: float) -> None:
        super().__init__(engine)
        self._seconds = seconds
        self.new_per_window: list[int] = []
        self._seen: set[tuple[int, int]] = set()

    def before(self, records: Sequence[ValidRecord]) -> None:
        at = [(r.source.partition, r.source.offset) for r in records if r.source is not None]
        self.new_per_window.append(len(set(at) - self._seen))
        self._seen.update(at)
        time.sleep(self._seconds)


@pytest.mark.parametrize("pool", ["release", "window"])
def test_a_due_window_grows_while_the_engine_is_busy_only_under_release_pools(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path, pool: str
) -> None:
    policy = load_policy(small_window_policy(tmp_path, WINDOW, pool=pool))
    settings = settings_for(
        broker.bootstrap,
        unique_name,
        tmp_path / "state",
        max_poll_records=FETCH,
        buffer_ahead_records=AHEAD,
        flush_held_on_shutdown=True,
    )
    create_topics(policy, settings)
    survey = PanelSurvey(respondents=RECORDS, waves=1, seed=3, rows=load_rows())
    produce(broker.bootstrap, settings.topics(policy).input, [encode(r) for r in survey.records()])
    store = SQLiteStore(Path(settings.state_dir) / "state.db")
    slow = SlowEngine(Engine(policy, keyring=Keyring(secret_env.encode()), store=store), 0.4)
    worker = GatewayWorker(policy, settings, slow)
    worker.closers.append(store.close)
    code = asyncio.run(run_until(worker, lambda w: accounted(w, RECORDS), timeout=60))
    assert code == 0 and accounted(worker, RECORDS)
    largest = max(slow.new_per_window)
    # a window is due at WINDOW new records; one fetch brings at most FETCH more
    if pool == "release":
        assert WINDOW + FETCH <= largest < AHEAD + FETCH, slow.new_per_window
    else:
        assert largest < WINDOW + FETCH, slow.new_per_window
