"""Two and three `privgw run` processes share six partitions; 200,000 records over 10 waves;
one worker is killed mid-run and restarted.

Static assignment (``--worker-index i --workers n``: worker i takes the partitions p with
p mod n = i), not group mode: on the development broker two group members were seen holding
the same partitions during a rebalance (DESIGN §8), which would make this test about the broker.
The input is keyed by respondent id, so a respondent's records always reach the same partition
and so the same worker, whose own state store holds that respondent.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from streamkit import (
    assert_consistent_republication,
    consume_all,
    high_watermarks,
    k_claim,
    produce,
    published_qi_groups,
    small_window_policy,
    start_worker,
)

from gateway.policy import load_policy
from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
QIS = k_claim()  # the whole quasi-identifier tuple the k claim covers
RR = ("occupation", "income")


@pytest.mark.parametrize("workers", [2, 3])
def test_static_workers_share_partitions_survive_a_kill_and_stay_consistent(
    workers: int, broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    policy_path = small_window_policy(tmp_path, 2000)
    k = load_policy(policy_path).microaggregation.k
    name = unique_name
    in_topic, out_topic = f"{name}.in", f"{name}.out"
    # the size: 200,000 records over 10 waves
    panel = PanelSurvey(respondents=20_000, waves=10, seed=3, rows=load_rows()).records()
    records = [encode(r) for r in panel][:200_000]
    assert len(records) == 200_000

    def launch(i: int) -> Any:
        return start_worker(
            broker.bootstrap,
            name,
            policy_path,
            tmp_path / f"state-{i}",
            tmp_path / f"worker-{i}.log",
            "--partitions",
            "6",
            "--worker-index",
            str(i),
            "--workers",
            str(workers),
        )

    procs = [launch(i) for i in range(workers)]
    try:
        assert consume_all(broker.bootstrap, f"{out_topic}.meta", expected=1, timeout=60)
        half = len(records) // 2
        sent = produce(broker.bootstrap, in_topic, records[:half])
        deadline = time.monotonic() + 90
        while high_watermarks(broker.bootstrap, out_topic) < 1:
            assert time.monotonic() < deadline, "no output"
            time.sleep(0.05)
        procs[0].send_signal(signal.SIGKILL)  # worker 0 dies mid-stream...
        procs[0].wait(10)
        sent += produce(broker.bootstrap, in_topic, records[half:])
        procs[0] = launch(0)  # ...and comes back on the same partitions and state
        while True:
            out = consume_all(broker.bootstrap, out_topic, timeout=5)
            ids = {m.headers["record_id"] for m in out}
            if len(ids) >= len(sent):
                break
            for i, p in enumerate(procs):
                assert p.poll() is None, (tmp_path / f"worker-{i}.log").read_text()[-2000:]
            assert time.monotonic() < deadline + 300, f"{len(ids)} of {len(sent)}"
            time.sleep(2.0)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(40) for p in procs]
    assert codes == [0] * workers

    source = {f"{in_topic}/{s.partition}/{s.offset}".encode(): s for s in sent}
    first: dict[bytes, bytes] = {}
    for m in out:
        rid = m.headers["record_id"]
        assert first.setdefault(rid, m.value or b"") == m.value, "a duplicate differs"
    assert set(first) == set(source), "records lost"  # every input published once at least
    checked = assert_consistent_republication(first, source, rr=RR, qis=QIS)
    assert checked > 300_000
    # every centroid is shared by >= k respondents, over all workers and the whole history
    rows = [orjson.loads(v) for v in first.values()]
    owners = [orjson.loads(source[r].value or b"")["respondent_id"] for r in first]
    groups = published_qi_groups(rows, owners, QIS)
    assert groups and min(len(m) for m in groups.values()) >= k
    # each respondent was handled by exactly one worker: all its records on one partition
    partitions: dict[str, set[int]] = {}
    for rid in first:
        truth = orjson.loads(source[rid].value or b"")
        partitions.setdefault(truth["respondent_id"], set()).add(source[rid].partition)
    assert all(len(p) == 1 for p in partitions.values())
    print(
        f"scale-out {workers} workers: {len(sent)} in, {len(first)} out, "
        f"{len(out) - len(first)} duplicates (identical), 1 restart"
    )
    logs = [(tmp_path / f"worker-{i}.log").read_text() for i in range(workers)]
    assert all("assigned" in text for text in logs)
