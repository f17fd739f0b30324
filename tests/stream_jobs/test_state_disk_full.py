"""The state's disk fills up under a running worker (issue 30, item 3): `privgw run` (engine in
its own process, the default) on a tmpfs of its own; once wave 1 is out the file system is
filled and new respondents arrive. The worker stops with exit 1 and one fatal line naming the
state file and the condition (not "EngineProcessError" alone); with room again, a restart on
the same state publishes every record — nothing was lost.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from conftest import Tmpfs
from streamkit import consume_all, produce, small_window_policy, start_worker

from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

pytestmark = [pytest.mark.broker]


def test_a_full_state_disk_stops_the_worker_with_one_named_line_and_loses_nothing(
    broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path, tmpfs: Tmpfs
) -> None:
    state = tmpfs.mount("state", size_kib=4096)
    policy = small_window_policy(tmp_path, 500)
    in_topic, out_topic = f"{unique_name}.in", f"{unique_name}.out"
    records = [encode(r) for r in PanelSurvey(respondents=600, waves=1, seed=8, rows=load_rows())
               .records()]  # fmt: skip
    log = tmp_path / "worker.log"
    worker = start_worker(broker.bootstrap, unique_name, policy, state, log)
    try:
        first = produce(broker.bootstrap, in_topic, records[:300])
        assert len(consume_all(broker.bootstrap, out_topic, expected=300, timeout=60)) == 300
        filler = tmpfs.fill(state)
        second = produce(broker.bootstrap, in_topic, records[300:])  # new respondents: writes
        code = worker.wait(60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    text = log.read_text()
    assert code == 1, text[-3000:]
    fatal = [line for line in text.splitlines() if " ERROR " in line and "worker failed" in line]
    assert len(fatal) == 1, text[-3000:]
    assert str(state / "state.db") in fatal[0] and "disk full" in fatal[0], fatal[0]
    assert "SQLITE_FULL" in fatal[0] and "withheld" not in text

    filler.unlink()  # room again: the same state, the records not committed are read again
    restarted = start_worker(broker.bootstrap, unique_name, policy, state, log)
    try:
        wanted = {f"{in_topic}/{s.partition}/{s.offset}".encode() for s in first + second}
        deadline = time.monotonic() + 90
        seen: set[bytes] = set()
        while not wanted <= seen and time.monotonic() < deadline:
            assert restarted.poll() is None, log.read_text()[-3000:]
            seen = {m.headers["record_id"] for m in consume_all(broker.bootstrap, out_topic)}
        assert wanted <= seen, f"{len(wanted - seen)} records lost"
    finally:
        restarted.terminate()
        assert restarted.wait(30) == 0
    print(re.sub(r"^\S+ \S+ ", "", fatal[0]))
