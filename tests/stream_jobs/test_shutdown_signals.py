"""How `privgw run` ends on a signal (issue 45, item 9), as a real process: SIGTERM exits 0
and Ctrl-C (SIGINT) 130, as docs/operating.md's exit-code table says, both after a clean stop
(every record accounted for), and neither leaves "Task was destroyed" in the log."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from streamkit import consume_all, high_watermarks, produce, small_window_policy, start_worker

from stream_jobs.commands.broker import EmbeddedBroker
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

pytestmark = pytest.mark.broker


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_a_signal_stops_the_worker_cleanly_with_its_documented_exit_code(  # noqa: PLR0917
    broker: EmbeddedBroker,
    unique_name: str,
    secret_env: str,
    tmp_path: Path,
    sig: signal.Signals,
    code: int,
) -> None:
    policy = small_window_policy(tmp_path, 100)
    log = tmp_path / "worker.log"
    worker = start_worker(broker.bootstrap, unique_name, policy, tmp_path / "state", log)
    try:
        assert consume_all(broker.bootstrap, f"{unique_name}.out.meta", expected=1, timeout=60)
        panel = PanelSurvey(respondents=300, waves=1, seed=3, rows=load_rows()).records()
        produce(broker.bootstrap, f"{unique_name}.in", [encode(r) for r in panel])
        deadline = time.monotonic() + 60
        while high_watermarks(broker.bootstrap, f"{unique_name}.out") < 1:  # a wave is out
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "nothing published in 60 s"
            time.sleep(0.2)
        worker.send_signal(sig)
        assert worker.wait(40) == code, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    text = log.read_text()
    assert "Task was destroyed" not in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
