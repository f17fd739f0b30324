"""Worker settings that depend on each other: where the engine runs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stream_jobs.settings import WorkerSettings


def test_the_engine_runs_in_a_child_process_by_default_with_sqlite_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("stream_jobs.settings.usable_cpus", lambda: 2)
    assert WorkerSettings().engine_in_process
    assert not WorkerSettings(state_backend="partitioned").engine_in_process
    assert not WorkerSettings(engine="thread").engine_in_process
    monkeypatch.setattr("stream_jobs.settings.usable_cpus", lambda: 1)
    assert not WorkerSettings().engine_in_process  # one core: a second process gains nothing
    assert WorkerSettings(engine="process").engine_in_process


def test_an_engine_process_with_partitioned_state_is_refused_with_the_fix() -> None:
    with pytest.raises(ValidationError, match="set engine to thread or auto"):
        WorkerSettings(engine="process", state_backend="partitioned")


def test_engine_shards_need_sqlite_state_and_a_sane_count() -> None:
    assert WorkerSettings().engine_shards is None  # the state dir's own count, else 1
    assert WorkerSettings(engine_shards=4, engine="thread").engine_shards == 4
    with pytest.raises(ValidationError, match="unset engine_shards"):
        WorkerSettings(engine_shards=2, state_backend="partitioned")
    with pytest.raises(ValidationError, match="engine_shards"):
        WorkerSettings(engine_shards=0)
