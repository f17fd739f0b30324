"""kill -9 of a real `privgw run` process in the middle of a stream, then a restart.

Afterwards: 0 records lost (every input offset is in the output or the DLQ), every duplicate
byte-identical to its first copy, and every respondent republished identically whenever its
true values did not change (DESIGN §5, §6). Also: the state files hold no raw respondent id or
value, and SIGTERM ends the worker cleanly with exit code 0.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

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

ROOT = Path(__file__).resolve().parents[2]
QIS = k_claim()  # the whole quasi-identifier tuple the k claim covers
RR = ("occupation", "income")


def test_kill_9_mid_stream_loses_nothing_and_republishes_identically(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    policy = small_window_policy(tmp_path, 400)
    state, log = tmp_path / "state", tmp_path / "worker.log"
    out_topic, in_topic = f"{unique_name}.out", f"{unique_name}.in"
    panel = list(PanelSurvey(respondents=1200, waves=3, seed=9, rows=load_rows()).records())
    canaries = [f"CANARY-ID-{i:03d}-b2c9" for i in range(5)]
    for i, rid in enumerate(canaries):  # canary ids (valid records) and a canary in the DLQ
        panel[i * 300]["respondent_id"] = rid
    bad = dict(panel[1], occupation="CANARY-VALUE-e41a")

    worker = start_worker(broker.bootstrap, unique_name, policy, state, log)
    try:
        deadline = time.monotonic() + 60
        # the worker publishes its metadata record once its topics exist
        assert consume_all(broker.bootstrap, f"{out_topic}.meta", expected=1, timeout=60)
        records = [*map(encode, panel), encode(bad)]
        sent = produce(broker.bootstrap, in_topic, records[:2000])
        # SIGKILL as soon as the first windows are out, while later ones are in flight
        while high_watermarks(broker.bootstrap, out_topic) < 1:
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no output in 60 s"
            time.sleep(0.02)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        published_before_kill = high_watermarks(broker.bootstrap, out_topic)
        assert published_before_kill < len(sent), "the kill came too late to test anything"
        sent += produce(broker.bootstrap, in_topic, records[2000:])  # more arrive meanwhile

        worker = start_worker(broker.bootstrap, unique_name, policy, state, log)
        out: list[Any] = []
        while True:
            out = consume_all(broker.bootstrap, out_topic, timeout=5)
            dlq = consume_all(broker.bootstrap, f"{in_topic}.dlq", timeout=5)
            ids = {m.headers["record_id"] for m in out}
            if len(ids) + len(dlq) >= len(sent):
                break
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline + 120, f"{len(ids)} + {len(dlq)} of {len(sent)}"
            time.sleep(0.5)
        worker.send_signal(signal.SIGTERM)  # graceful: flush, commit, exit 0
        assert worker.wait(40) == 0, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)

    # 0 lost: every input offset is published or dead-lettered
    source = {f"{in_topic}/{s.partition}/{s.offset}".encode(): s for s in sent}
    first: dict[bytes, bytes] = {}
    duplicates = 0
    for m in out:
        rid = m.headers["record_id"]
        if rid in first:
            duplicates += 1
            assert m.value == first[rid], "a replayed record differs from its first copy"
        else:
            first[rid] = m.value or b""
    assert len(dlq) == 1 and dlq[0].headers["reason"] == b"unknown_category"
    dlq_id = (
        f"{in_topic}/{dlq[0].headers['source_partition'].decode()}/"
        f"{dlq[0].headers['source_offset'].decode()}"
    ).encode()
    assert set(first) | {dlq_id} == set(source)

    # identical republication for unchanged true values
    checked = assert_consistent_republication(first, source, rr=RR, qis=QIS)
    assert checked > 2000
    print(
        f"crash replay: {len(sent)} in, {len(first)} published + {len(dlq)} DLQ, "
        f"{published_before_kill} out before the kill, {duplicates} duplicates (identical)"
    )

    # the leakage check: no canary in the state files or the worker's log (DEBUG level)
    blobs = [p.read_bytes() for p in state.rglob("*") if p.is_file()]
    blobs.append(log.read_bytes())
    assert len(blobs) >= 2
    for canary in [*canaries, "CANARY-VALUE-e41a", "CANARY"]:
        assert not any(canary.encode() in blob for blob in blobs), canary
    # ...nor in the protected output
    assert not any(b"CANARY" in v for v in first.values())
