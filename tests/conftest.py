"""Fixtures shared across the suite: the real development broker and a deployment secret."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stream_jobs.broker import EmbeddedBroker

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
    return "t-" + "".join(c if c.isalnum() else "-" for c in raw)[:60] + f"-{id(request) % 10**6}"


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """PRIVGW_SECRET set for the test (and for subprocesses that inherit the environment)."""
    monkeypatch.setenv("PRIVGW_SECRET", TEST_SECRET)
    monkeypatch.delenv("PRIVGW_SECRET_FILE", raising=False)
    return TEST_SECRET
