"""Fixtures shared across the suite: the real development broker and a deployment secret."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_jobs.commands.broker import EmbeddedBroker

TEST_SECRET = "privgw-test-secret-not-for-production-0123456789"


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """One memory-only Tansu broker on a free loopback port for the whole session.

    Tests isolate themselves by topic and group names (``unique_name``), not by brokers:
    starting one takes ~15 ms, but every client's first metadata round trip costs more.
    """
    with EmbeddedBroker(log_dir=tmp_path_factory.mktemp("broker")) as b:
        yield b


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A topic / group prefix unique to the test (the broker is shared)."""
    raw = request.node.name
    # a random suffix: the name is cut to 60 characters (a parametrized case's id can fall
    # beyond) and ``id(request)`` repeats once the previous request is freed, so two cases
    # shared topics and a consumer group
    kept = "".join(c if c.isascii() and c.isalnum() else "-" for c in raw)  # Kafka's characters
    return f"t-{kept[:60]}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """PRIVGW_SECRET set for the test (and for subprocesses that inherit the environment)."""
    monkeypatch.setenv("PRIVGW_SECRET", TEST_SECRET)
    monkeypatch.delenv("PRIVGW_SECRET_FILE", raising=False)
    return TEST_SECRET


class Tmpfs:
    """Mount a small tmpfs of its own (state-directory failures: a full or read-only file
    system, for real). Needs mount rights (root, as CI runs); the test is skipped otherwise."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._mounted: list[Path] = []

    def mount(self, name: str, *, size_kib: int = 1024, read_only: bool = False) -> Path:
        if shutil.which("mount") is None or os.geteuid() != 0:
            pytest.skip("needs mount rights (root) for a file system of its own")
        path = self._root / name
        path.mkdir()
        options = f"size={size_kib}k,mode=0755" + (",ro" if read_only else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        self._mounted.append(path)
        return path

    def fill(self, path: Path) -> Path:
        """Fill the file system of ``path`` (a file ``filler`` takes what is left)."""
        filler = path / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (1 << 16, 1 << 12, 1):  # big steps, then what is left
                with contextlib.suppress(OSError):
                    while os.write(fd, b"\0" * chunk):
                        pass
        finally:
            os.close(fd)
        return filler

    def unmount_all(self) -> None:
        for path in reversed(self._mounted):
            subprocess.run(["umount", "-l", str(path)], check=False)
        self._mounted.clear()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Tmpfs]:
    fs = Tmpfs(tmp_path)
    try:
        yield fs
    finally:
        fs.unmount_all()
