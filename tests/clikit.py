"""``privgw ARGS`` in a fresh process, as a user runs it: the one helper of the CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def privgw(
    *args: str | Path,
    check: bool = False,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
    umask: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m gateway ARGS`` from the repository's root. ``check``: raise with its
    output unless it exits 0; ``env``: added to this environment; ``umask``: the child's."""
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=None if env is None else {**os.environ, **env},
        timeout=timeout,
        check=False,
        preexec_fn=None if umask is None else (lambda: os.umask(umask)),
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc
