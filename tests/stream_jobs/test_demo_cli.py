"""`privgw demo`, the README's main job, as a user runs it (a real subprocess, its own broker)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


def demo_env() -> dict[str, str]:
    """The user's environment after scripts/demo: no PRIVGW_ variable, .venv/bin not on PATH."""
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVGW_")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    return env


def test_demo_runs_to_completion_and_leaves_the_jsonl_it_names(tmp_path: Path) -> None:
    env = demo_env()
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "demo", "--records", "3000", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "created a new secret" in proc.stdout  # no secret configured: the demo makes one
    assert " INFO " not in proc.stdout + proc.stderr  # the console is the summary
    assert " WARNING " not in proc.stdout + proc.stderr  # nothing to worry a newcomer
    done = re.search(r"(\d+) in, (\d+) published .* (\d+) dead-lettered", proc.stdout)
    named = re.search(r"protected records: (\S+\.jsonl) \((\d+) lines\)", proc.stdout)
    assert done and named, proc.stdout[-2000:]
    consumed, published, dead = (int(g) for g in done.groups())
    assert consumed == 3000 and consumed == published + dead
    lines = Path(named.group(1)).read_bytes().splitlines()
    # a panel publishes every member in every wave: those absent from one too
    more = re.search(r"; (\d+) more for panel members absent from a wave", proc.stdout)
    imputed = int(more.group(1)) if more else 0
    assert len(lines) == published + imputed == int(named.group(2))
    rows = [orjson.loads(line) for line in lines]
    assert all("respondent_id" not in r and r["policy_version"] for r in rows)
    assert (tmp_path / "secret.key").stat().st_mode & 0o077 == 0  # the secret is private

    # the printed next step works as printed, from the same directory, without .venv on PATH
    step = re.search(r"estimate distributions: (.+)", proc.stdout)
    assert step, proc.stdout[-2000:]
    assert step.group(1).startswith(".venv/bin/privgw reconstruct ") or shutil.which("privgw")
    again = subprocess.run(
        step.group(1), shell=True, capture_output=True, text=True, cwd=ROOT, env=env, check=False
    )
    assert again.returncode == 0, again.stdout[-1000:] + again.stderr[-1000:]
    assert "(n = " in again.stdout
    assert re.search(r"metrics: http://127\.0\.0\.1:\d+/metrics", proc.stdout)


def test_ctrl_c_says_what_was_left_and_exits_130(tmp_path: Path) -> None:
    """SIGINT in the middle of the demo: it stops cleanly, says it was interrupted and what
    is left, exits 130; meanwhile its /metrics answered."""
    # waves of 10,000: the first closes (and is published) within seconds
    demo = ["demo", "--records", "200000", "--rate", "2000", "--waves", "20"]
    demo += ["--data-dir", str(tmp_path)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", *demo],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=demo_env(),
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            # some records out: the Adult policy publishes a wave when it closes, or once its
            # first records have waited window.max_hold_seconds
            if re.match(r"\[\s*\d+\.\ds\] sent\s+[1-9].*\bout\s+[1-9]", line):
                break
        url = next(re.search(r"(http://\S+/metrics)", x) for x in lines if "metrics: " in x)
        assert url is not None, lines
        with urllib.request.urlopen(url.group(1), timeout=10) as resp:
            assert resp.status == 200 and b"privgw_records_consumed_total" in resp.read()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines) + rest
    assert proc.returncode == 130, out[-2000:]
    said = re.search(
        r"interrupted \(SIGINT\) after .*: (\d+) of 200000 records processed .* left "
        r"unprocessed: (\d+) not sent, (\d+) sent but not read, (\d+) held",
        out,
    )
    assert said, out[-2000:]
    processed, unsent = int(said.group(1)), int(said.group(2))
    assert 0 < processed < 200000 and unsent > 0
    assert "Traceback" not in out
