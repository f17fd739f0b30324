"""scripts/test installs its system packages with scripts/apt-get-waiting (issue 45, item 9):
with another process holding the apt lock (unattended upgrades on a fresh Debian machine) it
aborted at once. The real apt-get runs here on a private root whose lists lock this test holds.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WAITING = ROOT / "scripts" / "apt-get-waiting"

pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None, reason="no apt-get here")


def _private_apt(tmp: Path) -> list[str]:
    """apt-get options for a root of its own: no sources, so `update` reads nothing."""
    for d in ("lists/partial", "cache/archives/partial", "parts", "state"):
        (tmp / d).mkdir(parents=True)
    (tmp / "status").touch()
    dirs = {
        "Dir::State::Lists": tmp / "lists",
        "Dir::Cache": tmp / "cache",
        "Dir::State": tmp / "state",
        "Dir::State::status": tmp / "status",
        "Dir::Etc::SourceList": "/dev/null",
        "Dir::Etc::SourceParts": tmp / "parts",
    }
    return [arg for k, v in dirs.items() for arg in ("-o", f"{k}={v}")]


def _hold_lock(path: Path, seconds: float) -> threading.Thread:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as apt takes it: another apt-get fails
    release = threading.Thread(target=lambda: (time.sleep(seconds), os.close(fd)))
    release.start()
    return release


def _apt_get(opts: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True, check=False)


def _run(opts: list[str], timeout: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "APT_LOCK_TIMEOUT": timeout, "APT_LOCK_POLL": "0.5"}
    start = time.monotonic()
    proc = subprocess.run(
        [str(WAITING), *opts, "update"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    return proc, time.monotonic() - start


def test_apt_get_waits_for_a_lock_another_process_holds(tmp_path: Path) -> None:
    opts = _private_apt(tmp_path)
    plain = _apt_get(opts)
    assert plain.returncode == 0, plain.stderr  # the private root works
    holder = _hold_lock(tmp_path / "lists" / "lock", 3.0)
    bare = _apt_get(opts)
    assert bare.returncode != 0 and "Could not get lock" in bare.stderr  # what scripts/test met
    proc, took = _run(opts, "60")
    holder.join()
    assert proc.returncode == 0, proc.stderr
    assert 2.0 <= took < 30, took
    assert "another process holds the apt lock; waiting up to 60 s" in proc.stderr


def test_apt_get_gives_up_after_its_timeout_naming_it(tmp_path: Path) -> None:
    opts = _private_apt(tmp_path)
    holder = _hold_lock(tmp_path / "lists" / "lock", 6.0)
    proc, took = _run(opts, "2")
    holder.join()
    assert proc.returncode == 1 and took < 6, (proc.returncode, took)
    assert "Could not get lock" in proc.stderr
    assert "still locked after 2 s (APT_LOCK_TIMEOUT)" in proc.stderr
