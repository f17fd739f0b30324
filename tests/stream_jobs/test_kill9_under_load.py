"""kill -9 five times under load (issue: reliability, scenario 1), the way Kafka's own system
tests kill their processors: 100,000 records over 3 partitions, the worker SIGKILLed at random
(seeded) moments and restarted each time. Afterwards every input offset (the records' sequence
ids) is in the protected topic or the DLQ, duplicates are byte-identical with the same record
id, and every respondent is republished identically whenever its true values did not change."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest
from streamkit import (
    assert_consistent_republication,
    consume_all,
    high_watermarks,
    k_claim,
    produce,
    small_window_policy,
    start_worker,
)

from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

pytestmark = [pytest.mark.broker, pytest.mark.slow]

QIS = k_claim()  # the whole quasi-identifier tuple the k claim covers
RR = ("occupation", "income")
KILLS = 5


def test_five_kills_under_load_lose_nothing_and_change_nothing(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    policy = small_window_policy(tmp_path, 2000)
    in_topic, out_topic = f"{unique_name}.in", f"{unique_name}.out"
    panel = PanelSurvey(respondents=25_000, waves=4, seed=12, new_share=0.0, rows=load_rows())
    records = [encode(r) for r in panel.records()][:100_000]
    rng = random.Random(20261123)
    log = tmp_path / "worker.log"

    def launch() -> object:
        return start_worker(broker.bootstrap, unique_name, policy, tmp_path / "state", log)

    worker = launch()
    restarts, t_start = 0, time.monotonic()
    try:
        assert consume_all(broker.bootstrap, f"{out_topic}.meta", expected=1, timeout=60)
        sent = produce(broker.bootstrap, in_topic, records)
        progress = 0
        for _ in range(KILLS):
            # once this incarnation has published something, a random moment: mid-window,
            # mid-flush or between the outputs and the commit
            deadline = time.monotonic() + 60
            while (now := high_watermarks(broker.bootstrap, out_topic)) <= progress:
                assert worker.poll() is None, log.read_text()[-3000:]  # type: ignore[attr-defined]
                assert time.monotonic() < deadline, "no progress after a restart"
                time.sleep(0.05)
            progress = now
            time.sleep(rng.uniform(0.0, 0.8))
            worker.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
            worker.wait(10)  # type: ignore[attr-defined]
            worker = launch()
            restarts += 1
        deadline = time.monotonic() + 300
        while True:
            out = consume_all(broker.bootstrap, out_topic, timeout=8)
            ids = {m.headers["record_id"] for m in out}
            if len(ids) >= len(sent):
                break
            assert worker.poll() is None, log.read_text()[-3000:]  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, f"{len(ids)} of {len(sent)} after the kills"
            time.sleep(1.0)
        recovered = time.monotonic() - t_start
        worker.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
        assert worker.wait(60) == 0  # type: ignore[attr-defined]
    finally:
        if worker.poll() is None:  # type: ignore[attr-defined]
            worker.kill()  # type: ignore[attr-defined]
            worker.wait(10)  # type: ignore[attr-defined]

    source = {f"{in_topic}/{s.partition}/{s.offset}".encode(): s for s in sent}
    first: dict[bytes, bytes] = {}
    for m in out:
        rid = m.headers["record_id"]
        assert first.setdefault(rid, m.value or b"") == m.value, "a duplicate differs"
    assert set(first) == set(source), "records lost"
    assert len({s.partition for s in sent}) == 3
    checked = assert_consistent_republication(first, source, rr=RR, qis=QIS)
    assert checked > 100_000
    print(
        f"kill -9 x{KILLS}: {len(sent)} in, {len(first)} out, 0 DLQ, 0 lost, "
        f"{len(out) - len(first)} duplicates (identical), {restarts} restarts, "
        f"all out {recovered:.1f} s after the start"
    )
