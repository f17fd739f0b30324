"""A Kafka client's stop leaves none of its tasks pending (issue 45, item 9: "ERROR asyncio:
Task was destroyed but it is pending!" at shutdown). A stop cut short — the worker gave up on a
broker that went away — left the producer's sender, its metadata synchroniser and the
``MessageAccumulator.close`` that aiokafka's ``stop`` starts; once garbage-collected, each was
logged as destroyed. Real clients, a real broker stopped under them."""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path

import pytest

from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.kafka import make_consumer, make_producer
from stream_jobs.settings import WorkerSettings
from stream_jobs.worker import GatewayWorker

pytestmark = pytest.mark.broker


def _pending_aiokafka() -> list[str]:
    return sorted(
        task.get_coro().__qualname__
        for task in asyncio.all_tasks()
        if not task.done() and "aiokafka" in task.get_coro().cr_code.co_filename
    )


@pytest.mark.parametrize("broker_away", [False, True])
def test_stopped_clients_leave_no_task_to_be_destroyed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, broker_away: bool
) -> None:
    async def scenario(own: EmbeddedBroker) -> list[str]:
        settings = WorkerSettings(bootstrap=own.bootstrap)
        producer = make_producer(settings)
        await producer.start()
        consumer = make_consumer(settings, "t", group_id="g")
        await consumer.start()
        for _ in range(50):
            await producer.send("t", b"x")
        await asyncio.sleep(0.5)
        if broker_away:  # records still to deliver, and no broker to take them
            own.stop()
            for _ in range(50):
                await producer.send("t", b"x")
        await GatewayWorker._stop_client(consumer, broker_away)
        await GatewayWorker._stop_client(producer, broker_away)
        left = _pending_aiokafka()
        del producer, consumer
        gc.collect()  # what is pending and unreferenced is destroyed (and logged) here
        await asyncio.sleep(0)
        return left

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with EmbeddedBroker(log_dir=tmp_path / "broker") as own:
            left = asyncio.run(scenario(own))
        gc.collect()
    assert left == []
    assert "Task was destroyed" not in caplog.text
