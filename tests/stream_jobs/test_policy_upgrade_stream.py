"""A policy upgrade as an operator runs it (issue 30, item 2): `privgw run` under the Adult
policy (k = 5), then under k = 6 on the same state — refused with one line (exit 2) —, then
with `--policy-upgrade VERSION`: the metadata topic announces the new version and where it
came from, `privgw_policy_upgrades_total{action="regroup"}` counts it (also after another
restart), and every class of the whole k-claim tuple published afterwards has >= 6
respondents.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import orjson
import pytest
from streamkit import consume_all, k_claim, produce, small_window_policy, start_worker

from gateway.policy import load_policy
from stream_jobs.commands.broker import EmbeddedBroker, free_port
from stream_jobs.commands.simulator import PanelSurvey, encode, load_rows

pytestmark = [pytest.mark.broker]


def _metric(port: int, line_start: str, worker: object, log: Path) -> float:
    deadline = time.monotonic() + 60
    while True:
        assert worker.poll() is None, log.read_text()[-3000:]  # type: ignore[attr-defined]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith(line_start):
                        return float(line.rsplit(" ", 1)[1])
        except urllib.error.URLError:
            pass
        assert time.monotonic() < deadline, f"{line_start} never exported"
        time.sleep(0.3)


def _privgw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


# (backend flags, how the upgrade is accepted): the partitioned backend's state is in its
# changelog, and each partition is migrated as it is restored (issue 45, item 4)
CASES = {
    "sqlite-flag": ((), "flag"),
    "partitioned-flag": (("--state-backend", "partitioned"), "flag"),
    "partitioned-migrate": (("--state-backend", "partitioned"), "migrate"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_raised_k_is_refused_then_migrated_announced_and_kept(
    case: str, broker: EmbeddedBroker, unique_name: str, secret_env: str, tmp_path: Path
) -> None:
    backend, how = CASES[case]
    base = small_window_policy(tmp_path, 500)
    raised = tmp_path / "k6.yaml"
    assert "  k: 5\n" in base.read_text()
    raised.write_text(base.read_text().replace("  k: 5\n", "  k: 6\n"))
    old, new = load_policy(base).version, load_policy(raised).version
    in_topic, out_topic = f"{unique_name}.in", f"{unique_name}.out"
    state = tmp_path / "state"
    survey = PanelSurvey(respondents=400, waves=2, seed=4, rows=load_rows())
    records = list(survey.records())
    waves = [[r for r in records if r["wave"] == w] for w in (1, 2)]

    log = tmp_path / "w1.log"
    w = start_worker(broker.bootstrap, unique_name, base, state, log, *backend)
    produce(broker.bootstrap, in_topic, [encode(r) for r in waves[0]])
    assert len(consume_all(broker.bootstrap, out_topic, expected=len(waves[0]), timeout=60)) == (
        len(waves[0])
    )
    w.send_signal(signal.SIGTERM)
    assert w.wait(30) == 0

    log = tmp_path / "w2.log"
    w = start_worker(broker.bootstrap, unique_name, raised, state, log, *backend)
    assert w.wait(60) == 2, log.read_text()[-3000:]
    errors = [x for x in log.read_text().splitlines() if x.startswith("privgw: error:")]
    assert len(errors) == 1 and "k 5 -> 6 (needs re-grouping)" in errors[0], errors
    assert f"--policy-upgrade {new}" in errors[0]

    # the commands the refusal names find the backend in the state directory itself
    before = sorted(p.name for p in state.iterdir())
    diffed = _privgw("policy", "diff", "--state-dir", str(state), "--policy", str(raised))
    assert diffed.returncode == 1, diffed.stderr
    assert "regroup      k 5 -> 6" in diffed.stdout and f"--policy-upgrade {new}" in diffed.stdout
    upgrade: tuple[str, ...] = ("--policy-upgrade", new)
    if how == "migrate":
        migrated = _privgw("state", "migrate", "--state-dir", str(state), "--policy", str(raised))
        assert migrated.returncode == 0, migrated.stderr
        assert f"policy {old} -> {new}" in migrated.stdout
        upgrade = ()
    assert sorted(p.name for p in state.iterdir()) == before  # no stray state.db

    port = free_port()
    log = tmp_path / "w3.log"
    w = start_worker(broker.bootstrap, unique_name, raised, state, log, *backend,
                     *upgrade, "--metrics-port", str(port))  # fmt: skip
    try:
        assert _metric(port, 'privgw_policy_upgrades_total{action="regroup"}', w, log) == 1
        sent = produce(broker.bootstrap, in_topic, [encode(r) for r in waves[1]])
        total = len(waves[0]) + len(waves[1])
        out = consume_all(broker.bootstrap, out_topic, expected=total, timeout=60)
        assert len({m.headers["record_id"] for m in out}) == total
    finally:
        w.send_signal(signal.SIGTERM)
        assert w.wait(30) == 0
    text = log.read_text()
    assert how == "migrate" or "policy upgraded on the state" in text
    assert not backend or "policy upgrade applied to partitions" in text, text[-3000:]

    metas = [orjson.loads(m.value) for m in consume_all(broker.bootstrap, f"{out_topic}.meta")]
    announced = [m for m in metas if m.get("policy_version") == new]  # not the key records
    assert announced and announced[-1]["k"] == 6
    history = announced[-1]["policy_upgrades"]
    assert history[-1]["from"] == old and history[-1]["to"] == new
    assert history[-1]["actions"] == ["regroup"]

    # every class of the whole key published after the upgrade: >= 6 respondents
    owner = {
        f"{in_topic}/{s.partition}/{s.offset}".encode(): r["respondent_id"]
        for s, r in zip(sent, waves[1], strict=True)
    }
    claim = k_claim(raised)
    classes: dict[tuple, set[str]] = defaultdict(set)
    for m in out:
        rid = m.headers["record_id"]
        if rid in owner:
            row = orjson.loads(m.value)
            key = tuple(row[a] for a in claim)
            if any(v is not None for v in key):
                classes[key].add(owner[rid])
    assert classes and min(map(len, classes.values())) >= 6

    # the count is the state's: another start without the flag runs and still shows it
    port = free_port()
    log = tmp_path / "w4.log"
    w = start_worker(broker.bootstrap, unique_name, raised, state, log, *backend,
                     "--metrics-port", str(port))  # fmt: skip
    try:
        assert _metric(port, 'privgw_policy_upgrades_total{action="regroup"}', w, log) == 1
    finally:
        w.send_signal(signal.SIGTERM)
        assert w.wait(30) == 0
