"""`privgw demo`, the README's main job, as a user runs it (a real subprocess, its own broker)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_to_completion_and_leaves_the_jsonl_it_names(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVGW_")}
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
    done = re.search(r"(\d+) in, (\d+) published .* (\d+) dead-lettered", proc.stdout)
    named = re.search(r"protected records: (\S+\.jsonl) \((\d+) lines\)", proc.stdout)
    assert done and named, proc.stdout[-2000:]
    consumed, published, dead = (int(g) for g in done.groups())
    assert consumed == 3000 and consumed == published + dead
    lines = Path(named.group(1)).read_bytes().splitlines()
    assert len(lines) == published == int(named.group(2))
    rows = [orjson.loads(line) for line in lines]
    assert all("respondent_id" not in r and r["policy_version"] for r in rows)
    assert (tmp_path / "secret.key").stat().st_mode & 0o077 == 0  # the secret is private
