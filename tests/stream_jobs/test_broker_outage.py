"""Broker outage (issue: reliability, scenario 2): the broker process is stopped in the middle
of the stream and started again on the same port; the worker — one process, never restarted —
reconnects by itself and protects everything produced after the broker came back.

The development broker keeps its log in memory, so the broker that comes back is empty: the
topics are recreated here (the operator's job), the records that were in the old log are gone
(the test does not count them), and the new log starts again at offset 0, below the offsets the
worker had consumed. The worker must notice that (it rewinds its commit bookkeeping) rather
than wait for offsets it has seen. With a broker that keeps its log (Kafka in
docker-compose.yml) only the reconnection part applies.

What is checked: the worker process is the same and still running; every record produced after
the restart is published (by its record id) or dead-lettered; duplicates are byte-identical;
respondents whose true values did not change since before the outage are published exactly as
before it (their state is the worker's own, and survived).
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import orjson
import pytest
from streamkit import consume_all, high_watermarks, produce, small_window_policy, start_worker

from gateway.policy import load_policy
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows
from stream_jobs.kafka import ensure_topics
from stream_jobs.settings import WorkerSettings

pytestmark = [pytest.mark.broker, pytest.mark.slow]

RR = ("occupation", "income")


def _recreate_topics(bootstrap: str, name: str, policy: Path) -> None:
    settings = WorkerSettings(
        bootstrap=bootstrap, input_topic=f"{name}.in", output_topic=f"{name}.out", partitions=3
    )
    asyncio.run(ensure_topics(settings, settings.topics(load_policy(policy)), input_too=True))


def _wait_for(predicate: object, what: str, timeout: float, worker: object, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert worker.poll() is None, log.read_text()[-3000:]  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.2)


@pytest.mark.parametrize("mode", ["group", "static"])
def test_worker_reconnects_after_a_broker_restart_without_restarting(
    mode: str, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    """Group mode rejoins the (new) group and starts from its (absent) commits; static mode
    keeps its partitions and must see that their logs went back to offset 0."""
    policy = small_window_policy(tmp_path, 500)
    in_topic, out_topic = f"{unique_name}.in", f"{unique_name}.out"
    panel = PanelSurvey(respondents=1_500, waves=4, seed=31, new_share=0.0, rows=load_rows())
    by_wave: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for r in panel.records():
        by_wave.setdefault(int(r["wave"]), []).append(encode(r))
    log = tmp_path / "worker.log"
    broker = EmbeddedBroker(log_dir=tmp_path / "broker").start()  # its own: it is stopped
    extra = ("--workers", "1", "--worker-index", "0") if mode == "static" else ()
    worker = start_worker(broker.bootstrap, unique_name, policy, tmp_path / "state", log, *extra)
    try:
        assert consume_all(broker.bootstrap, f"{out_topic}.meta", expected=1, timeout=60)
        # wave 1, fully protected before the outage: the reference for republication
        sent_before = produce(broker.bootstrap, in_topic, by_wave[1])
        before = consume_all(broker.bootstrap, out_topic, expected=len(by_wave[1]), timeout=60)
        assert len(before) == len(by_wave[1])
        # wave 2, and the broker goes away while the worker is working through it
        produce(broker.bootstrap, in_topic, by_wave[2])
        _wait_for(
            lambda: high_watermarks(broker.bootstrap, out_topic) > len(by_wave[1]),
            "wave 2 under way",
            60,
            worker,
            log,
        )
        pid = broker.pid
        broker.stop()
        t_down = time.monotonic()
        assert pid is not None and broker.pid is None
        time.sleep(3.0)  # the worker's fetches, sends and commits fail meanwhile
        assert worker.poll() is None, log.read_text()[-3000:]
        broker.start()  # same port, empty
        assert broker.pid not in (None, pid)
        _recreate_topics(broker.bootstrap, unique_name, policy)
        # the new log restarts at offset 0; produced once the worker has seen the empty
        # topic, and fewer per partition than it consumed before, so that it cannot take the
        # new records for ones it already has
        time.sleep(3.0)
        after = produce(broker.bootstrap, in_topic, by_wave[3][:1200])
        ids = {f"{in_topic}/{s.partition}/{s.offset}".encode(): s for s in after}
        out: list = []

        def all_out() -> bool:
            nonlocal out
            out = consume_all(broker.bootstrap, out_topic, timeout=5)
            dlq = consume_all(broker.bootstrap, f"{in_topic}.dlq", timeout=2)
            seen = {m.headers["record_id"] for m in out} | {
                f"{in_topic}/{m.headers['source_partition'].decode()}/"
                f"{m.headers['source_offset'].decode()}".encode()
                for m in dlq
            }
            return set(ids) <= seen

        _wait_for(all_out, "every record produced after the restart out", 120, worker, log)
        recovered = time.monotonic() - t_down
        assert worker.poll() is None  # the same process throughout
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        broker.stop()

    first: dict[bytes, bytes] = {}
    for m in out:
        rid = m.headers["record_id"]
        assert first.setdefault(rid, m.value or b"") == m.value, "a duplicate differs"

    def published_by_respondent(
        sent: list, published: dict[bytes, bytes]
    ) -> dict[str, tuple[dict, dict]]:
        rows = {}
        for s in sent:
            rid = f"{in_topic}/{s.partition}/{s.offset}".encode()
            if rid in published:
                truth = orjson.loads(s.value)
                rows[truth["respondent_id"]] = (truth, orjson.loads(published[rid]))
        return rows

    old = published_by_respondent(sent_before, {m.headers["record_id"]: m.value for m in before})
    new = published_by_respondent(after, first)
    checked = 0
    for respondent, (truth, row) in new.items():
        if respondent not in old:
            continue
        truth0, row0 = old[respondent]
        for attr in RR:
            if truth0[attr] == truth[attr]:
                assert row0[attr] == row[attr], f"{attr} published differently after the outage"
                checked += 1
    assert checked > 1000, checked
    if mode == "static":
        assert "below the consumed offset" in log.read_text(), "the worker missed the new log"
    print(
        f"broker outage ({mode}): {len(after)} in after the restart, all {len(after)} out or DLQ "
        f"{recovered:.1f} s after the broker went down, {len(out) - len(first)} identical "
        f"duplicates, 0 worker restarts, {checked} unchanged values republished identically"
    )
